"""Shared pytest fixtures.

Real-service fixtures are session-scoped: each server starts once (seconds) and is shared by all
tests that ask for it; tests isolate themselves by using their own bucket, directory or key
prefix. A service this machine cannot run is skipped locally, but fails the run under CI=true,
where every integration test must really run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest

# Make the helpers importable as `integration.services` whatever pytest's import mode is and
# whether or not tests/ becomes a package later.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from integration.services import (  # noqa: E402 (after the sys.path set-up)
    S3Server,
    ServiceUnavailable,
    etcd_server,
    glusterfs_volume,
    postgres_server,
    seaweedfs_s3,
)

T = TypeVar("T")


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _unavailable(exc: ServiceUnavailable) -> NoReturn:
    if _in_ci():
        pytest.fail(f"CI=true requires this service, but: {exc}", pytrace=False)
    pytest.skip(f"service unavailable: {exc}")


def _start(stack: ExitStack, service: AbstractContextManager[T]) -> T:
    """Enter ``service`` on ``stack``; skip the test (fail it under CI) if it is unavailable.

    Only the start-up is guarded: a failure while tests use the service, or during teardown,
    propagates as it is.
    """
    try:
        return stack.enter_context(service)
    except ServiceUnavailable as exc:
        unavailable = exc
    _unavailable(unavailable)  # outside the except block: no "during handling" noise


# --- real services (see tests/integration/services.py) --------------------------------------


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS S3 server that checks signatures (credentials: server.storage_options()).

    The region and the no-EC2-metadata switch are set in this process's environment for the
    session, as in-process botocore clients need them; credentials are not, so code under test
    must pass them explicitly (server.env() gives a subprocess everything).
    """
    with ExitStack() as stack:
        server = _start(stack, seaweedfs_s3(tmp_path_factory.mktemp("seaweedfs")))
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        mp.setenv("AWS_DEFAULT_REGION", server.env()["AWS_DEFAULT_REGION"])
        mp.setenv("AWS_EC2_METADATA_DISABLED", server.env()["AWS_EC2_METADATA_DISABLED"])
        yield server


@pytest.fixture(scope="session")
def glusterfs_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The root of a FUSE-mounted single-brick GlusterFS volume (needs root and /dev/fuse)."""
    with ExitStack() as stack:
        yield _start(stack, glusterfs_volume(tmp_path_factory.mktemp("glusterfs")))


@pytest.fixture(scope="session")
def etcd_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Client URL ("http://127.0.0.1:PORT") of a single-member etcd."""
    with ExitStack() as stack:
        yield _start(stack, etcd_server(tmp_path_factory.mktemp("etcd")))


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL ("postgresql://postgres@127.0.0.1:PORT/postgres") of a private PostgreSQL cluster:
    superuser, trust authentication, no password. Tests create their own uniquely named tables."""
    with ExitStack() as stack:
        yield _start(stack, postgres_server(tmp_path_factory.mktemp("postgres")))


# --- small datasets -------------------------------------------------------------------------


@pytest.fixture
def image_list(tmp_path: Path) -> Path:
    """A .list of 100 small JPEGs labelled cat/dog/bird in turn (record id i -> labels[i % 3])."""
    from sample_data import make_image_list

    return make_image_list(tmp_path / "source", 100)


@pytest.fixture
def storage_dir(tmp_path: Path) -> str:
    """An empty local storage root."""
    return str(tmp_path / "storage")
