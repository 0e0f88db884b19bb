"""A reader process for the status page tests: reads batches of 5 through the master named by
TRAINFEED_MASTER (job $TRAINFEED_JOB), "trains" `--train` seconds per batch, with each partition
read slowed by `--throttle` seconds (a reader on slow storage), and after `--batches` batches
prints "paused" and holds still, connected (its session heartbeats) until it is killed."""
from __future__ import annotations

import argparse
import time
from typing import Any

from trainfeed import MasterSource, dist
from trainfeed.io.partition_reader import PartitionReader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--throttle", type=float, default=0.0)
    parser.add_argument("--train", type=float, default=0.0)
    parser.add_argument("--batches", type=int, required=True)
    args = parser.parse_args()
    if args.throttle:
        read = PartitionReader.read

        def slow(self: PartitionReader, *a: Any, **k: Any) -> Any:
            time.sleep(args.throttle)
            return read(self, *a, **k)
        PartitionReader.read = slow  # type: ignore[method-assign]
    reader = dist.reader(args.dataset, source=MasterSource(prefetch_partitions=1))
    handed = 0
    while True:
        for _ in reader.column_batches(5):
            time.sleep(args.train)
            handed += 1
            if handed == args.batches:
                print("paused", flush=True)
                while True:
                    time.sleep(1)


if __name__ == "__main__":
    main()
