"""Smoke tests proving the real-service fixtures are real.

If one of these fails, every integration test using the fixture is suspect; they are cheap
because the servers are session-scoped and shared with the other tests.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import s3fs

if TYPE_CHECKING:
    from integration.services import S3Server

pytestmark = pytest.mark.integration


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- S3 -------------------------------------------------------------------------------------


def test_s3_bucket_write_read(s3_server: S3Server) -> None:
    fs = s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True)
    bucket = _unique("smoke")
    fs.mkdir(bucket)
    payload = b"trainfeed \x00\xff" * 1000
    with fs.open(f"{bucket}/dir/object.bin", "wb") as f:
        f.write(payload)

    fresh = s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True)
    assert fresh.cat_file(f"{bucket}/dir/object.bin") == payload
    assert fresh.ls(f"{bucket}/dir") == [f"{bucket}/dir/object.bin"]


def test_s3_rejects_wrong_secret(s3_server: S3Server) -> None:
    good = s3fs.S3FileSystem(**s3_server.storage_options(), skip_instance_cache=True)
    bucket = _unique("auth")
    good.pipe(f"{bucket}/secret.txt", b"only for the right key")

    bad_options = {**s3_server.storage_options(), "secret": s3_server.secret_key + "-wrong"}
    bad = s3fs.S3FileSystem(**bad_options, skip_instance_cache=True)
    with pytest.raises(PermissionError):
        bad.cat_file(f"{bucket}/secret.txt")
    with pytest.raises(PermissionError):
        bad.pipe(f"{bucket}/forged.txt", b"must not be stored")
    assert not good.exists(f"{bucket}/forged.txt")


# --- GlusterFS ------------------------------------------------------------------------------


def test_glusterfs_mount_is_real(glusterfs_mount: Path) -> None:
    directory = glusterfs_mount / _unique("smoke")
    directory.mkdir()
    target = directory / "hello.bin"
    payload = bytes(range(256)) * 64
    target.write_bytes(payload)
    assert target.read_bytes() == payload

    fstype = subprocess.run(
        ["findmnt", "--noheadings", "--output", "FSTYPE", "--mountpoint", str(glusterfs_mount)],
        capture_output=True, text=True, timeout=10, check=True,
    ).stdout.strip()  # fmt: skip
    assert fstype == "fuse.glusterfs"


def test_a_volume_left_by_a_killed_run_does_not_refuse_the_next(glusterfs_mount: Path,
                                                                 tmp_path: Path) -> None:
    """A run killed before its teardown leaves its volume defined in glusterd, and pytest
    deletes its brick's folder later; the next run's brick at the same path was refused
    ("Brick may be containing or be contained by an existing brick", 2026-11-30). Here such a
    left-over volume holds the brick path the fixture used before: a new volume still mounts in
    that folder, and the left-over one is deleted."""
    from integration.services import _glusterfs_preflight, _run, glusterfs_volume

    cli = [_glusterfs_preflight()[1], "--mode=script"]  # glusterd runs: glusterfs_mount's
    workdir = tmp_path / "glusterfs"
    workdir.mkdir()
    stale = f"trainfeed-stale-{uuid.uuid4().hex[:8]}"
    _run([*cli, "volume", "create", stale, f"{socket.gethostname()}:{workdir / 'brick'}",
          "force"])
    try:
        # As pytest removes an old run's temporary files:
        shutil.rmtree(workdir / "brick", ignore_errors=True)
        with glusterfs_volume(workdir) as mounted:
            (mounted / "after.bin").write_bytes(b"ok")
            assert (mounted / "after.bin").read_bytes() == b"ok"
        assert stale not in _run([*cli, "volume", "list"]).stdout.split()
    finally:
        _run([*cli, "volume", "delete", stale], check=False)  # if the fixture did not


# --- etcd -----------------------------------------------------------------------------------


def _etcd_call(url: str, path: str, body: dict[str, str]) -> dict[str, object]:
    """POST to etcd's gRPC-gateway (v3 JSON API; keys and values are base64)."""
    request = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    with opener.open(request, timeout=10) as resp:
        result: dict[str, object] = json.load(resp)
    return result


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_etcd_put_get(etcd_url: str) -> None:
    key = _unique("/trainfeed/smoke")
    _etcd_call(etcd_url, "/v3/kv/put", {"key": _b64(key), "value": _b64("42")})

    found = _etcd_call(etcd_url, "/v3/kv/range", {"key": _b64(key)})
    kvs = found["kvs"]
    assert isinstance(kvs, list) and len(kvs) == 1
    assert base64.b64decode(kvs[0]["key"]).decode() == key
    assert base64.b64decode(kvs[0]["value"]).decode() == "42"
