"""A training process of a team (issue 13), run as a separate process by tests/integration.

It waits until `--start-at` (a wall-clock time, so that several processes start within a known
spread whatever their import time), reads `--epochs` passes of the dataset the way a training
script does, "trains" `--delay` seconds per batch, and appends one JSON line per batch to
`--out`, flushed at once: {"pass": k, "epoch": e, "ids": [...], "t0": asked, "got": received,
"t1": trained} (wall-clock times: the batch was asked for, arrived, and its step ended), and
{"pass": k, "epoch": e, "end": true, "t": ...} after each pass. With `--go-file` it starts once
that file exists instead (after importing and building its reader: a joiner ready to go), and
`--after-go` seconds later; `--ready` is touched once the reader is built, so that a test can
wait for every process to be ready before it touches the go file (tests/integration/
start_barrier.py: beside stress-ng the imports alone outlast any head start a test could give).

`--sync`: a synchronous rank (`dist.reader(..., sync=True)`; WORLD_SIZE/RANK from the
environment). `--ddp`: also joins a torch.distributed gloo group (MASTER_ADDR/MASTER_PORT, as
torchrun sets them) and all-reduces a tensor after every batch, as DDP does: a rank that ran out
of batches before the others would hang them, which the test would see as a timeout.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from trainfeed import BatchOptions, PipelineOptions, SamplingOptions, SyncOptions, dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of 'training' a batch")
    parser.add_argument("--start-at", type=float, default=0.0, help="wall-clock start time")
    parser.add_argument("--go-file", help="start once this file exists")
    parser.add_argument("--after-go", type=float, default=0.0,
                        help="seconds to wait after the go file appeared")
    parser.add_argument("--ready", help="touch this file once the reader is built")
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--torch", action="store_true", help="iterate reader.as_torch()")
    args = parser.parse_args()

    group: Any = None
    if args.ddp:
        import torch
        import torch.distributed as torch_dist
        torch_dist.init_process_group("gloo")
        group = torch_dist
    reader = dist.reader(args.dataset, pipeline=PipelineOptions(
        batch=BatchOptions(size=args.batch),
        sampling=SamplingOptions(shuffle_buffer=4 * args.batch if args.sync else 0)),
        sync=SyncOptions() if args.sync else None)
    if args.ready:
        open(args.ready, "a").close()
    time.sleep(max(0.0, args.start_at - time.time()))
    if args.go_file:
        while not os.path.exists(args.go_file):
            time.sleep(0.01)
        time.sleep(args.after_go)
    with open(args.out, "a") as out:
        def write(line: dict[str, Any]) -> None:
            out.write(json.dumps(line) + "\n")
            out.flush()

        if args.sync:
            write({"steps_per_epoch": reader.steps_per_epoch,
                   "dropped_per_epoch": reader.dropped_per_epoch})
        for k in range(args.epochs):
            batches = reader.as_torch() if args.torch else reader()
            steps = 0
            t0 = time.time()
            for b in batches:
                got = time.time()
                ids = b["_id"].tolist()
                time.sleep(args.delay)
                if group is not None:
                    total = torch.tensor([float(len(ids))])
                    group.all_reduce(total)  # a rank without a batch would hang here
                    assert int(total.item()) == len(ids) * group.get_world_size(), total
                t1 = time.time()
                write({"pass": k, "epoch": reader.epoch, "ids": ids, "t0": t0, "got": got,
                       "t1": t1})
                t0 = t1
                steps += 1
            write({"pass": k, "epoch": reader.epoch, "end": True, "t": time.time(),
                   "steps": steps})
    reader.close()
    if group is not None:
        group.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
