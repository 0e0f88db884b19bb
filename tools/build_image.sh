#!/usr/bin/env bash
# Builds the Dockerfile without a registry or a daemon, as CI does (.ci/run):
#   1. a base image of Debian 12 with Debian's Python 3.11, made from Debian's packages by
#      mmdebstrap and committed by `buildah from scratch` (no registry is reachable from CI);
#      cached in the build's own container store, keyed by a hash of its recipe and the ISO
#      week (so Debian's security updates arrive within a week);
#   2. the Dockerfile on that base: buildah bud --build-arg BASE=<base>, vfs storage, chroot
#      isolation (root, no daemon, no user namespaces needed).
# Prints how long each step took and the image's size. tests/integration/test_container_image.py runs
# the image (TRAINFEED_IMAGE=IMAGE CONTAINERS_STORAGE_CONF=CACHE/storage.conf).
#
#   tools/build_image.sh [IMAGE]          (default localhost/trainfeed:ci)
#
# Environment: TRAINFEED_CI_CACHE (default /var/cache/trainfeed-ci) holds the container store
# and its storage.conf; DEBIAN_MIRROR (default http://deb.debian.org/debian). PIP_CERT, or pip's
# configured `cert`, is the CA bundle of a TLS-intercepting proxy: it is mounted into the
# build's RUN steps only, never into the image. Needs root, buildah and mmdebstrap (Debian 12:
# apt-get install buildah mmdebstrap). Run from any folder.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${1:-localhost/trainfeed:ci}
cache=${TRAINFEED_CI_CACHE:-/var/cache/trainfeed-ci}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

say() { printf -- '--- build_image: %s\n' "$*"; }
die() { printf -- '--- build_image: %s\n' "$*" >&2; exit 1; }
((EUID == 0)) || die "must run as root (buildah's chroot isolation and mmdebstrap's root mode)"
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "no $tool on PATH: apt-get install buildah mmdebstrap"
done

# --- the container store: the build's own, under the cache, never the machine's default --------
mkdir -p "$cache/containers"
cat >"$cache/storage.conf" <<EOF
# Written by tools/build_image.sh: the container store of trainfeed's image builds.
[storage]
driver = "vfs"
graphroot = "$cache/containers/storage"
runroot = "$cache/containers/run"
EOF
export CONTAINERS_STORAGE_CONF="$cache/storage.conf" BUILDAH_ISOLATION=chroot

# One build at a time per cache (two CI runs on one machine would share the store).
exec 9>"$cache/lock"
if ! flock -n 9; then
  say "waiting up to 30 min for another build holding $cache/lock (since $(date -u +%T) UTC)"
  flock -w 1800 9 || die "$cache/lock still held after 30 min; is a build hung? (fuser $cache/lock)"
fi

# Containers a killed run of tests/integration/test_container_image.py left behind hold their image.
mapfile -t stale < <(buildah containers --noheading --format '{{.ContainerName}}' |
                     grep '^trainfeed-image-test-' || true)
((${#stale[@]} == 0)) || { say "removing stale test containers: ${stale[*]}"; buildah rm "${stale[@]}" >/dev/null; }

# --- 1. the base --------------------------------------------------------------------------------
# python3-venv: the Dockerfile installs into venvs (Debian's python3 refuses system-wide pip
# installs, PEP 668). ca-certificates: pip's HTTPS. Docs, man pages and translations are left
# out (about 30 MB); copyright files stay.
packages=python3,python3-venv,ca-certificates
mmdebstrap_args=(--variant=minbase "--include=$packages"
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/info/*')
sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main"
         "deb $security_mirror bookworm-security main")
key=$(printf '%s\n' "${mmdebstrap_args[@]}" "${sources[@]}" "$(date -u +%G-W%V)" |
      sha256sum | cut -c1-16)
base=localhost/trainfeed-ci-base:$key

started=$SECONDS
if buildah inspect --type image "$base" >/dev/null 2>&1; then
  say "base $base: cached (recipe and week unchanged)"
else
  say "base $base: mmdebstrap bookworm ($packages) from $mirror"
  tarball="$cache/base-$key.tar"
  rm -f "$tarball"
  mmdebstrap "${mmdebstrap_args[@]}" bookworm "$tarball" "${sources[@]}"
  container=$(buildah from scratch)
  buildah add --quiet "$container" "$tarball" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/sh \
    --label org.opencontainers.image.description="Debian 12 with python3 ($packages), by tools/build_image.sh" \
    "$container"
  buildah commit --quiet --rm "$container" "$base" >/dev/null
  rm -f "$tarball"
  # Earlier bases (another week or recipe) are of no more use.
  mapfile -t old < <(buildah images --noheading --format '{{.Name}}:{{.Tag}}' |
                     grep '^localhost/trainfeed-ci-base:' | grep -vxF "$base" || true)
  ((${#old[@]} == 0)) || buildah rmi "${old[@]}" >/dev/null || say "could not remove ${old[*]}"
fi
base_s=$((SECONDS - started))

# --- 2. the Dockerfile --------------------------------------------------------------------------
build_args=(--build-arg "BASE=$base")
ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
if [[ -n "$ca" ]]; then
  [[ -r "$ca" ]] || die "pip's CA bundle $ca (PIP_CERT or pip config's cert) is not readable"
  # Over the base's own bundle: a path that exists, so no mount point is left in the image.
  build_args+=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro"
               --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
fi
say "buildah bud -t $image (BASE=$base)"
started=$SECONDS
buildah --storage-driver vfs bud --isolation chroot "${build_args[@]}" --tag "$image" .
build_s=$((SECONDS - started))
# The image this tag named before, now untagged.
buildah rmi --prune >/dev/null 2>&1 || true

size=$(buildah images --noheading --format '{{.Size}}' "$image")
say "$image: $size (uncompressed); base ${base_s} s, build ${build_s} s"
