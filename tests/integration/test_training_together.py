"""Issue 13: readers of one job train together. Real processes: a master, and reader processes
(tests/integration/team_worker.py) that count every record id they get.

- epochs line up (pass k is epoch k for every reader) and are split fairly between readers that
  start within a second of each other;
- a reader joining mid-epoch gets records of that epoch at once;
- work stealing: readers of unequal speed finish an epoch near the ideal time, nothing twice;
- synchronous ranks (sync=True) take the same number of full batches per epoch, through the
  master and with TRAIN_LOCAL, under a real gloo all-reduce (torchrun's environment).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from integration.decoding import DECODER_TOKEN
from integration.services import free_port
from machine_load import hang_bound, latency_bound, slowdown
from optional import require
from start_barrier import release_when_ready
from test_multiprocess import lines

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    MasterSource,
    PipelineOptions,
    SyncOptions,
    dist,
)
from trainfeed.decoder.process import DecoderProcess
from trainfeed.lease.client import MasterClient
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload

pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORKER = str(Path(__file__).with_name("team_worker.py"))
RECORDS = 3000
# A bound against a hang, on an idle machine (scaled to the load where it is used).
TIMEOUT_S = 180


@pytest.fixture
def team_storage(tmp_path: Path) -> str:
    """3,000 text records in row groups of 25: 120 partitions, 40 per reader of a team of 3
    (what `upload --rows-per-group` gives a small dataset)."""
    listing = tmp_path / "team.list"
    listing.write_text("".join(f"sentence {i}\tclass{i % 3}\n" for i in range(RECORDS)))
    storage = str(tmp_path / "storage")
    upload(str(listing), "team", storage, UploadOptions(kind="text", row_group_rows=25),
           progress=False)
    return storage


@pytest.fixture
def team_master(team_storage: str) -> Any:
    with MasterProcess(team_storage) as master:
        yield master


def start(out: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, WORKER, "--dataset", "team", "--out", str(out),
                             *args], env={**os.environ, **env})


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + hang_bound(timeout)
    try:
        for p in procs:
            assert p.wait(max(1.0, deadline - time.monotonic())) == 0, \
                f"reader exited with {p.returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def step_s(idle_s: float) -> float:
    """A training step of `idle_s` on an idle machine, as long as the machine's load makes the
    readers' own work (imports, calls, parsing: CPU that a loaded machine gives slowly) per
    step: the tests below compare the readers' shares and waits, which then keep the proportions
    they have on an idle machine (tests/machine_load.py). Unscaled, a reader that cannot run
    for a few seconds under load gets less than its share of a 6 s epoch, or joins it after
    the others ended it."""
    return idle_s * slowdown()


def start_ready(runs: list[tuple[Path, tuple[str, ...]]], env: dict[str, str],
                go: Path) -> list[subprocess.Popen[bytes]]:
    """Starts one reader per (out, args), each waiting for `go` once its reader is built;
    touches `go` once every one of them is: their imports (tens of seconds under load) do not
    decide who starts first."""
    ready = [out.with_suffix(".ready") for out, _ in runs]
    procs = [start(out, env, *args, "--ready", str(flag), "--go-file", str(go))
             for (out, args), flag in zip(runs, ready)]
    release_when_ready(procs, ready, go, TIMEOUT_S)
    return procs


def batches(path: Path) -> list[dict[str, Any]]:
    return [line for line in lines(path) if "ids" in line]


def master_env(master: MasterProcess, job: str) -> dict[str, str]:
    return {"TRAINFEED_MASTER": master.address, "TRAINFEED_JOB": job, "TRAIN_LOCAL": ""}


def per_epoch(outs: list[Path]) -> dict[int, list[Counter[int]]]:
    """Epoch -> per reader, how often it got each id."""
    seen: dict[int, list[Counter[int]]] = defaultdict(lambda: [Counter() for _ in outs])
    for r, out in enumerate(outs):
        for b in batches(out):
            seen[b["epoch"]][r].update(b["ids"])
    return seen


def assert_exactly_once(seen: dict[int, list[Counter[int]]], epochs: int) -> None:
    assert sorted(seen) == list(range(epochs))
    for epoch, counters in seen.items():
        total = sum(counters, Counter())
        assert sorted(total) == list(range(RECORDS)), f"epoch {epoch}: records missing"
        assert max(total.values()) == 1, f"epoch {epoch}: {total.most_common(3)} twice"


@pytest.mark.timing
def test_three_readers_started_together_share_every_epoch_and_line_up(
        team_master: MasterProcess, tmp_path: Path) -> None:
    outs = [tmp_path / f"r{i}.jsonl" for i in range(3)]
    # ~170 records/s each (idle): an epoch takes ~6 s, the third reader starts 1 s after the
    # first, counted from when all three are ready (their imports done, whatever the load).
    procs = start_ready([(out, ("--epochs", "3", "--batch", "50", "--delay", f"{step_s(0.3):.3f}",
                                "--after-go", str(0.5 * i)))
                         for i, out in enumerate(outs)],
                        master_env(team_master, "together"), tmp_path / "go")
    wait_all(procs)
    seen = per_epoch(outs)
    assert_exactly_once(seen, 3)
    for epoch, counters in seen.items():
        shares = [sum(c.values()) / RECORDS for c in counters]
        assert min(shares) >= 0.2, f"epoch {epoch}: shares {shares}"
    for out in outs:  # pass k is epoch k, for every reader
        ends = [line for line in lines(out) if line.get("end")]
        assert [(e["pass"], e["epoch"]) for e in ends] == [(0, 0), (1, 1), (2, 2)]
        for b in batches(out):
            assert b["pass"] == b["epoch"]


@pytest.mark.timing
def test_a_reader_joining_mid_epoch_gets_records_of_it_within_two_seconds(
        team_master: MasterProcess, tmp_path: Path) -> None:
    outs = [tmp_path / f"r{i}.jsonl" for i in range(3)]
    env = master_env(team_master, "join")
    # The half epoch left when the newcomer joins lasts ~4.5 s idle, as long as the load makes
    # the newcomer's 2 s (both scaled alike): else under load the others could end the epoch
    # before the newcomer got anything, and it would read epoch 1.
    args = ("--batch", "25", "--delay", f"{step_s(0.15):.3f}")
    go, late_go = tmp_path / "go", tmp_path / "late-go"
    readies = [out.with_suffix(".ready") for out in outs]
    procs = [start(out, env, *args, "--ready", str(flag), "--go-file", str(g))
             for out, flag, g in zip(outs, readies, (go, go, late_go))]
    first, late = procs[:2], procs[2:]
    try:
        # The first two start once all three are built: the newcomer is ready to go when it
        # joins, however long the load made its imports.
        release_when_ready(procs, readies, go, TIMEOUT_S)
        with MasterClient(team_master.address) as client:
            deadline = time.monotonic() + hang_bound(90)
            while time.monotonic() < deadline:
                status = client.job_status("join") if batches(outs[0]) else None
                if status is not None and status.done >= status.num_partitions // 2:
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the epoch never reached half way")
        # 2 s with a core to itself; scaled when the machine is busier (tests/machine_load.py).
        bound = latency_bound(2.0)
        late_go.touch()
        # The newcomer starts when its go file appears (not when this process, maybe scheduled
        # late, reads the clock after touching it).
        joined = late_go.stat().st_mtime
        wait_all(first + late)
    finally:
        for p in first + late:
            if p.poll() is None:
                p.kill()
    newcomer = batches(outs[2])
    assert newcomer, "the reader that joined got nothing of the epoch"
    assert newcomer[0]["epoch"] == 0
    waited = newcomer[0]["got"] - joined
    assert waited <= bound, f"the newcomer's first batch came {waited:.2f} s after it joined"
    assert_exactly_once(per_epoch(outs), 1)


@pytest.mark.timing
def test_work_stealing_finishes_readers_of_unequal_speed_near_the_ideal_time(
        team_master: MasterProcess, tmp_path: Path) -> None:
    """Speeds 1x, 1x and 1/3x: the epoch takes within 10 % of records / sum of the rates, and
    no record comes twice (a partition given back is dropped by its first holder).

    A reader's rate is what its training steps take (records / seconds in its steps, measured:
    on a shared machine a step takes longer than its sleep), so the ideal is the epoch with no
    reader ever waiting for input; the epoch runs from its first batch to its last step's end."""
    outs = [tmp_path / f"r{i}.jsonl" for i in range(3)]
    env = master_env(team_master, "steal")
    # Idle: 125 records/s; the slow one 42: the ideal epoch is 10.3 s (longer under load).
    batch, fast = 10, step_s(0.08)
    delays = [fast, fast, 3 * fast]
    # All three start together once built: a reader the load let start late would make the
    # epoch longer than the ideal, which assumes all three read from its start.
    procs = start_ready([(out, ("--epochs", "2", "--batch", str(batch), "--delay", f"{delay:.3f}"))
                         for out, delay in zip(outs, delays)], env, tmp_path / "go")
    wait_all(procs)
    seen = per_epoch(outs)
    assert_exactly_once(seen, 2)
    for epoch in (0, 1):
        mine = [[b for b in batches(out) if b["epoch"] == epoch] for out in outs]
        rates = [sum(len(b["ids"]) for b in bs) / sum(b["t1"] - b["got"] for b in bs)
                 for bs in mine]
        ideal = RECORDS / sum(rates)
        took = (max(b["t1"] for bs in mine for b in bs)
                - min(b["got"] for bs in mine for b in bs))
        assert took <= 1.1 * ideal, f"epoch {epoch}: {took:.2f} s, ideal {ideal:.2f} s"
    slow_share = sum(sum(c.values()) for c in [seen[e][2] for e in (0, 1)]) / (2 * RECORDS)
    assert slow_share < 0.25, slow_share  # a third of a fast reader's rate: 1/7 of the records


def check_sync(outs: list[Path], epochs: int, batch: int) -> None:
    """Every rank: the same steps per epoch, each a full batch; no record twice in an epoch;
    fewer than world_size × batch records dropped."""
    world = len(outs)
    heads = [lines(out)[0] for out in outs]
    steps = heads[0]["steps_per_epoch"]
    dropped = heads[0]["dropped_per_epoch"]
    assert all(h == heads[0] for h in heads)
    assert steps == RECORDS // (world * batch) and 0 <= dropped < world * batch
    assert dropped == RECORDS - steps * world * batch
    for epoch in range(epochs):
        total: Counter[int] = Counter()
        for out in outs:
            mine = [b for b in batches(out) if b["pass"] == epoch]
            assert len(mine) == steps and all(len(b["ids"]) == batch for b in mine)
            assert {b["epoch"] for b in mine} == {epoch}
            total.update(i for b in mine for i in b["ids"])
        assert max(total.values()) == 1, total.most_common(3)
        assert len(total) == RECORDS - dropped


@pytest.mark.parametrize("where", ["master", "local"])
def test_ddp_ranks_take_the_same_steps_under_a_real_all_reduce(
        where: str, team_storage: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """3 gloo ranks (torchrun's environment), one 3x slower, an all-reduce every step."""
    require("torch")
    outs = [tmp_path / f"rank{i}.jsonl" for i in range(3)]
    if where == "master":
        master = request.getfixturevalue("team_master")
        env = master_env(master, "ddp")
    else:
        env = {"TRAIN_LOCAL": "1", "TRAINFEED_STORAGE": team_storage}
    port = str(free_port())
    batch = 32  # 3,000 // 96 = 31 steps, 24 records dropped
    procs = [start(out, {**env, "WORLD_SIZE": "3", "RANK": str(rank), "LOCAL_RANK": str(rank),
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                   "--sync", "--ddp", "--torch", "--epochs", "2", "--batch", str(batch),
                   "--delay", str(0.03 if rank == 2 else 0.01))
             for rank, out in enumerate(outs)]
    wait_all(procs)
    check_sync(outs, 2, batch)


def test_sync_ranks_under_torchrun(team_master: MasterProcess, tmp_path: Path) -> None:
    """The same script started by torchrun itself (3 processes, standalone rendezvous)."""
    require("torch")
    out = tmp_path / "rank.jsonl"
    env = {**os.environ, **master_env(team_master, "torchrun")}
    # Each rank writes its own file: torchrun gives every process the same command line.
    script = tmp_path / "per_rank.py"
    script.write_text(
        "import os, runpy, sys\n"
        f"sys.argv = [{WORKER!r}, '--dataset', 'team', '--out', "
        f"{str(out)!r} + os.environ['RANK'], '--sync', '--ddp', '--epochs', '2', "
        "'--batch', '50']\n"
        f"runpy.run_path({WORKER!r}, run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "3", str(script)], env=env,
                          timeout=hang_bound(TIMEOUT_S), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_sync([Path(f"{out}{rank}") for rank in range(3)], 2, 50)


def _ids(batches: Any) -> list[int]:
    return [i for b in batches for i in b["_id"].tolist()]


# The sync-group restore below, over how its records are decoded: not at all (the records as
# stored), by the trainer itself, or by `trainfeed decoder` processes (issue 37).
DECODED = {"none": PipelineOptions(batch=BatchOptions(size=10)),
           "local": PipelineOptions(batch=BatchOptions(size=10),
                                    decode=DecodeOptions(True, image_size=(8, 8))),
           "remote": PipelineOptions(batch=BatchOptions(size=10),
                                     decode=DecodeOptions(True, image_size=(8, 8)))}


@pytest.mark.parametrize("decode", sorted(DECODED))
def test_a_synchronous_group_restores_mid_epoch_and_changes_size_at_a_boundary(
        storage: str, decode: str, remote: Any) -> None:
    """2 ranks (run one after the other: nothing here all-reduces) checkpoint after 2 batches,
    crash, and are restored from their state_dict(): the epoch's 100 records come exactly once.
    Then, from states saved at the end of epoch 1, a group of 1 reads epoch 2 whole."""
    with contextlib.ExitStack() as stack:
        master = stack.enter_context(MasterProcess(storage))
        if decode == "remote":
            decoders = [stack.enter_context(DecoderProcess(storage, DECODER_TOKEN))
                        for _ in range(2)]
            remote(*(d.address for d in decoders))
        job = f"sync-{uuid.uuid4().hex[:8]}"

        def rank(r: int, world: int = 2, state: dict[str, Any] | None = None) -> Any:
            reader = dist.reader("flowers", source=MasterSource(master.address, job=job),
                                 pipeline=DECODED[decode],
                                 sync=SyncOptions(world_size=world, rank=r), state=state)
            stack.callback(reader.close)  # (before the master stops: nothing retries it)
            assert (reader._pipeline.remote is not None) == (decode == "remote")
            return reader

        readers = [rank(0), rank(1)]
        iters = [iter(reader()) for reader in readers]
        before = [_ids(itertools.islice(it, 2)) for it in iters]
        states = [reader.state_dict() for reader in readers]
        _ids(itertools.islice(iters[0], 1))  # consumed after the checkpoint: lost with the model
        for reader in readers:  # killed: the master hears nothing more
            reader._backend.client.close()
            reader.close()  # its pass's threads end with it, as with the process
        restored = [rank(r, state=states[r]) for r in range(2)]
        after = [_ids(reader()) for reader in restored]
        assert [len(b) + len(a) for b, a in zip(before, after)] == [50, 50]
        assert sorted(i for ids in before + after for i in ids) == list(range(100))
        # Epoch 1 by the same group, its states saved at the end; then a group of one.
        assert all(len(_ids(reader())) == 50 for reader in restored)
        ends = [reader.state_dict() for reader in restored]
        for reader in restored:
            reader.close()
        alone = rank(0, world=1, state=ends[0])
        assert alone.steps_per_epoch == 10
        epoch2 = _ids(alone())
        assert alone.epoch == 2 and sorted(epoch2) == list(range(100))
        alone.close()
