"""A training-script stand-in run as a separate process by the multi-process tests.

It reads `--epochs` passes of a dataset through `trainfeed.dist.reader` exactly as a user's
script would (the environment decides: TRAINFEED_MASTER, or TRAIN_LOCAL=1) and appends one JSON
line per batch to `--out`, flushed at once, so that a test can count every delivered record even
of a reader it SIGKILLs. Lines: {"pass": k, "epoch": e, "ids": [...], "sha": [...], "labels": [...],
"asked": t, "received": t} (ids are null in the tuple mode, where the Paddle-style tuples carry no
id; the times are when the trainer asked for the batch and when it got it).

Checkpoints: with `--checkpoint-after K` it saves `reader.state_dict()` to `--state-file`
(atomically) after its K-th batch and then writes {"checkpoint": true}; `--resume FILE` restores
such a state.

Start barrier: with `--ready FILE --go FILE` it touches `--ready` once it holds its first batch
and then waits for `--go` to appear. A reader with a batch of epoch 0 in hand holds a lease of it,
so epoch 0 cannot complete without it: readers started together really share their epochs even
on a loaded machine, where one process may be scheduled seconds after another (CI, beside
stress-ng: one reader read a whole epoch before the other read its first batch).

Hold: with `--hold-after K --hold FILE` it waits for FILE to appear after its K-th batch (and
its step), so that a test can let another reader go on first, however the load schedules them.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from start_barrier import wait_for_go

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    SamplingOptions,
    batch,
    dist,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--mode", choices=["columns", "tuples", "pipeline"], default="columns",
                        help="pipeline: decoded float32 images, class ids, a shuffle buffer "
                             "(lines hold ids and class ids, no sha)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of 'training' per batch")
    parser.add_argument("--prefetch", type=int, default=None, help="partitions loaded ahead")
    parser.add_argument("--lost-partitions", choices=["raise", "skip"], default="raise",
                        help="what a pass does about partitions no reader could read")
    parser.add_argument("--checkpoint-after", type=int, default=0, metavar="K")
    parser.add_argument("--state-file")
    parser.add_argument("--resume", metavar="FILE", help="a saved reader.state_dict() to continue")
    parser.add_argument("--ready", type=Path, help="touch this file once holding a first batch")
    parser.add_argument("--go", type=Path, help="then wait for this file before reading on")
    parser.add_argument("--hold-after", type=int, default=0, metavar="K",
                        help="after the K-th batch, wait for --hold to appear")
    parser.add_argument("--hold", type=Path)
    args = parser.parse_args()

    state = None
    if args.resume:
        with open(args.resume) as f:
            state = json.load(f)
    pipeline = None if args.mode != "pipeline" else PipelineOptions(
        decode=DecodeOptions(True, image_size=(16, 16), normalizing_const=255.0),
        batch=BatchOptions(size=args.batch),
        sampling=SamplingOptions(shuffle_buffer=4 * args.batch))
    # The environment decides, as a training script's would.
    source = (LocalSource(prefetch_partitions=args.prefetch) if dist.train_local() else
              MasterSource(prefetch_partitions=args.prefetch,
                           lost_partitions=args.lost_partitions))
    reader = dist.reader(args.dataset, source=source, pipeline=pipeline, state=state)
    handed = 0
    with open(args.out, "a") as out:
        for k in range(args.epochs):
            batches = reader if args.mode == "pipeline" else batch(
                reader, args.batch, columnar=args.mode == "columns")
            stream = iter(batches())
            while True:
                # When the trainer asked for the batch and when it got it (a test compares them
                # with the signals it sends).
                asked = time.time()
                b = next(stream, None)
                if b is None:
                    break
                received = time.time()
                if args.ready is not None and not args.ready.exists():
                    wait_for_go(args.ready, args.go)
                if args.mode == "pipeline":
                    assert b["image"].shape[1:] == (16, 16, 3), b["image"].shape
                    line = {"pass": k, "epoch": reader.epoch, "ids": b["_id"].tolist(),
                            "class_ids": b["label"].tolist(), "asked": asked,
                            "received": received}
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    time.sleep(args.delay)
                    continue
                if args.mode == "columns":
                    ids, images, labels = b["_id"].tolist(), b["image"], b["label"]
                else:
                    ids, images, labels = None, [i for i, _ in b], [l for _, l in b]
                line = {"pass": k, "epoch": reader.epoch, "ids": ids, "labels": labels,
                        "sha": [hashlib.sha256(x).hexdigest() for x in images],
                        "asked": asked, "received": received}
                out.write(json.dumps(line) + "\n")
                out.flush()
                time.sleep(args.delay)
                handed += 1
                if handed == args.checkpoint_after:
                    with open(args.state_file + ".tmp", "w") as f:
                        json.dump(reader.state_dict(), f)
                    os.replace(args.state_file + ".tmp", args.state_file)
                    out.write(json.dumps({"checkpoint": True}) + "\n")
                    out.flush()
                if handed == args.hold_after:
                    wait_for_go(args.hold.with_suffix(".held"), args.hold)
            out.write(json.dumps({"pass": k, "epoch": reader.epoch, "end": True}) + "\n")
            out.flush()
    reader.close()


if __name__ == "__main__":
    sys.exit(main())
