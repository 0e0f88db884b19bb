"""EtcdStateStore against a real etcd: layout, chunked snapshots, leadership and fencing."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import etcd3gw
import pytest

from trainfeed.errors import EtcdUnavailableError, LeadershipError, StateStoreError
from trainfeed.master.serve.journal import JournalWriter
from trainfeed.master.stores import SavedJob, open_state_store
from trainfeed.master.stores.etcd import CHUNK_BYTES, ENTRY_BYTES, EtcdStateStore


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests sharing the session's etcd cannot meet."""
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def state_url(etcd_url: str, prefix: str) -> str:
    return f"etcd://{urlsplit(etcd_url).netloc}{prefix}?ttl=2"


@pytest.fixture
def raw(etcd_url: str) -> Iterator[etcd3gw.Etcd3Client]:
    """A plain etcd client, to look at (and tamper with) keys behind the store's back."""
    parts = urlsplit(etcd_url)
    client = etcd3gw.Etcd3Client(parts.hostname or "", parts.port or 0, api_path="/v3/")
    client.session.trust_env = False
    yield client
    client.session.close()


def keys_under(client: etcd3gw.Etcd3Client, prefix: str) -> list[str]:
    return sorted(meta["key"].decode() for _, meta in client.get_prefix(prefix + "/"))


def open_store(url: str, owner: str = "master-a") -> EtcdStateStore:
    store = open_state_store(url)
    assert isinstance(store, EtcdStateStore)
    store.acquire(owner, wait_s=5)
    return store


def test_snapshot_and_journal_survive_reopening(state_url: str) -> None:
    store = open_store(state_url)
    store.save_snapshot("j", {"version": 1, "epoch": 0})
    store.append("j", [{"op": "lease", "task": 1}])
    store.append("j", [])  # nothing to append: no entry
    store.append("j", [{"op": "done", "task": 1}, {"op": "lease", "task": 2}])
    store.save_snapshot("k", {"version": 1, "epoch": 5})
    store.close()
    store.close()  # idempotent

    again = open_store(state_url, "master-b")
    assert again.load_jobs() == {
        "j": SavedJob({"version": 1, "epoch": 0}, [{"op": "lease", "task": 1},
                                                   {"op": "done", "task": 1},
                                                   {"op": "lease", "task": 2}]),
        "k": SavedJob({"version": 1, "epoch": 5}, []),
    }
    again.close()


def test_a_snapshot_drops_the_journal_it_includes(
        state_url: str, prefix: str, raw: etcd3gw.Etcd3Client) -> None:
    with open_store(state_url) as store:
        store.save_snapshot("j", {"epoch": 0})
        store.append("j", ["a"])
        store.append("j", ["b"])
        store.save_snapshot("j", {"epoch": 1})
        store.append("j", ["c"])
        assert store.load_jobs() == {"j": SavedJob({"epoch": 1}, ["c"])}
        assert keys_under(raw, prefix) == [
            f"{prefix}/jobs/j/head",
            f"{prefix}/jobs/j/journal/{3:020d}",  # 1 and 2 went with the second snapshot
            f"{prefix}/jobs/j/snapshot/{2:020d}/000000",  # generation 1 is gone
            f"{prefix}/leader",
        ]


def test_a_snapshot_above_the_etcd_request_limit_is_chunked(
        state_url: str, prefix: str, raw: etcd3gw.Etcd3Client) -> None:
    # About the size of a 100,000-partition ledger (over 2 MiB of JSON).
    big = {"version": 1, "done": list(range(300_000)), "name": "é" * 200_000}
    with open_store(state_url) as store:
        store.save_snapshot("big", big)
        store.append("big", [{"op": "epoch"}])
    chunks = [k for k in keys_under(raw, prefix) if "/snapshot/" in k]
    assert len(chunks) >= 5 and len(chunks) * CHUNK_BYTES >= 2 << 20
    with open_store(state_url, "master-b") as again:
        assert again.load_jobs() == {"big": SavedJob(big, [{"op": "epoch"}])}


def test_sequence_numbers_go_on_after_reopening(
        state_url: str, prefix: str, raw: etcd3gw.Etcd3Client) -> None:
    with open_store(state_url) as store:
        store.save_snapshot("j", {"epoch": 0})
        store.append("j", [1])
        store.append("j", [2])
        store.save_snapshot("j", {"epoch": 1})  # drops entries 1 and 2
    with open_store(state_url, "master-b") as store:
        store.append("j", [3])  # without load_jobs first: numbering must still go on
    with open_store(state_url, "master-c") as store:
        assert store.load_jobs() == {"j": SavedJob({"epoch": 1}, [3])}
        store.append("j", [4])
        assert store.load_jobs() == {"j": SavedJob({"epoch": 1}, [3, 4])}
    journal = [k.rsplit("/", 1)[1] for k in keys_under(raw, prefix) if "/journal/" in k]
    assert journal == [f"{3:020d}", f"{4:020d}"]


def test_unfinished_snapshots_and_headless_journals_are_ignored(
        state_url: str, prefix: str, raw: etcd3gw.Etcd3Client) -> None:
    with open_store(state_url) as store:
        store.save_snapshot("j", {"epoch": 0})
        # A master that died while writing generation 7, and a journal without any snapshot.
        raw.put(f"{prefix}/jobs/j/snapshot/{7:020d}/000000", '{"epoch": 99')
        raw.put(f"{prefix}/jobs/orphan/journal/{1:020d}", "[1]")
        assert store.load_jobs() == {"j": SavedJob({"epoch": 0}, [])}
        store.save_snapshot("j", {"epoch": 1})  # above generation 7, and deletes it
        assert store.load_jobs() == {"j": SavedJob({"epoch": 1}, [])}
    assert [k for k in keys_under(raw, prefix) if "/jobs/j/snapshot/" in k] == [
        f"{prefix}/jobs/j/snapshot/{8:020d}/000000"]


def test_only_one_store_holds_the_leadership(state_url: str, prefix: str,
                                             raw: etcd3gw.Etcd3Client) -> None:
    first = open_store(state_url, "master-a")
    second = open_state_store(state_url)
    try:
        with pytest.raises(LeadershipError, match=r"held by another master \(master-a\)"):
            second.acquire("master-b", wait_s=1)
        with pytest.raises(LeadershipError, match="before acquire"):
            second.append("j", [1])
        first.close()  # revokes the lease: no need to wait for the ttl
        second.acquire("master-b", wait_s=1)
        second.save_snapshot("j", {"epoch": 0})
        assert raw.get(f"{prefix}/leader") == [b"master-b"]
    finally:
        first.close()
        second.close()
    assert raw.get(f"{prefix}/leader") == []


def test_a_master_whose_lease_was_revoked_cannot_write(
        state_url: str, prefix: str, raw: etcd3gw.Etcd3Client) -> None:
    with open_store(state_url, "master-a") as store:
        store.save_snapshot("j", {"epoch": 0})
        store.append("j", [1])
        [(_, leader)] = raw.get(f"{prefix}/leader", metadata=True)
        raw.post(raw.get_url("/kv/lease/revoke"), json={"ID": int(leader["lease"])})
        with pytest.raises(LeadershipError, match="master-a lost the leadership"):
            store.append("j", [2])
        with pytest.raises(LeadershipError):
            store.save_snapshot("j", {"epoch": 1})
    assert not [k for k in keys_under(raw, prefix) if k.endswith(f"{2:020d}")]
    with open_store(state_url, "master-b") as again:
        assert again.load_jobs() == {"j": SavedJob({"epoch": 0}, [1])}


def test_a_new_leader_fences_off_the_old_one(state_url: str, prefix: str,
                                             raw: etcd3gw.Etcd3Client) -> None:
    """A deposed master that keeps running (its lease expired during a pause) must not write,
    even when the leader key it would compare against carries the same owner string."""
    old = open_store(state_url, "host:1")
    [(_, leader)] = raw.get(f"{prefix}/leader", metadata=True)
    raw.post(raw.get_url("/kv/lease/revoke"), json={"ID": int(leader["lease"])})
    new = open_store(state_url, "host:1")  # a restarted container: same hostname and pid
    try:
        new.save_snapshot("j", {"epoch": 0})
        # As if the old store's lease keeper had not noticed yet: only the fencing is left.
        old._stop.set()
        assert old._keeper is not None
        old._keeper.join()
        old._lost.clear()
        with pytest.raises(LeadershipError, match="lost the leadership; it is now held by host:1"):
            old.append("j", ["stale"])
        assert new.load_jobs() == {"j": SavedJob({"epoch": 0}, [])}
    finally:
        old.close()
        new.close()


@pytest.mark.parametrize("url, message", [
    ("etcd://", "no host"),
    ("etcd://127.0.0.1:port", "bad port"),
    ("etcd://127.0.0.1:2379/x?ttl=soon", "ttl must be a whole number"),
    ("etcd://127.0.0.1:2379/x?tll=3", r"unknown option\(s\) \['tll'\]"),
])
def test_bad_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        open_state_store(url)
    assert url in str(info.value)


def test_an_unreachable_etcd_is_named() -> None:
    # Port 1 on loopback: nothing listens there, so the connection is refused at once.
    with pytest.raises(ConnectionError, match=r"cannot reach etcd for state etcd://127\.0\.0\.1:1"):
        open_state_store("etcd://127.0.0.1:1/x")


def test_values_are_readable_json(prefix: str, state_url: str,
                                  raw: etcd3gw.Etcd3Client) -> None:
    """Operators read the state with etcdctl: values are plain JSON."""
    with open_store(state_url) as store:
        store.save_snapshot("j", {"name": "café"})
        store.append("j", [{"op": "lease"}])
    assert raw.get(f"{prefix}/jobs/j/head") == [b'{"gen": 1, "chunks": 1, "journal_after": 0}']
    assert raw.get(f"{prefix}/jobs/j/snapshot/{1:020d}/000000") == [b'{"name":"caf\\u00e9"}']
    assert raw.get(f"{prefix}/jobs/j/journal/{1:020d}") == [b'[{"op":"lease"}]']


class FailingOnce(EtcdStateStore):
    """A real etcd store whose `fail_at`-th txn (counted from 1) fails once, as if etcd were
    unreachable just then (the txns before it have landed), and whose commits wait for `gate`."""

    fail_at = 0

    def __init__(self, url: str):
        super().__init__(url)
        self.txns = 0
        self.gate = threading.Event()
        self.gate.set()

    def append_batch(self, ops_by_job: Mapping[str, Sequence[Any]]) -> None:
        self.gate.wait(30)
        super().append_batch(ops_by_job)

    def _fenced(self, ops: list[dict[str, Any]]) -> None:
        self.txns += 1
        if self.txns == self.fail_at:
            raise EtcdUnavailableError(f"cannot reach etcd for state {self.url}: test")
        super()._fenced(ops)


def many_jobs_batch(n: int, tag: str) -> dict[str, list[Any]]:
    return {f"job{i:03d}": [["D", i, tag], ["L", tag, [i]]] for i in range(n)}


def test_a_batch_of_more_jobs_than_a_txn_holds_is_split_and_every_op_lands(
        state_url: str) -> None:
    """etcd refuses a txn of more than --max-txn-ops (128) puts: 300 jobs' entries go in 3."""
    batch = many_jobs_batch(300, "w")
    with open_store(state_url) as store:
        for job in batch:
            store.save_snapshot(job, {"version": 1})
        store.append_batch(batch)
    with open_store(state_url, "master-b") as again:
        assert {job: saved.journal for job, saved in again.load_jobs().items()} == batch


def test_a_batch_above_etcds_request_limit_is_split_and_every_op_lands(
        state_url: str) -> None:
    """etcd refuses a request above 1.5 MiB: a tick's 3 MiB of one job's ops (a long etcd
    outage queues that much) go in several entries and txns, in order."""
    ops = [["P", i, 600, "reader-" + "x" * 40 + f"-{i:07d}"] for i in range(50_000)]
    assert len(json.dumps(ops)) > 3 * ENTRY_BYTES
    state_url = state_url.replace("ttl=2", "ttl=10")  # 5 s per request: 1 MiB txns, loaded
    with open_store(state_url) as store:
        store.save_snapshot("j", {"version": 1})
        store.append_batch({"j": ops, "k": [["D", 1, "w"]]})
        store.save_snapshot("k", {"version": 1})
    with open_store(state_url, "master-b") as again:
        saved = again.load_jobs()
    assert saved["j"].journal == ops


def test_a_batch_that_failed_part_way_is_retried_without_writing_ops_twice(
        state_url: str) -> None:
    """The journal writer retries a failed commit; the txns of it that had landed before the
    failure are not written again (a lease or a DONE replayed twice corrupts the ledger), and
    nothing acknowledged is lost, then or after a crash."""
    first, second = many_jobs_batch(300, "a"), many_jobs_batch(300, "b")
    store = FailingOnce(state_url)
    store.acquire("master-a", wait_s=5)
    for job in [*first, "hold"]:
        store.save_snapshot(job, {"version": 1})
    # The txns: "hold" (its commit keeps the writer busy while the 300 calls queue up), then
    # the 300 calls' commit in 3 txns, the second of which fails.
    store.fail_at = store.txns + 3

    async def main() -> None:
        writer = JournalWriter(store)
        writer.start(asyncio.get_running_loop())
        store.gate.clear()
        hold = asyncio.ensure_future(writer.write("hold", [["D", 0, "h"]]))
        await asyncio.sleep(0.2)
        calls = [asyncio.ensure_future(writer.write(job, ops)) for job, ops in first.items()]
        await asyncio.sleep(0.2)
        store.gate.set()
        await hold
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, StateStoreError) for r in results), results[:3]
        # Acknowledged after the retry (the writer retries the failed entries first).
        await asyncio.gather(*(writer.write(job, ops) for job, ops in second.items()))
        writer.close()
    asyncio.run(main())
    store._lost.set()  # a crash: the leadership is not revoked, nothing more is written
    store.close()
    with open_store(state_url, "master-b") as again:
        journals = {job: saved.journal for job, saved in again.load_jobs().items()}
    assert journals.pop("hold") == [["D", 0, "h"]]
    assert journals == {job: first[job] + second[job] for job in first}


def test_a_connection_closed_under_the_store_is_opened_again(state_url: str) -> None:
    """The store keeps one HTTP connection to etcd's gateway; one that died while idle (etcd
    restarted, a proxy's idle timeout) costs a reconnect, not a failed commit."""
    with open_store(state_url) as store:
        store.save_snapshot("j", {"version": 1})
        for i in range(3):
            conn = store._client._conn if store._client is not None else None
            assert conn is not None and conn.sock is not None
            conn.sock.shutdown(socket.SHUT_RDWR)  # as a server closing it would
            store.append("j", [["D", i, "w"]])
    with open_store(state_url, "master-b") as again:
        assert again.load_jobs()["j"].journal == [["D", i, "w"] for i in range(3)]
