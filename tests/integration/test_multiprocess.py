"""A real master process and several reader processes over one uploaded dataset."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from machine_load import hang_bound, latency_bound, slowdown
from sample_data import file_digests, make_image_list
from start_barrier import release_when_ready

from trainfeed.lease.book import PROGRESS_MIN_RECORDS
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = pytest.mark.integration
WORKER = str(Path(__file__).with_name("reader_worker.py"))
N = 300
# A bound against a hung reader, on an idle machine (scaled to the load where it is used).
TIMEOUT_S = 120


def start_reader(out: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, WORKER, "--dataset", "flowers", "--out", str(out),
                             *args], env={**os.environ, **env})


def start_together(runs: list[tuple[Path, tuple[str, ...]]],
                   env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """Starts one reader per (out, args) and lets them read on once each holds its first batch
    (reader_worker.py's start barrier): then all of them take part in epoch 0 however late the
    machine's load schedules one of them."""
    go = runs[0][0].with_name("go")
    ready = [out.with_suffix(".ready") for out, _ in runs]
    procs = [start_reader(out, env, *args, "--ready", str(flag), "--go", str(go))
             for (out, args), flag in zip(runs, ready)]
    release_when_ready(procs, ready, go, TIMEOUT_S)
    return procs


def wait_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Waits for every reader to exit cleanly; the bound is against a hang, so it follows the
    load (TIMEOUT_S each, as before, times the load)."""
    timeout_s = hang_bound(TIMEOUT_S)
    try:
        for p in procs:
            assert p.wait(timeout_s) == 0, f"reader exited with {p.returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def lines(path: Path) -> list[dict]:
    """The complete lines a reader wrote so far: a line still being written (no newline yet)
    is left for the next look, as a test polling a running reader's output would otherwise
    parse half a line (CI: JSONDecodeError at column 1370)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines()]


def batch_lines(path: Path) -> list[dict]:
    """The batch lines a reader wrote so far (not its pass ends or checkpoint lines)."""
    return [line for line in lines(path) if "ids" in line]


def signal_after(victim: subprocess.Popen[bytes], out: Path, batches: int, sig: int,
                 pause_s: float = 0.0) -> int:
    """Sends `sig` to a reader once it wrote `batches` batch lines (and `pause_s` later);
    returns its exit status. The victim is killed in any case.

    Only batch lines count: a pass's end line (a reader the load scheduled late can find its
    first epoch at its tail and end that pass after one batch) or a checkpoint line is no
    batch in the trainer's hands. Both waits are bounds against a hang, so follow the load
    (a SIGTERMed reader hands its leases back before it dies)."""
    try:
        deadline = time.monotonic() + hang_bound(60)
        while len(batch_lines(out)) < batches:
            assert time.monotonic() < deadline and victim.poll() is None
            time.sleep(0.01)
        time.sleep(pause_s)
        victim.send_signal(sig)
        return victim.wait(hang_bound(10))
    finally:
        if victim.poll() is None:
            victim.kill()


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[str, Path]:
    source = make_image_list(tmp_path / "source", N)
    storage = str(tmp_path / "storage")
    # 8-row row groups: 38 partitions, many per reader.
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    return storage, source


def delivered(outs: list[Path], digests: dict[int, tuple[str, str]]) -> dict[int, Counter]:
    """Epoch -> Counter of record ids delivered in it (tuple-mode lines mapped back by sha)."""
    by_sha = {sha: rid for rid, (sha, _) in digests.items()}
    per_epoch: dict[int, Counter] = {}
    for out in outs:
        for line in lines(out):
            if line.get("end"):
                continue
            ids = line["ids"] or [by_sha[s] for s in line["sha"]]
            for rid, sha, label in zip(ids, line["sha"], line["labels"]):
                assert digests[rid] == (sha, label), f"record {rid} delivered with wrong content"
            per_epoch.setdefault(line["epoch"], Counter()).update(ids)
    return per_epoch


@pytest.mark.slow
def test_readers_of_one_job_split_every_epoch_exactly_once(dataset: tuple[str, Path],
                                                           tmp_path: Path) -> None:
    storage, source = dataset
    digests = file_digests(source)
    with MasterProcess(storage) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        outs = [tmp_path / f"reader{i}.jsonl" for i in range(3)]
        slow = ("--epochs", "2", "--delay", "0.05")
        wait_all(start_together([(outs[0], slow), (outs[1], (*slow, "--batch", "7")),
                                 (outs[2], (*slow, "--mode", "tuples"))], env))
    per_epoch = delivered(outs, digests)
    assert per_epoch, "no records delivered"
    for epoch, counts in sorted(per_epoch.items()):
        assert set(counts) == set(range(N)), f"epoch {epoch} misses {set(range(N)) - set(counts)}"
        assert max(counts.values()) == 1, f"epoch {epoch} repeats {counts.most_common(3)}"
    # Every reader ran its two passes to the end; epochs are consecutive from 0.
    for out in outs:
        assert [l["pass"] for l in lines(out) if l.get("end")] == [0, 1]
    assert sorted(per_epoch) == list(range(len(per_epoch)))
    # More than one reader got work in the first epoch (the split is real).
    readers_in_epoch0 = sum(1 for out in outs if any(
        l.get("epoch") == 0 and not l.get("end") for l in lines(out)))
    assert readers_in_epoch0 >= 2


def test_train_local_yields_the_same_multiset_without_a_master(dataset: tuple[str, Path],
                                                               tmp_path: Path) -> None:
    storage, source = dataset
    out = tmp_path / "local.jsonl"
    env = {"TRAIN_LOCAL": "1", "TRAINFEED_STORAGE": storage, "TRAINFEED_MASTER": ""}
    wait_all([start_reader(out, env, "--epochs", "2", "--mode", "tuples")])
    per_epoch = delivered([out], file_digests(source))
    assert sorted(per_epoch) == [0, 1]
    for counts in per_epoch.values():
        assert counts == Counter(range(N))


@pytest.mark.slow
def test_a_killed_reader_loses_nothing_its_leases_expire_to_the_others(
        dataset: tuple[str, Path], tmp_path: Path) -> None:
    storage, source = dataset
    with MasterProcess(storage, extra_args=["--lease-timeout", "2"]) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        victim_out, survivor_out = tmp_path / "victim.jsonl", tmp_path / "survivor.jsonl"
        # Its steps and the pause below as long as the load makes its reporter's work: a
        # reporter that the load kept from sending for 0.25 s would leave more unacknowledged.
        k = slowdown()
        victim = start_reader(victim_out, env, "--delay", f"{0.5 * k:.3f}")
        # Mid-"training step", 3 batches in: past the reporter's coalescing window (COALESCE_S,
        # 50 ms), so only the batch in the trainer's hands is unacknowledged.
        signal_after(victim, victim_out, 3, signal.SIGKILL, pause_s=0.25 * k)
        wait_all([start_reader(survivor_out, env)])
    counts = delivered([victim_out, survivor_out], file_digests(source))[0]
    assert set(counts) == set(range(N))
    # Repeats are only records the victim delivered whose partitions it had not yet acknowledged:
    # those touched by the batch of 16 in its hands (at most 3 partitions of 8 rows). Partitions
    # it leased but never delivered from are not repeats: they simply go to the survivor.
    repeated = [rid for rid, n in counts.items() if n > 1]
    print(f"records delivered twice after the SIGKILL: {len(repeated)}")
    assert len(repeated) <= 3 * 8


@pytest.mark.slow
@pytest.mark.timing
def test_heartbeats_keep_leases_of_slow_partitions_alive(dataset: tuple[str, Path],
                                                         tmp_path: Path) -> None:
    # One 8-row partition takes 2.4 lease timeouts to "train" (0.3 of one per batch of 1), and
    # its prefetched ones wait longer still: only heartbeats keep the leases; an expiry would
    # hand partitions out twice. The lease is 1 s on an idle machine. A heartbeat goes every
    # third of it, so a reader that cannot run for 2/3 s loses its leases, as it should (this
    # test failed at load 64 on 2 cores, issue 38). So the lease, a latency claimed for a
    # reader with a core of its own, is scaled by the load, and the training with it.
    lease_s = latency_bound(1.0)
    storage, source = dataset
    with MasterProcess(storage, extra_args=["--lease-timeout", f"{lease_s:.3f}"]) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "slow", "TRAIN_LOCAL": ""}
        outs = [tmp_path / "slow.jsonl", tmp_path / "fast.jsonl"]
        # Both hold a first batch of epoch 0 before either reads on: else the fast one could
        # read the whole epoch before the slow one (scheduled late) leased anything.
        wait_all(start_together([
            (outs[0], ("--batch", "1", "--delay", f"{0.3 * lease_s:.3f}", "--prefetch", "2")),
            (outs[1], ("--delay", "0.05"))], env))
        log = "".join(master.log)
    counts = delivered(outs, file_digests(source))[0]
    assert counts == Counter(range(N)), counts.most_common(3)
    assert "expired" not in log, log
    assert batch_lines(outs[0]), "the slow reader read nothing: no slow lease was tested"


@pytest.mark.slow
def test_a_poisoned_shard_is_given_up_on_and_the_epoch_still_completes(
        tmp_path: Path) -> None:
    source = make_image_list(tmp_path / "source", N)
    storage = str(tmp_path / "storage")
    # 2 row groups of 8 rows per shard: 19 shards, 38 partitions.
    upload(str(source), "flowers", storage,
           UploadOptions(row_group_rows=8, shard_row_groups=2), progress=False)
    shards = sorted(Path(storage, "flowers").rglob("shard-*.parquet"))
    shards[3].write_bytes(b"not parquet")  # rows 48..63: both of its partitions fail
    with MasterProcess(storage, extra_args=["--max-failures", "2"]) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
        # The readers opt into going on without what no reader can read (by default the pass
        # raises LostRecordsError at its end: tests/integration/test_lost_partitions.py).
        wait_all([start_reader(out, env, "--epochs", "2", "--delay", "0.02",
                               "--lost-partitions", "skip") for out in outs])
        with MasterClient(master.address) as client:
            status = client.job_status("train")
    per_epoch = delivered(outs, file_digests(source))
    # Consecutive epochs from 0 (a reader that finds an epoch already done joins the next).
    assert sorted(per_epoch) == list(range(len(per_epoch))) and len(per_epoch) >= 2
    for counts in per_epoch.values():
        assert counts == Counter(set(range(N)) - set(range(48, 64)))
    assert status.failed == 2 and len(status.failed_reasons) == 2
    assert all("shard-00003.parquet" in r or "Parquet" in r for r in status.failed_reasons), \
        status.failed_reasons


@pytest.mark.slow
def test_a_sigtermed_reader_hands_its_tasks_back_at_once(dataset: tuple[str, Path],
                                                         tmp_path: Path) -> None:
    storage, source = dataset
    # A lease timeout far beyond the test's patience: only a hand-back can free the victim's tasks.
    with MasterProcess(storage, extra_args=["--lease-timeout", "600"]) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        victim_out, survivor_out = tmp_path / "victim.jsonl", tmp_path / "survivor.jsonl"
        victim = start_reader(victim_out, env, "--delay", "0.3")
        # It still dies of SIGTERM, as supervisors expect.
        assert signal_after(victim, victim_out, 2, signal.SIGTERM) == -signal.SIGTERM
        wait_all([start_reader(survivor_out, env)])
        log = "".join(master.log)
    counts = delivered([victim_out, survivor_out], file_digests(source))[0]
    assert set(counts) == set(range(N))
    assert "task(s) back to todo" in log
    repeated = [rid for rid, n in counts.items() if n > 1]
    assert len(repeated) <= 3 * 8  # the batch that was in the victim's hands


@pytest.mark.slow
def test_a_crash_repeats_only_records_in_flight_not_the_partition(tmp_path: Path) -> None:
    # Partitions of 100 records consumed at ~40 records/s: the victim dies ~2 s into its first
    # partition. Progress reaches the master at least every PROGRESS_INTERVAL_S (1 s), so the
    # survivor resumes that partition after what the victim's trainer already consumed.
    source = make_image_list(tmp_path / "source", N)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=100), progress=False)
    with MasterProcess(storage, extra_args=["--lease-timeout", "2"]) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        victim_out, survivor_out = tmp_path / "victim.jsonl", tmp_path / "survivor.jsonl"
        # ~40 records/s on an idle machine, slower as the load slows its reporter: the records
        # it consumes while its progress report is late stay as few as the bound says.
        victim = start_reader(victim_out, env, "--batch", "4", "--delay", f"{0.1 * slowdown():.3f}")
        signal_after(victim, victim_out, 20, signal.SIGKILL)  # 80 records of its first partition
        wait_all([start_reader(survivor_out, env)])
    counts = delivered([victim_out, survivor_out], file_digests(source))[0]
    assert set(counts) == set(range(N))
    repeated = sum(n - 1 for n in counts.values())
    print(f"records delivered twice after the SIGKILL: {repeated} (the victim had 80)")
    # The bound: records consumed since the last progress report (≤ 1 s at ~40/s, or fewer than
    # PROGRESS_MIN_RECORDS, whichever is more) plus the batch in the trainer's hands (4) — not
    # the whole 100-record partition.
    assert repeated <= max(40, PROGRESS_MIN_RECORDS - 1) + 4 + 4


@pytest.mark.slow
def test_pipeline_readers_split_decoded_shuffled_epochs_exactly_once(
        dataset: tuple[str, Path], tmp_path: Path) -> None:
    storage, source = dataset
    labels = {rid: label for rid, (_, label) in file_digests(source).items()}
    classes = sorted(set(labels.values()))
    with MasterProcess(storage) as master:
        env = {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": ""}
        outs = [tmp_path / f"pipeline{i}.jsonl" for i in range(2)]
        # Started together (the start barrier): beside stress-ng --cpu 8 --io 2 --vm 2, one
        # reader started so late that the other read epochs 0 and 1 alone, and the late one
        # epochs 2 and 3 (issue 38).
        args = ("--mode", "pipeline", "--epochs", "2", "--batch", "16", "--delay", "0.02")
        wait_all(start_together([(out, args) for out in outs], env))
    per_epoch: dict[int, Counter] = {}
    for out in outs:
        for line in lines(out):
            if line.get("end"):
                continue
            for rid, class_id in zip(line["ids"], line["class_ids"]):
                assert classes[class_id] == labels[rid]
            per_epoch.setdefault(line["epoch"], Counter()).update(line["ids"])
    assert sorted(per_epoch) == [0, 1]
    for epoch, counts in per_epoch.items():
        assert set(counts) == set(range(N)) and max(counts.values()) == 1, epoch
    for out in outs:  # each reader: two passes, of consecutive epochs
        ends = {l["pass"]: l["epoch"] for l in lines(out) if l.get("end")}
        assert sorted(ends) == [0, 1] and ends[1] == ends[0] + 1, ends
    assert all(any(not l.get("end") for l in lines(out)) for out in outs)  # both got work
