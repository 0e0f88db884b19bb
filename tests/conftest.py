"""Shared pytest fixtures.

Real-service fixtures are session-scoped: each server starts once per pytest process (seconds:
once per xdist worker, see "running in parallel" below) and is shared by all tests that ask for
it; tests isolate themselves by using their own bucket, directory or key prefix. A service this
machine cannot run is skipped locally, but fails the run under CI=true, where every integration
test must really run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

# Make the helpers importable as `integration.services` whatever pytest's import mode is and
# whether or not tests/ becomes a package later.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from integration.run_alone import RunAloneLock  # noqa: E402 (after the sys.path set-up)
from integration.services import (  # noqa: E402
    S3Server,
    ServiceUnavailable,
    etcd_server,
    glusterfs_volume,
    postgres_server,
    seaweedfs_s3,
)
from machine_load import scale_timeout  # noqa: E402

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


# --- running in parallel (pytest-xdist) ---------------------------------------------------
#
# pyproject.toml runs the suite on xdist workers (`-n auto --dist loadgroup`; "auto" is WORKERS
# below). Every worker is a separate pytest session, so each starts its own session-scoped
# servers above, on its own ports (services.py gives each worker a slice of the port range) and
# in its own temporary folder. Two kinds of tests need more:
# - GlusterFS cannot be started twice: glusterd is one per machine, and a worker that started it
#   stops it at the end of its session, under another worker's mount. Every test that uses it
#   joins one xdist group, which runs on a single worker.
# - Tests marked `timing` assert on wall-clock time (a lease outlived, a share of the work, a
#   wait under 2 s): each runs alone, with no other test running on any worker (a file lock),
#   as in a serial run. They join one group, go out last, and take a few minutes in all.

#: Workers for `-n auto`: most of the suite's time is waiting on servers, processes and
#: timeouts, so more workers than a 2-core machine's cores (measured: docs/testing.md).
WORKERS = 4

#: Service fixture -> the xdist group that every test using it (directly or not) joins.
SERVICE_GROUPS = {"glusterfs_mount": "glusterfs"}
TIMING_GROUP = "timing"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: WORKERS, or 0 (this process, serially: -s and --pdb work) when the command
    names tests of one file only, the usual way to run a single test."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    files = {arg.split("::")[0] for arg in config.args}
    if len(files) == 1 and (config.invocation_params.dir / files.pop()).is_file():
        return 0
    return WORKERS


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    """Before every other plugin: join the groups, and in an xdist worker order the tests.
    After them all: make sure xdist's groups took effect."""
    worker = hasattr(config, "workerinput")
    if worker:  # every worker sorts alike, as xdist requires
        # Slow tests go out first, so that none of them starts near the end and keeps one
        # worker busy while the others idle; the timing tests last, when the other workers
        # have little left to finish before one can run alone. (Serially the order is left
        # alone: a module's fixtures would otherwise be set up again for each run of its tests.)
        items.sort(key=lambda item: (item.get_closest_marker("timing") is not None,
                                     item.get_closest_marker("slow") is None))
    for item in items:
        wanted = {group for fixture, group in SERVICE_GROUPS.items()
                  if fixture in getattr(item, "fixturenames", ())}
        if item.get_closest_marker("timing") is not None:
            wanted.add(TIMING_GROUP)
        for group in sorted(wanted):
            item.add_marker(pytest.mark.xdist_group(group))
        if len(_groups(item)) > 1:
            # xdist would join the names into a group of their own, on another worker.
            raise pytest.UsageError(
                f"{item.nodeid} is in xdist groups {sorted(_groups(item))}, but a test can run "
                f"in one only: {SERVICE_GROUPS} are for the tests using those fixtures, "
                f"{TIMING_GROUP!r} for those marked timing"
            )
    yield
    if worker and config.getvalue("loadgroup"):
        for item in items:
            _join_xdist_group(item)


_RUN_ALONE = pytest.StashKey[RunAloneLock]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    basetemp = session.config.option.basetemp
    if hasattr(session.config, "workerinput") and basetemp:
        # The workers' temporary folders have one parent, this run's.
        lock = RunAloneLock(Path(basetemp).parent).__enter__()
        session.config.stash[_RUN_ALONE] = lock
        session.config.add_cleanup(lambda: lock.__exit__(None, None, None))


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest-timeout: waiting is not the test
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Under xdist, a test marked timing runs (set-up and teardown too) with no other test
    running on any worker; any other test runs beside any but those. Its pytest-timeout bound
    is scaled to the machine's load when it starts (tests/machine_load.py)."""
    scale_timeout(item)
    lock = item.config.stash.get(_RUN_ALONE, None)
    if lock is None:
        return (yield)
    if item.get_closest_marker("timing") is not None:
        with lock.alone(item.nodeid):
            return (yield)
    with lock.beside_others():
        return (yield)


def _groups(item: pytest.Item) -> set[str]:
    return {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")}


def _join_xdist_group(item: pytest.Item) -> None:
    """Give ``item`` the ``@GROUP`` node-id suffix by which xdist's loadgroup scheduler (in the
    controller, which sees only node ids) keeps a group on one worker.

    xdist 3.8 writes it to ``item._nodeid``, which pytest 9.2 no longer reads (node ids became
    structured, ``item._id``): the groups were silently ignored and the GlusterFS tests ran on
    two workers at once (pytest-dev/pytest-xdist#1386, open). Where xdist's write took effect
    this does nothing; where neither works, the run stops here rather than collide.
    """
    groups = _groups(item)
    if not groups:
        return
    suffix = "@" + "_".join(sorted(groups))  # xdist's own naming
    if item.nodeid.endswith(suffix):
        return
    from _pytest.nodeid import NodeId  # pytest >= 9.2; its only public form is str(item.nodeid)

    item._id = NodeId.parse(item.nodeid + suffix)  # type: ignore[attr-defined]
    if not item.nodeid.endswith(suffix):
        raise pytest.UsageError(
            f"cannot put {item.nodeid} in xdist group {suffix[1:]!r} with this pytest and "
            "pytest-xdist: run with -n 0, or see pytest-dev/pytest-xdist#1386 for a fix"
        )


# --- threads a test leaves running -------------------------------------------------------
#
# A reader a test forgets to close keeps its session threads retrying a master that is gone,
# logging "master unreachable" into later tests of the same worker (the third fresh-clone CI
# run of c5a5e75 failed on such a line in another test's caplog), and its pass's and
# decoder's threads eat the CPU of a busy machine. A module that leaves a trainfeed thread
# running after its last teardown fails there (an error at the teardown of its last test,
# naming the threads), also under xdist. Every close() joins its threads, so a module that
# closes what it made has none left; the grace only spares threads a close woke to end (a
# decoder's idle ones) or whose join is still within its bound on a busy machine.


def _thread_grace_s() -> float:
    """How long a module's threads get to end after its last teardown before they count as
    left running (a module-scoped fixture may hold a reader over several tests: checked per
    module): the longest a reader's close() waits for one of its threads, so that a thread
    still alive after it was never told to stop. Spent only when a thread is left. (Imported
    here: this conftest imports trainfeed only where a test needs it.)"""
    from trainfeed.io.prefetch import JOIN_S

    return JOIN_S


def _trainfeed_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("trainfeed-") and t.is_alive()}


#: Module node id -> the trainfeed threads alive before its first test's set-up.
_THREADS_BEFORE: dict[str, set[threading.Thread]] = {}


def _module_of(item: pytest.Item | None) -> str | None:
    return None if item is None else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _THREADS_BEFORE.setdefault(_module_of(item) or "", _trainfeed_threads())


@pytest.hookimpl(trylast=True)  # after the module's fixtures were torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    module = _module_of(item) or ""
    if _module_of(nextitem) == module:
        return
    before = _THREADS_BEFORE.pop(module, set())
    left = _trainfeed_threads() - before
    if not left:
        return
    grace_s = _thread_grace_s()
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {t for t in left if t.is_alive()}
    if left:
        pytest.fail(
            f"{module} left {len(left)} trainfeed thread(s) running {grace_s:.0f} s "
            f"after its last teardown: {', '.join(sorted(t.name for t in left))} (a reader "
            f"or session not closed? close it, with `with`, or use the close_readers "
            f"fixture)", pytrace=False)


@pytest.fixture
def close_readers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Closes, at the test's teardown, every reader the test made (for modules whose readers
    live in expressions, `list(dist.reader(...)())`): an unclosed reader keeps its decoder's
    threads until a garbage collection finds it (its meter points back at it), which the
    check above reported. Readers are held weakly: one the test drops is still collected."""
    from trainfeed.reader.reader import Reader

    made: weakref.WeakSet[Reader] = weakref.WeakSet()
    init = Reader.__init__

    def tracked(self: Reader, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.add(self)  # (one that failed to build has nothing to close)
    monkeypatch.setattr(Reader, "__init__", tracked)
    yield
    for reader in list(made):
        reader.close()

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


@pytest.fixture
def storage(image_list: Path, storage_dir: str) -> str:
    """A storage holding "flowers": the 100 records of `image_list` in 13 row groups of 8
    (the last of 4). tests/integration/conftest.py overrides it for its
    folder with row groups of 10; a module needing another dataset defines its own (listed in
    tests/test_suite_hygiene.py with the reason)."""
    from trainfeed.upload import UploadOptions, upload

    upload(str(image_list), "flowers", storage_dir, UploadOptions(row_group_rows=8),
           progress=False)
    return storage_dir

