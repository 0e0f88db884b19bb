"""A synchronous rank for tests/integration/test_sync_groups.py, run as a separate process.

Modes:
- `rank` (default): one rank as torchrun starts it (WORLD_SIZE/RANK in the environment, and with
  `--gloo` a gloo process group from MASTER_ADDR/MASTER_PORT). It reads `--epochs` passes of
  `dist.reader(DATASET, sync=True)` and appends a JSON line per batch to `--out`
  ({"rank", "epoch", "ids"}), flushed at once; `--hang-before-reader` makes it a rank that never
  arrives (it sleeps instead of reading); `--no-close` exits without closing the reader (the
  README's train.py). On an exception it appends {"error": type, "message",
  "t": wall clock} and exits 3.
- `spawn`: `torch.multiprocessing.spawn` of `--world` processes, each calling
  `init_process_group("gloo", rank=, world_size=)` with no WORLD_SIZE/RANK in the environment
  (issue 26's user), then reading as above into `--out` + its rank.

`--late-releases S`: the reporter sends reports as soon as they are queued, and a Session message
or Report call carrying a RELEASED report (a rank's quota cut inside a partition) is held, once
drained, until the rank's next GetTasks was answered (at most S seconds), as a reporter thread
starved of CPU between the two would be: the next pass's first GetTasks overtakes it.

`--ready FILE --go FILE`: a start barrier just before the reader is built (and the rank joins its
group). The master breaks a group whose rank did not arrive within one lease timeout of the
first; the tests' lease is 3 s, and under load two processes started together finished their
imports more than 3 s apart (CI beside stress-ng: "rank 0 never arrived (3 s after the group's
first rank)"). torchrun's ranks meet in init_process_group before they build readers; this is
that meeting for ranks without a gloo group.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# What a reader through a master imports when it is built (gRPC, the lease session), imported
# now: the ranks meet (`--ready`/`--go`, or gloo's init_process_group) before they build their
# readers, and these imports after the meeting would part them again by their CPU time (0.12 s
# at load 15 on 2 cores; several times that beside stress-ng), against a 3 s lease.
import trainfeed.reader.distributed  # noqa: F401
from trainfeed import BatchOptions, PipelineOptions, SyncOptions, dist


def write(path: str, line: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")


def late_releases(max_s: float, epochs: int) -> None:
    """Holds a Session message or Report call that carries a RELEASED report of an epoch but the
    last (each report once) until a GetTasks was answered after it was drained, or `max_s`
    passed. (Not in the last epoch, which no GetTasks follows: the rank would be silent as long,
    its close waiting for the held report.)"""
    from trainfeed.lease import book, client
    from trainfeed.v1 import master_pb2 as pb

    # The reporter sends what is queued at once, instead of leaving it COALESCE_S for the
    # producer's next call to carry: it is the reporter that drains a cut's RELEASED.
    book.COALESCE_S = 0.0  # type: ignore[misc]
    answered = [0]  # GetTasks calls answered so far
    held: set[tuple[int, int, int]] = set()
    cond = threading.Condition()
    send, report, get_tasks = (client.SessionStream.send, client.MasterClient.report,
                               client.MasterClient.get_tasks)

    def hold(reports: Any) -> None:
        cuts = {(r.epoch, r.partition, r.lease) for r in reports
                if r.outcome == pb.TaskReport.RELEASED and r.epoch < epochs - 1} - held
        if cuts:
            held.update(cuts)
            with cond:
                before = answered[0]
                cond.wait_for(lambda: answered[0] > before, timeout=max_s)

    def late_send(self: Any, message: Any) -> None:
        hold(message.report.reports)
        send(self, message)

    def late_report(self: Any, job: str, worker: str, reports: Any = (), *rest: Any,
                    **kw: Any) -> Any:
        hold(reports)
        return report(self, job, worker, reports, *rest, **kw)

    def counted_get_tasks(self: Any, *args: Any, **kw: Any) -> Any:
        try:
            return get_tasks(self, *args, **kw)
        finally:
            with cond:
                answered[0] += 1
                cond.notify_all()

    client.SessionStream.send = late_send  # type: ignore[method-assign]
    client.MasterClient.report = late_report  # type: ignore[method-assign]
    client.MasterClient.get_tasks = counted_get_tasks  # type: ignore[method-assign]


def read(args: argparse.Namespace, out: str, rank: int | None) -> None:
    if args.ready is not None:
        # Imported here: runpy runs this file from elsewhere (torchrun's test).
        from start_barrier import wait_for_go

        wait_for_go(args.ready, args.go)
    if args.late_releases:
        late_releases(args.late_releases, args.epochs)
    reader = dist.reader(args.dataset,
                         pipeline=PipelineOptions(batch=BatchOptions(size=args.batch)),
                         sync=SyncOptions())
    try:
        for _ in range(args.epochs):
            for batch in reader():
                write(out, {"rank": rank, "epoch": reader.epoch, "ids": batch["_id"].tolist(),
                            "t": time.time()})
                time.sleep(args.delay)
    finally:
        if not args.no_close:
            reader.close()


def rank_main(args: argparse.Namespace) -> int:
    torch_dist: Any = None
    if args.gloo:
        import torch.distributed as torch_dist
        torch_dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "-1"))
    out = args.out + (str(rank) if args.per_rank else "")
    try:
        if args.hang_before_reader:
            time.sleep(3600)
        read(args, out, rank)
    except Exception as e:
        write(out, {"rank": rank, "error": type(e).__name__, "message": str(e),
                    "t": time.time(), "trace": traceback.format_exc()[-2000:]})
        return 3
    finally:
        if torch_dist is not None and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
    return 0


def spawned(rank: int, args: argparse.Namespace) -> None:
    import torch.distributed as torch_dist
    torch_dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                  rank=rank, world_size=args.world)
    try:
        read(args, f"{args.out}{rank}", rank)
    finally:
        torch_dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="rank", choices=("rank", "spawn"))
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--gloo", action="store_true")
    parser.add_argument("--per-rank", action="store_true", help="--out + RANK")
    parser.add_argument("--hang-before-reader", action="store_true")
    # Exits without closing its reader, as the README's train.py does: the master hears no
    # LeaveJob, only silence after the last epoch.
    parser.add_argument("--no-close", action="store_true")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--late-releases", type=float, default=0.0)
    parser.add_argument("--ready", type=Path, help="touch this file before building the reader")
    parser.add_argument("--go", type=Path, help="then wait for this file")
    args = parser.parse_args()
    if args.mode == "spawn":
        import torch.multiprocessing as mp
        mp.spawn(spawned, args=(args,), nprocs=args.world, join=True)
        return 0
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
