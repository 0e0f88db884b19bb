# syntax=docker/dockerfile:1
# The trainfeed image: the `trainfeed` CLI as entrypoint (master, upload, submit, …), and, with
# a framework extra, the base of GPU worker images. Extras are chosen at build time:
#
#   docker build -t trainfeed:0.1.0 .                                        # master, tools
#   docker build -t trainfeed-torch:0.1.0 --build-arg EXTRAS=s3,torch .     # PyTorch workers
#   docker build -t trainfeed-tf:0.1.0 --build-arg EXTRAS=s3,tf \
#       --build-arg EXTRA_PACKAGES='tensorflow[and-cuda]' .                  # TensorFlow workers
#
# BASE is any Debian 12 (bookworm) image with Python 3.11 and its venv module: python.org's
# build in python:3.11-slim-bookworm by default, or Debian's own python3 and python3-venv in a
# base made without a registry (tools/build_image.sh, which is how CI builds this file).
#
# Fetched: Python packages through pip, and from the base image's own Debian archive only what
# the JPEG region decoder needs (a compiler and libjpeg-turbo's headers to build it, the library
# to run it). No curl, no other sources. See docs/cluster.md.
ARG BASE=python:3.11-slim-bookworm

# --- builder: the trainfeed wheel alone (its dependencies install from PyPI below) ---------------
FROM ${BASE} AS builder
# PIP_CERT: the CA bundle of a TLS-intercepting proxy, for the build only (an ARG, not in the
# image's environment; tools/build_image.sh mounts the host's bundle there). Unset: pip's own.
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The region decoder (trainfeed/decode/_jpeg_region.c) is compiled against libjpeg-turbo and
# Python's headers: python.org's build carries them, Debian's python3 has them in libpython3-dev.
# Versions are whatever the base image's Debian release carries (security updates included).
# hadolint ignore=DL3008,SC2086
RUN set -eu; \
    packages="gcc libc6-dev libjpeg62-turbo-dev"; \
    include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"; \
    [ -e "$include/Python.h" ] || packages="$packages libpython3-dev"; \
    apt-get update; \
    apt-get install -y --no-install-recommends $packages; \
    rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY trainfeed ./trainfeed
# A venv, not the system's pip: Debian's python3 refuses system-wide installs (PEP 668).
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-deps --wheel-dir /wheels .

# --- runtime ----------------------------------------------------------------------------------
FROM ${BASE}
# Comma-separated extras of pyproject.toml: s3, etcd, sql (the master's stores and sources), tf,
# torch (framework adapters), …; EXTRA_PACKAGES: more pip requirements, e.g. a CUDA build.
ARG EXTRAS=s3,etcd,sql
ARG EXTRA_PACKAGES=""
ARG PIP_CERT
# trainfeed lives in a venv at /opt/trainfeed, first on PATH: `trainfeed`, `python` and `pip`
# are its own on either base.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/trainfeed \
    PATH=/opt/trainfeed/bin:$PATH
LABEL org.opencontainers.image.title="trainfeed" \
      org.opencontainers.image.description="Elastic master/worker data service for deep-learning training" \
      org.opencontainers.image.licenses="Apache-2.0"

# The uid/gid the Kubernetes manifests run as (runAsUser: 10001).
RUN groupadd --system --gid 10001 trainfeed \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --create-home \
       --shell /usr/sbin/nologin trainfeed

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjpeg62-turbo \
    && rm -rf /var/lib/apt/lists/*

COPY --from=builder /wheels/ /tmp/wheels/
# Versions are the ranges of pyproject.toml, resolved at build time.
# hadolint ignore=DL3013,SC2086
RUN set -eu; \
    python3 -m venv "$VIRTUAL_ENV"; \
    wheel="$(ls /tmp/wheels/trainfeed-*.whl)"; \
    if [ -n "$EXTRAS" ]; then wheel="${wheel}[${EXTRAS}]"; fi; \
    pip install --no-cache-dir "$wheel" $EXTRA_PACKAGES; \
    rm -rf /tmp/wheels; \
    trainfeed --version; \
    python -c 'from trainfeed.decode import _jpeg_region'  # the region decoder was built

USER 10001:10001
WORKDIR /app
# gRPC API and health (50051), Prometheus metrics (9090).
EXPOSE 50051 9090
ENTRYPOINT ["trainfeed"]
CMD ["--help"]
