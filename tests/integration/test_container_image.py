"""The built image, run: its `trainfeed doctor`, no compiler in it, its size, and a master inside
it serving a full epoch to readers outside it.

The image is the one tools/build_image.sh builds from the Dockerfile (.ci/run does, then sets
TRAINFEED_IMAGE to its name and CONTAINERS_STORAGE_CONF to the build's container store). It runs
with buildah (chroot isolation, the host's network) as the manifests' non-root uid, with a local
storage folder bind-mounted at the same path as on the host, as every pod mounts the shared
volume at one path. Without TRAINFEED_IMAGE the module is skipped, except under CI=true, where
it fails: CI builds the image, and a run that forgot to would otherwise pass without it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sample_data import file_digests, make_image_list
from test_multiprocess import start_together

from trainfeed.cluster.spec import RUN_AS_USER

# One xdist worker runs them all: one working container (a full copy of the image in vfs).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("image")]
IMAGE_ENV = "TRAINFEED_IMAGE"
N = 240  # records: 30 partitions of 8, several for each of the two readers
TIMEOUT_S = 120
# The default image (EXTRAS=s3,etcd,sql) measured 803 MB uncompressed on 2026-11-26
# (docs/cluster.md); a bound, so that a compiler or a framework creeping in fails here.
MAX_IMAGE_BYTES = 1_000_000_000
_LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")
_SI = {"B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def image_name() -> str:
    """The image to test: $TRAINFEED_IMAGE; a skip without it, a failure under CI=true."""
    name = os.environ.get(IMAGE_ENV, "")
    if name:
        return name
    hint = (f"${IMAGE_ENV} is unset: build the image with tools/build_image.sh, then set "
            f"{IMAGE_ENV}=localhost/trainfeed:ci and "
            "CONTAINERS_STORAGE_CONF=<its cache>/storage.conf")
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true runs the image's tests, but {hint}", pytrace=False)
    pytest.skip(hint)


def buildah(*args: str, timeout_s: float = 300) -> str:
    """A buildah command's stdout; its stderr in the failure."""
    binary = shutil.which("buildah")
    assert binary, f"{IMAGE_ENV} is set but buildah is not installed (apt-get install buildah)"
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.returncode}\n{done.stderr}"
    return done.stdout


def run_in(container: str, *command: str, user: str | None = None,
           volumes: tuple[str, ...] = ()) -> list[str]:
    """`buildah run` arguments: chroot isolation (no runtime, no namespaces), host network."""
    options = ["--isolation", "chroot", "--network", "host"]
    options += ["--user", user] if user else []
    for volume in volumes:
        options += ["--volume", volume]
    return ["run", *options, container, "--", *command]


@pytest.fixture(scope="module")
def container() -> Iterator[str]:
    """A working container of the image, removed afterwards (tools/build_image.sh also removes
    any that a killed run left behind, by this name prefix)."""
    image = image_name()
    name = f"trainfeed-image-test-{uuid.uuid4().hex[:8]}"
    buildah("from", "--name", name, image)
    try:
        yield name
    finally:
        buildah("rm", name)


def test_doctor_shows_simplejpeg_and_the_region_decoder_built(container: str) -> None:
    out = buildah(*run_in(container, "trainfeed", "doctor"))
    print(out)
    assert re.search(r"^\s+simplejpeg\s+\d+\.\d+", out, re.M), out  # installed, with a version
    decoders = dict(re.findall(r"^\s+(jpeg(?: crops)?)\s+(.+)$", out, re.M))
    assert decoders.get("jpeg", "").startswith("simplejpeg "), out
    assert decoders.get("jpeg crops", "").startswith("trainfeed region decoder (libjpeg-turbo"), \
        out  # not "NOT BUILT": the builder stage compiled it and the runtime has libjpeg-turbo
    assert f"uid={RUN_AS_USER}" in buildah(*run_in(container, "id"))  # the image's USER


def test_the_runtime_stage_has_no_compiler(container: str) -> None:
    # `command -v` prints and succeeds for any name found: nothing, and status 1, is wanted.
    done = subprocess.run(["buildah", *run_in(container, "sh", "-c", "command -v gcc cc c99 "
                                              "x86_64-linux-gnu-gcc clang")],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "" and done.returncode != 0, (done.returncode, done.stdout)


def test_the_image_size_is_reported_and_bounded() -> None:
    image = image_name()
    [info] = json.loads(buildah("images", "--json", image))
    number, unit = str(info["size"]).split()
    size = float(number) * _SI[unit]
    print(f"image {image}: {info['size']} uncompressed")
    assert size < MAX_IMAGE_BYTES, (
        f"{image} is {info['size']}, over {MAX_IMAGE_BYTES / 1e9:g} GB: what grew? (if meant, "
        "update MAX_IMAGE_BYTES here and the size in docs/cluster.md)")


class ContainerMaster:
    """`trainfeed master` inside the container, as uid RUN_AS_USER on the host's network, its
    storage bind-mounted at the host's path. Stopped (TERM to the process group, then KILL)
    on exit, and its port checked closed: nothing of it may outlive the test."""

    def __init__(self, container: str, storage: Path, secrets: Path) -> None:
        command = run_in(
            container, "trainfeed", "master", "--host", "127.0.0.1", "--port", "0",
            "--storage", str(storage), "--state", "memory://", "--metrics-port", "none",
            "--token-file", "/run/trainfeed-test/token",
            user=f"{RUN_AS_USER}:{RUN_AS_USER}",
            volumes=(f"{storage}:{storage}", f"{secrets}:/run/trainfeed-test:ro"))
        self.proc = subprocess.Popen(["buildah", *command], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.log: list[str] = []
        self.port = 0
        self._ready = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            match = _LISTENING.search(line)
            if match and not self.port:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # exited: wait_ready reports it

    def wait_ready(self, timeout_s: float = 60) -> str:
        if not self._ready.wait(timeout_s) or not self.port:
            raise AssertionError(f"the master in the container did not listen within "
                                 f"{timeout_s:g} s (exit status {self.proc.poll()}):\n"
                                 + "".join(self.log))
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> ContainerMaster:
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        if self.port:
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", self.port)) != 0, \
                    f"the container's master still listens on {self.port} after it was stopped"


def uids_of_processes_running(*words: str) -> set[int]:
    """The real uids of this machine's processes whose command line holds all `words` (chroot
    isolation shares the host's process table, so the container's master is among them)."""
    uids = set()
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:  # not a process, or gone meanwhile
            continue
        uid = re.search(r"^Uid:\s+(\d+)", status, re.M)
        if uid and all(word.encode() in argv for word in words):
            uids.add(int(uid.group(1)))
    return uids


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_master_in_the_image_serves_host_readers_an_epoch_exactly_once(
        container: str, tmp_path: Path) -> None:
    storage, secrets = tmp_path / "storage", tmp_path / "secrets"
    storage.mkdir()
    secrets.mkdir()
    token = uuid.uuid4().hex
    (secrets / "token").write_text(token + "\n")
    # The non-root master reads what root's upload writes (umask 022) and the token file.
    os.chmod(secrets / "token", 0o644)
    source = make_image_list(tmp_path / "source", N)
    digests = file_digests(source)
    env = {**os.environ, "TRAINFEED_TOKEN": token, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": "",
           "TRAINFEED_STORAGE": ""}
    with ContainerMaster(container, storage, secrets) as master:
        env["TRAINFEED_MASTER"] = master.wait_ready()
        # The python process serving (buildah's own, root, has the same words) runs as the
        # manifests' non-root uid.
        uids = uids_of_processes_running("master", "--storage", str(storage))
        assert uids - {0} == {RUN_AS_USER}, f"the container's master runs as uids {uids}"
        # The upload runs on the host after the master started: the shared folder is live.
        subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "upload", str(source),
                        "--dataset", "flowers", "--storage", str(storage), "--rows-per-group",
                        "8", "--no-progress"], check=True, timeout=TIMEOUT_S, env=env)
        outs = [tmp_path / f"reader{i}.jsonl" for i in range(2)]
        # Both hold a first batch before either reads on (start_together), so both get a
        # share of the epoch however late the machine's load schedules one of them.
        readers = start_together([(out, ("--batch", "8", "--delay", "0.3")) for out in outs],
                                 env)
        try:
            for reader in readers:
                assert reader.wait(TIMEOUT_S) == 0, f"reader exited with {reader.returncode}"
        finally:
            for reader in readers:
                if reader.poll() is None:
                    reader.kill()
                    reader.wait()
        log = "".join(master.log)
    counts: Counter[int] = Counter()
    for out in outs:
        for line in lines(out):
            if line.get("end"):
                continue
            assert line["epoch"] == 0, line
            for rid, sha, label in zip(line["ids"], line["sha"], line["labels"], strict=True):
                assert digests[rid] == (sha, label), f"record {rid} delivered with wrong content"
            counts.update(line["ids"])
    assert set(counts) == set(range(N)), f"missing: {sorted(set(range(N)) - set(counts))[:10]}"
    assert max(counts.values()) == 1, f"repeated: {counts.most_common(3)}"
    shares = [sum(len(line["ids"]) for line in lines(out) if not line.get("end"))
              for out in outs]
    print(f"records per reader, master in {container}: {shares}")
    assert min(shares) > 0, "one reader read the whole epoch: no split between two was tested"
    assert "flowers" in log, log  # the readers' job opened the dataset through this master
