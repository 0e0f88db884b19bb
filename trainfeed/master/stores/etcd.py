"""`etcd://host:port[/prefix][?ttl=S]`: the master's state in etcd, so that a standby master
takes over when the leader dies (no client package: JSON over HTTP to etcd's gateway, see
`etcd_gateway`).

Leadership follows Paddle's master design: the leader holds `<prefix>/leader` (value: its owner
id) attached to an etcd lease that a background thread keeps alive. When the leader dies the
lease expires after `ttl` seconds, etcd deletes the key, and a standby polling in `acquire`
creates it. Every write is a transaction guarded by "the leader key is still the one I created",
so a deposed master that keeps running (a long GC pause, a network partition) cannot write.

Layout under the prefix (`job` names are one segment, without `/`):

    leader                               owner id, attached to the leader's lease
    jobs/<job>/journal/<seq:020d>        JSON list of the ops of one `append`
    jobs/<job>/snapshot/<gen:020d>/<chunk:06d>
                                         UTF-8 JSON of a snapshot, in chunks of <= 512 KiB
    jobs/<job>/head                      {"gen": g, "chunks": n, "journal_after": seq}

A snapshot is written chunk by chunk (a 100,000-partition ledger is about 2 MiB of JSON, above
etcd's 1.5 MiB request limit) under a fresh generation; one transaction then switches `head` to
it and deletes the journal it includes and every older generation. A master that dies half-way
leaves only unreferenced chunks, which readers ignore and the next snapshot deletes.
"""
from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from trainfeed.errors import EtcdUnavailableError, LeadershipError, TrainfeedError
from trainfeed.master.stores.base import SavedJob, wait_for_leadership
from trainfeed.master.stores.etcd_gateway import EtcdGateway
from trainfeed.redaction import redact_url

__all__ = ["EtcdLocation", "EtcdStateStore", "EtcdUnavailableError"]

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "/trainfeed"
DEFAULT_PORT = 2379  # etcd's standard client port
# Seconds a dead leader keeps the leadership: a standby takes over this long after a crash.
# Paddle's master used a few seconds; 10 leaves room for a slow etcd or a loaded leader.
DEFAULT_TTL_S = 10
# Chunks stay well under etcd's default 1.5 MiB request limit even base64-encoded (x 4/3).
CHUNK_BYTES = 512 << 10
_SEQ_DIGITS = 20
# etcd's default --max-txn-ops: one txn holds at most this many operations (the leadership
# compares aside).
MAX_TXN_OPS = 128
# etcd's default --max-request-bytes is 1.5 MiB: a txn's values stay under 1 MiB (x 4/3 in
# base64, plus keys and JSON), and one journal entry under CHUNK_BYTES.
TXN_BYTES = 1 << 20
ENTRY_BYTES = CHUNK_BYTES


@dataclass(frozen=True)
class EtcdLocation:
    """Where an `etcd://host:port[/prefix][?ttl=SECONDS]` URL points."""

    host: str
    port: int
    prefix: str
    ttl_s: int

    @classmethod
    def parse(cls, url: str) -> EtcdLocation:
        """Raises ValueError naming `url` (its password masked) and the rule it breaks."""
        shown = redact_url(url)
        usage = "expected etcd://host:port[/prefix][?ttl=SECONDS]"
        parts = urlsplit(url)
        if parts.scheme != "etcd":
            raise ValueError(f"not an etcd state URL: {shown!r}; {usage}")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"bad port in etcd state URL {shown!r}; {usage}") from None
        if not parts.hostname:
            raise ValueError(f"no host in etcd state URL {shown!r}; {usage}")
        if parts.username is not None or parts.fragment:
            raise ValueError(f"etcd state URL {shown!r} may not hold credentials or a fragment; "
                             f"{usage}")
        query = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(query) - {"ttl"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} in etcd state URL {shown!r}; {usage}")
        ttl_s = DEFAULT_TTL_S
        if "ttl" in query:
            text = query["ttl"][-1]
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"ttl must be a whole number of seconds >= 1 in etcd state URL "
                                 f"{shown!r}, got {text!r}")
            ttl_s = int(text)
        prefix = parts.path.rstrip("/") or DEFAULT_PREFIX
        return cls(parts.hostname, port, prefix, ttl_s)


class EtcdStateStore:
    """Job state and master leadership in etcd (see the module docstring for the layout).

    Called from one thread at a time, like every StateStore; the lease keeper runs on its own
    thread with its own HTTP connection. `close()` is idempotent and revokes the lease, so that a
    standby takes over at once after a clean stop rather than `ttl` seconds later.
    """

    def __init__(self, url: str):
        self.url = url
        self.location = EtcdLocation.parse(url)
        self._keys = _Keys(self.location.prefix)
        # Requests must not hang past the lease: a stuck call would outlive the leadership.
        self._timeout_s = max(1.0, self.location.ttl_s / 2)
        self._client: EtcdGateway | None = self._new_client()
        self._owner: str | None = None
        self._lease_id: int | None = None
        self._leader_revision = 0  # create_revision of our leader key: fences every write
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._last_seq: dict[str, int] = {}
        # Ops of a batch that failed part-way which are durable all the same, per job.
        self._landed: dict[str, list[Any]] = {}
        self._call("/maintenance/status", {})  # fail fast on a wrong address

    @classmethod
    def from_url(cls, url: str) -> EtcdStateStore:
        return cls(url)

    def _new_client(self) -> EtcdGateway:
        # http.client ignores HTTP(S)_PROXY: a proxy set for storage access never sits between
        # the master and its leadership lease.
        return EtcdGateway(self.location.host, self.location.port, self._timeout_s,
                           redact_url(self.url))

    def _call(self, path: str, payload: dict[str, Any],
              client: EtcdGateway | None = None) -> dict[str, Any]:
        client = client or self._client
        if client is None:
            raise RuntimeError(f"state store {self.url} is closed")
        return client.post(path, payload)

    # --- leadership -----------------------------------------------------------------------

    def acquire(self, owner: str, wait_s: float | None = None) -> None:
        """Blocks until `owner` holds `<prefix>/leader` (see StateStore.acquire).

        While waiting, an etcd that cannot be reached is waited for too (a standby must outlive
        an etcd restart); after `wait_s` the last error is raised.
        """
        if self._lost.is_set():
            raise LeadershipError(f"state {self.url}: this store lost the leadership; open a "
                                  f"new store to take it again")
        if self._owner is not None:
            return
        wait_for_leadership(
            lambda: self._try_acquire(owner), wait_s, transient=(EtcdUnavailableError,),
            refusal=lambda holder: (
                f"state {self.url} is held by another master ({holder}); only one master may "
                f"serve it (a dead one's leadership expires after {self.location.ttl_s} s)"),
            waiting=lambda holder: (
                f"state {self.url} is held by another master ({holder}); waiting for the "
                f"leadership (it expires {self.location.ttl_s} s after that master dies)"))
        logger.info("%s holds the leadership of state %s (lease ttl %d s)",
                    owner, self.url, self.location.ttl_s)
        self._stop.clear()
        self._keeper = threading.Thread(target=self._keep_lease, args=(self._lease_id,),
                                        name="etcd-lease-keeper", daemon=True)
        self._keeper.start()

    def _try_acquire(self, owner: str) -> str | None:
        """One attempt: None once `owner` holds the leadership, else who holds it."""
        holder = self._holder()
        if holder is not None:
            return holder
        # A lease per attempt: one granted before a long wait would expire unrefreshed.
        lease_id = int(self._call("/lease/grant", {"TTL": self.location.ttl_s})["ID"])
        leader = _b64(self._keys.leader)
        result = self._call("/kv/txn", {
            "compare": [{"key": leader, "target": "CREATE", "result": "EQUAL",
                         "create_revision": 0}],
            "success": [{"request_put": {"key": leader, "value": _b64(owner),
                                         "lease": lease_id}}],
            "failure": [{"request_range": {"key": leader}}],
        })
        if not result.get("succeeded"):
            self._revoke(lease_id)  # another standby was faster
            return _first_value(result) or "unknown"
        self._owner, self._lease_id = owner, lease_id
        # The put's revision is the key's create_revision, which fences every later write.
        self._leader_revision = int(result["header"]["revision"])
        return None

    def _holder(self) -> str | None:
        kvs = self._call("/kv/range", {"key": _b64(self._keys.leader)}).get("kvs", [])
        return _unb64(kvs[0]["value"]).decode(errors="replace") if kvs else None

    def _keep_lease(self, lease_id: int) -> None:
        """Refreshes the lease every ttl/3 until closed; flags the leadership lost when etcd
        says the lease is gone or no refresh has succeeded for a whole ttl (it has expired)."""
        client = self._new_client()
        ttl_s = self.location.ttl_s
        last_ok = time.monotonic()
        try:
            while not self._stop.wait(ttl_s / 3):
                try:
                    result = self._call("/lease/keepalive", {"ID": lease_id}, client)
                    remaining = int(result.get("result", {}).get("TTL", -1))
                except TrainfeedError as e:  # includes EtcdUnavailableError
                    if time.monotonic() - last_ok < ttl_s:
                        logger.warning("refreshing the leadership lease of %s failed (%s); "
                                       "retrying", self.url, e)
                        continue
                    remaining = -1
                if remaining <= 0:
                    logger.error("the leadership lease of state %s expired or was revoked; "
                                 "this master must stop serving", self.url)
                    self._lost.set()
                    return
                last_ok = time.monotonic()
        finally:
            client.close()

    def _revoke(self, lease_id: int) -> None:
        try:
            self._call("/kv/lease/revoke", {"ID": lease_id})
        except TrainfeedError as e:  # it expires by itself after ttl
            logger.warning("could not revoke etcd lease %x of %s: %s", lease_id, self.url, e)

    def _fenced(self, ops: list[dict[str, Any]]) -> None:
        """Runs `ops` in one transaction if this store still holds the leadership, else raises
        LeadershipError naming who does."""
        if self._owner is None:
            raise LeadershipError(f"state {self.url}: write before acquire(); a master must "
                                  f"hold the leadership to write")
        if self._lost.is_set():
            raise LeadershipError(f"state {self.url}: {self._owner} lost the leadership "
                                  f"(its lease expired or was revoked); stop serving")
        leader = _b64(self._keys.leader)
        result = self._call("/kv/txn", {
            "compare": [
                {"key": leader, "target": "VALUE", "result": "EQUAL",
                 "value": _b64(self._owner)},
                # The value alone could match a new leader with the same hostname:pid (a
                # restarted container); the revision of our own creation cannot.
                {"key": leader, "target": "CREATE", "result": "EQUAL",
                 "create_revision": self._leader_revision},
            ],
            "success": ops,
            "failure": [{"request_range": {"key": leader}}],
        })
        if not result.get("succeeded"):
            self._lost.set()
            holder = _first_value(result) or "nobody (the lease expired)"
            raise LeadershipError(f"state {self.url}: {self._owner} lost the leadership; it is "
                                  f"now held by {holder}; this master must stop serving")

    # --- job state --------------------------------------------------------------------------

    def leading(self) -> bool:
        return self._lease_id is not None and not self._lost.is_set()

    def load_jobs(self) -> dict[str, SavedJob]:
        keys = self._keys
        listing = self._range(keys.jobs, keys_only=True)
        heads: set[str] = set()
        journals: dict[str, int] = {}
        for kv in listing:
            job, _, rest = _unb64(kv["key"]).decode()[len(keys.jobs):].partition("/")
            if rest == "head":
                heads.add(job)
            elif rest.startswith("journal/"):
                journals[job] = max(journals.get(job, 0), int(rest[len("journal/"):]))
        for job in sorted(set(journals) - heads):
            logger.warning("state %s: job %r has a journal but no snapshot; skipping it (it "
                           "should not happen: a job is snapshotted when created)", self.url, job)
        jobs = {}
        for job in sorted(heads):
            head = self._head(job)
            if head is None:  # deleted since the listing
                continue
            chunks = self._range(keys.generation(job, head.gen))
            if len(chunks) != head.chunks:
                raise TrainfeedError(
                    f"state {self.url}: snapshot generation {head.gen} of job {job!r} has "
                    f"{len(chunks)} chunk(s), its head says {head.chunks}; the state is damaged "
                    f"(changed by hand or by another program?)")
            text = b"".join(_unb64(kv.get("value", "")) for kv in chunks)
            journal = self._range(keys.journal_entry(job, head.journal_after + 1),
                                  _prefix_end(keys.journal(job)))
            ops = [op for kv in journal for op in json.loads(_unb64(kv.get("value", "")))]
            jobs[job] = SavedJob(json.loads(text), ops)
            self._last_seq[job] = max(journals.get(job, 0), head.journal_after)
        return jobs

    def append(self, job: str, ops: Sequence[Any]) -> None:
        self.append_batch({job: ops})

    def append_batch(self, ops_by_job: Mapping[str, Sequence[Any]]) -> None:
        """A journal entry per job, in one txn when it fits (the journal writer's group commit).

        A batch above one txn's limits (MAX_TXN_OPS puts, TXN_BYTES of values: etcd refuses
        larger requests) goes in several txns, in order, and a job's ops above ENTRY_BYTES in
        several entries. If a later txn fails, the ops of the earlier ones are durable: they are
        remembered, and when the journal writer retries the batch (its failed entries come
        first, in order, so each job's ops start with them) they are not written twice.
        """
        landed, self._landed = self._landed, {}
        entries: list[tuple[str, list[Any], bytes]] = []
        for job, ops in ops_by_job.items():
            todo = list(ops)
            done = landed.get(job, [])
            if done and todo[:len(done)] == done:
                todo = todo[len(done):]
            elif done:
                logger.warning("state %s: a retried batch of job %r does not start with the %d "
                               "op(s) already written; writing all of it", self.url, job,
                               len(done))
                done = []
            if done:
                self._landed[job] = done  # still durable, whatever happens to the rest
            entries.extend((job, part, text) for part, text in _entries(todo))
        written: dict[str, list[Any]] = {}
        try:
            for txn in _txns(entries):
                puts = []
                seqs = dict.fromkeys((job for job, _, _ in txn), 0)
                for job, _, text in txn:
                    seqs[job] = seqs[job] or self._seq(job)
                    seqs[job] += 1
                    puts.append({"request_put": {
                        "key": _b64(self._keys.journal_entry(job, seqs[job])),
                        "value": _b64(text)}})
                self._fenced(puts)
                for job, part, _ in txn:
                    written.setdefault(job, []).extend(part)
                self._last_seq.update(seqs)
        except BaseException:
            for job, part in written.items():
                self._landed[job] = self._landed.get(job, []) + part
            raise
        self._landed = {}

    def save_snapshot(self, job: str, snapshot: dict[str, Any]) -> None:
        keys = self._keys
        text = json.dumps(snapshot, separators=(",", ":")).encode()
        newest = self._range(keys.snapshots(job), _prefix_end(keys.snapshots(job)),
                             keys_only=True, descending_limit_1=True)
        gen = 1
        if newest:  # above every generation, finished or not
            gen = int(_unb64(newest[0]["key"]).decode()[len(keys.snapshots(job)):]
                      .partition("/")[0]) + 1
        chunks = [text[i:i + CHUNK_BYTES] for i in range(0, len(text), CHUNK_BYTES)] or [b""]
        for i, chunk in enumerate(chunks):
            self._fenced([{"request_put": {"key": _b64(keys.chunk(job, gen, i)),
                                           "value": _b64(chunk)}}])
        journal_after = self._seq(job)
        head = {"gen": gen, "chunks": len(chunks), "journal_after": journal_after}
        self._fenced([
            {"request_put": {"key": _b64(keys.head(job)), "value": _b64(json.dumps(head))}},
            {"request_delete_range": {"key": _b64(keys.journal(job)),
                                      "range_end": _b64(keys.journal_entry(job,
                                                                           journal_after + 1))}},
            # Every older generation, including chunks a crashed master left unreferenced.
            {"request_delete_range": {"key": _b64(keys.snapshots(job)),
                                      "range_end": _b64(keys.generation(job, gen))}},
        ])

    def _seq(self, job: str) -> int:
        """The highest journal sequence number of `job` ever used (0 if none): numbering goes on
        after a restart, and after a snapshot dropped the entries themselves."""
        if job not in self._last_seq:
            journal = self._keys.journal(job)
            newest = self._range(journal, _prefix_end(journal), keys_only=True,
                                 descending_limit_1=True)
            seq = int(_unb64(newest[0]["key"]).decode()[len(journal):]) if newest else 0
            head = self._head(job)
            self._last_seq[job] = max(seq, head.journal_after if head else 0)
        return self._last_seq[job]

    def _head(self, job: str) -> _Head | None:
        kvs = self._range(self._keys.head(job))
        if not kvs:
            return None
        head = json.loads(_unb64(kvs[0]["value"]))
        return _Head(int(head["gen"]), int(head["chunks"]), int(head["journal_after"]))

    def _range(self, key: str, end: str | None = None, keys_only: bool = False,
               descending_limit_1: bool = False) -> list[dict[str, Any]]:
        """The key-values in [key, end) in key order: `key` alone if end is None, or every key
        under it if `key` ends with '/'. `descending_limit_1`: only the last one."""
        if end is None and key.endswith("/"):
            end = _prefix_end(key)
        payload: dict[str, Any] = {"key": _b64(key)}
        if end is not None:
            payload["range_end"] = _b64(end)
        if keys_only:
            payload["keys_only"] = True
        if descending_limit_1:
            payload.update(limit=1, sort_order="DESCEND", sort_target="KEY")
        kvs: list[dict[str, Any]] = self._call("/kv/range", payload).get("kvs", [])
        return kvs

    def close(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()
            self._keeper = None
        if self._client is None:
            return
        if self._lease_id is not None and not self._lost.is_set():
            self._revoke(self._lease_id)  # deletes the leader key: a standby takes over now
        self._lease_id = None
        self._owner = None
        self._client.close()
        self._client = None

    def __enter__(self) -> EtcdStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Head:
    gen: int
    chunks: int
    journal_after: int


@dataclass(frozen=True)
class _Keys:
    """Key names under one prefix; one place, so readers and writers cannot disagree."""

    prefix: str

    @property
    def leader(self) -> str:
        return f"{self.prefix}/leader"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}/jobs/"

    def job(self, job: str) -> str:
        if not job or "/" in job:  # names.validate_job_name already rules these out
            raise ValueError(f"job name {job!r} cannot be one etcd key segment")
        return f"{self.jobs}{job}/"

    def head(self, job: str) -> str:
        return f"{self.job(job)}head"

    def journal(self, job: str) -> str:
        return f"{self.job(job)}journal/"

    def journal_entry(self, job: str, seq: int) -> str:
        return f"{self.journal(job)}{seq:0{_SEQ_DIGITS}d}"

    def snapshots(self, job: str) -> str:
        return f"{self.job(job)}snapshot/"

    def generation(self, job: str, gen: int) -> str:
        return f"{self.snapshots(job)}{gen:0{_SEQ_DIGITS}d}/"

    def chunk(self, job: str, gen: int, index: int) -> str:
        return f"{self.generation(job, gen)}{index:06d}"


def _entries(ops: list[Any]) -> list[tuple[list[Any], bytes]]:
    """`ops` as journal entries (the ops, their JSON) of at most ENTRY_BYTES each (an op above
    that alone is an entry of its own): one entry in the common case, encoded once."""
    if not ops:
        return []
    text = json.dumps(ops, separators=(",", ":")).encode()
    if len(text) <= ENTRY_BYTES:
        return [(ops, text)]
    entries: list[tuple[list[Any], bytes]] = []
    part: list[Any] = []
    size = 2  # the brackets
    for op in ops:
        op_size = len(json.dumps(op, separators=(",", ":")).encode()) + 1
        if part and size + op_size > ENTRY_BYTES:
            entries.append((part, json.dumps(part, separators=(",", ":")).encode()))
            part, size = [], 2
        part.append(op)
        size += op_size
    entries.append((part, json.dumps(part, separators=(",", ":")).encode()))
    return entries


def _txns(entries: list[tuple[str, list[Any], bytes]]
          ) -> list[list[tuple[str, list[Any], bytes]]]:
    """`entries` in order, cut into txns of at most MAX_TXN_OPS - 1 puts and TXN_BYTES."""
    txns: list[list[tuple[str, list[Any], bytes]]] = []
    size = 0
    for entry in entries:
        if not txns or len(txns[-1]) >= MAX_TXN_OPS - 1 or size + len(entry[2]) > TXN_BYTES:
            txns.append([])
            size = 0
        txns[-1].append(entry)
        size += len(entry[2])
    return txns


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


def _unb64(data: str) -> bytes:
    return base64.b64decode(data)


def _prefix_end(prefix: str) -> str:
    """The first key after every key that starts with `prefix` (ASCII prefixes only)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _first_value(txn_result: dict[str, Any]) -> str | None:
    """The value read by the range request of a failed transaction, if the key existed."""
    for response in txn_result.get("responses", []):
        kvs = response.get("response_range", {}).get("kvs", [])
        if kvs:
            return _unb64(kvs[0].get("value", "")).decode(errors="replace")
    return None
