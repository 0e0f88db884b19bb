"""Stalls and outages (issue 14), with real master and reader processes, counting every record id
delivered:
- a reader frozen (SIGSTOP) past its lease, then continued, delivers nothing that another reader
  delivered: it learns that its leases were taken away and drops their undelivered records;
- the master frozen for 15 s (longer than a call's deadline; longer on a loaded machine): every
  reader finishes, every record exactly once;
- the master killed and restarted several times with no reader killed: 0 duplicates, 0 missing;
- the same with one reader killed too: duplicates within the README's bound.
"""
from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from machine_load import hang_bound, latency_bound
from sample_data import file_digests, make_image_list
from test_chaos import wait_for
from test_master_metrics import scrape, value
from test_master_restart import free_port
from test_multiprocess import delivered, lines, signal_after, start_reader

from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

N = 480  # records
ROWS = 8  # records per row group, hence per partition (60 partitions)
BATCH = 16  # reader_worker.py's default --batch
PREFETCH = 2
# Short leases: a frozen reader loses them fast, and a stall outlasts them. On an idle machine;
# `lease_s()` scales them to the load: a live reader not heard from for a lease timeout loses its
# leases too, and one starved of CPU that long with a batch in hand-over delivers rows another
# reader delivers again (bounded, not zero: see the README), which these tests count.
LEASE_S = 2
FINISH_S = 90  # readers get this long (scaled to the load) to end after the last disturbance
# The README's bound ("Workers may come and go"): a reader that dies repeats at most the records
# of the partitions it held leases on: its prefetch window, the partitions of the batch in its
# trainer's hands (a batch of BATCH rows spans at most BATCH // ROWS + 1 partitions) and one whose
# DONE report is on its way. Readers that stay alive repeat nothing, whatever the master does.
DUPLICATES_PER_KILLED_READER = (PREFETCH + BATCH // ROWS + 2) * ROWS  # 48 records


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[str, Path]:
    source = make_image_list(tmp_path / "source", N)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=ROWS), progress=False)
    return storage, source


def lease_s(seconds: float = LEASE_S) -> float:
    """A lease timeout of `seconds` on an idle machine, scaled to the load now."""
    return latency_bound(seconds)


def reader_env(master: MasterProcess) -> dict[str, str]:
    # Readers give up on a master unreachable this long: longer than any outage here (3 lease
    # timeouts, scaled like them).
    return {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": "train", "TRAIN_LOCAL": "",
            "TRAINFEED_MASTER_GIVE_UP_S": f"{hang_bound(60):.0f}"}


def finish(readers: list[subprocess.Popen[bytes]], master: MasterProcess) -> list[int]:
    deadline = time.monotonic() + hang_bound(FINISH_S)
    for r in readers:
        try:
            r.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"a reader hangs; master log:\n{''.join(master.log[-30:])}")
    return [r.returncode for r in readers]


def repeats(outs: list[Path], source: Path, epochs: int) -> int:
    """Checks that every epoch delivered every record; returns how many deliveries repeated."""
    per_epoch = delivered(outs, file_digests(source))
    # Epochs are consecutive from 0; a reader that fell behind (frozen) may find that the others
    # finished an epoch, and read one more on its own: elastic, not an error.
    assert sorted(per_epoch) == list(range(len(per_epoch))) and len(per_epoch) >= epochs, \
        sorted(per_epoch)
    repeated = 0
    for epoch, counts in sorted(per_epoch.items()):
        assert set(counts) == set(range(N)), f"epoch {epoch} lost {set(range(N)) - set(counts)}"
        repeated += sum(n - 1 for n in counts.values())
        print(f"epoch {epoch}: {sum(n - 1 for n in counts.values())} deliveries repeated")
    return repeated


@pytest.mark.timeout(240)
def test_a_reader_frozen_past_its_lease_delivers_nothing_another_reader_delivered(
        dataset: tuple[str, Path], tmp_path: Path) -> None:
    storage, source = dataset
    outs = [tmp_path / f"reader{i}.jsonl" for i in range(3)]
    lease = lease_s()
    with MasterProcess(storage, extra_args=["--lease-timeout", f"{lease:.1f}"]) as master:
        # The victim trains fast, the others slowly: the epoch it was frozen in goes on after
        # it continues, so it has the chance to deliver what the others took over. (Slowly
        # against the freeze: 0.5 s a batch for a 2 s lease, scaled with it. With the lease
        # scaled alone, beside stress-ng they read both epochs while it was frozen.)
        slow = f"{0.5 * lease / LEASE_S:.2f}"
        args = ("--epochs", "2", "--prefetch", str(PREFETCH))
        readers = [start_reader(out, reader_env(master), *args, "--delay", delay)
                   for out, delay in zip(outs, ("0.1", slow, slow))]
        try:
            wait_for(lambda: len(lines(outs[0])) >= 3, "the first reader's third batch",
                     hang_bound(60))
            readers[0].send_signal(signal.SIGSTOP)
            frozen_epoch = lines(outs[0])[-1]["epoch"]
            time.sleep(2.5 * lease)  # its leases expire; the others take its partitions
            # Really expired before it continues: a master starved of CPU for 2 s takes it for
            # a stall of its own and gives every lease two lease timeouts of grace.
            wait_for(lambda: value(scrape(master), "trainfeed_leases_expired_total",
                                   job="train") > 0, "the frozen reader's leases to expire",
                     hang_bound(60))
            # What its trainer got from now on came after the freeze. (Counting the lines
            # written at the SIGSTOP instead counted a batch the trainer got just before it but
            # wrote after it as one delivered after the freeze.)
            continued_at = time.time()
            readers[0].send_signal(signal.SIGCONT)
            assert finish(readers, master) == [0, 0, 0]
        finally:
            for r in readers:
                if r.poll() is None:
                    r.send_signal(signal.SIGCONT)
                    r.kill()
    others = Counter((line["epoch"], i) for out in outs[1:] for line in lines(out)
                     if not line.get("end") for i in line["ids"])
    # What its trainer asked for after it continued. A batch asked for before the SIGSTOP and
    # got after the SIGCONT is the one in hand-over at the freeze: if its leases were checked
    # before the freeze (while they were sure to live) it was delivered then, and the trainer
    # is merely late to take it (CI, under load: 16 records of two partitions). If checked
    # after, a lost lease's rows were dropped: nothing after it shows.
    after = [(line["epoch"], i) for line in lines(outs[0])
             if not line.get("end") and line["asked"] >= continued_at for i in line["ids"]]
    twice = [key for key in after if others[key]]
    print(f"\nafter its freeze the frozen reader delivered {len(after)} records "
          f"({sum(e == frozen_epoch for e, _ in after)} in the epoch it was frozen in), "
          f"{len(twice)} of them delivered by another reader too")
    assert after and not twice, twice
    # Overall: nothing lost, and only what it handed over before the freeze but had not yet
    # reported can repeat (at most what a reader killed then would repeat).
    assert repeats(outs, source, 2) <= DUPLICATES_PER_KILLED_READER


@pytest.mark.timeout(240)
def test_readers_ride_through_a_master_stopped_longer_than_a_call_deadline(
        dataset: tuple[str, Path], tmp_path: Path) -> None:
    storage, source = dataset
    outs = [tmp_path / f"reader{i}.jsonl" for i in range(3)]
    # A 5 s lease (not LEASE_S; scaled to the load): a reader starved of CPU for 2 s by a loaded
    # CI machine does not lose a lease for reasons that have nothing to do with the stall (which
    # would allow bounded, not zero, repeats). The stall outlasts it three times over.
    lease = lease_s(5)
    with MasterProcess(storage, extra_args=["--lease-timeout", f"{lease:.1f}"]) as master:
        args = ("--epochs", "2", "--delay", "0.1", "--prefetch", str(PREFETCH))
        readers = [start_reader(out, reader_env(master), *args) for out in outs]
        try:
            wait_for(lambda: all(len(lines(out)) >= 2 for out in outs), "every reader's batches",
                     hang_bound(60))
            master.proc.send_signal(signal.SIGSTOP)
            # 15 s on an idle machine: > the client's per-call deadline (10 s, plus a
            # long-poll's 2 s) and 3 lease timeouts.
            time.sleep(3 * lease)
            master.proc.send_signal(signal.SIGCONT)
            codes = finish(readers, master)
        finally:
            master.proc.send_signal(signal.SIGCONT)
            for r in readers:
                if r.poll() is None:
                    r.kill()
    assert codes == [0, 0, 0], "".join(master.log[-30:])
    assert "did not run for" in "".join(master.log)  # the stall was noticed: leases got grace
    assert repeats(outs, source, 2) == 0


def run_with_master_restarts(storage: str, state: str, outs: list[Path], restarts: int,
                             kill_reader: bool) -> None:
    """Three readers (a fourth replaces a killed one) through `restarts` master SIGKILLs, each
    followed by a restart on the same port and state."""
    port = free_port()
    lease = lease_s()
    master_args = ["--lease-timeout", f"{lease:.1f}"]
    master = MasterProcess(storage, state=state, port=port, extra_args=master_args)
    env = reader_env(master)
    args = ("--epochs", "2", "--delay", "0.15", "--prefetch", str(PREFETCH))
    readers = [start_reader(out, env, *args) for out in outs[:3]]
    try:
        wait_for(lambda: all(len(lines(out)) >= 2 for out in outs[:3]), "every reader's batches",
                 hang_bound(60))
        if kill_reader:
            assert signal_after(readers[0], outs[0], 3, signal.SIGKILL) == -signal.SIGKILL
            readers.append(start_reader(outs[3], env, *args))
        for k in range(restarts):
            time.sleep(1.5)
            master.kill()
            # Outages short and long: the long ones outlast the leases (before issue 14, live
            # readers reconnected seconds after the master was back and found them expired).
            time.sleep(0.5 if k % 2 else 3 * lease)
            master = MasterProcess(storage, state=state, port=port, extra_args=master_args)
        survivors = readers[1:] if kill_reader else readers
        codes = finish(survivors, master)
        assert codes == [0] * len(survivors), "".join(master.log[-30:])
    finally:
        master.stop()
        for r in readers:
            if r.poll() is None:
                r.kill()
    assert "restored job 'train'" in "".join(master.log)


@pytest.mark.timeout(300)
def test_master_restarts_with_no_reader_killed_repeat_and_lose_nothing(
        dataset: tuple[str, Path], tmp_path: Path) -> None:
    storage, source = dataset
    outs = [tmp_path / f"reader{i}.jsonl" for i in range(3)]
    run_with_master_restarts(storage, f"sqlite:///{tmp_path / 'master.db'}", outs, restarts=4,
                             kill_reader=False)
    assert repeats(outs, source, 2) == 0


@pytest.mark.timeout(300)
def test_master_restarts_and_a_killed_reader_repeat_at_most_what_that_reader_held(
        dataset: tuple[str, Path], tmp_path: Path) -> None:
    storage, source = dataset
    outs = [tmp_path / f"reader{i}.jsonl" for i in range(4)]
    run_with_master_restarts(storage, f"sqlite:///{tmp_path / 'master.db'}", outs, restarts=4,
                             kill_reader=True)
    repeated = repeats(outs, source, 2)
    print(f"repeats: {repeated} (bound {DUPLICATES_PER_KILLED_READER})")
    assert repeated <= 1 * DUPLICATES_PER_KILLED_READER
