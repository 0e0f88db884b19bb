"""What bounds the 256-px train read: the same read with parts of it taken away (issue 39, the
"≥ 1.9 of 2 cores" target).

The reader runs its stages on threads of one process, so they share one GIL: partition loads,
the shuffle window's cut, two converters, the decode threads. Profiles say who holds the GIL
(benchmarks/reader_threads.py, py-spy) and who waits (benchmarks/offcpu.py); this says what
the read would reach without a part, which a profile cannot. Each variant runs in a child
process of its own, the variants interleaved round by round, on the train workload of
benchmarks/imagenet_methods.py (RandomResizedCrop 224 + flip, uint8, batches of 256, shuffle
buffer 1,024), and reports images/s, the cores busy, the CPU per image and the foreign load
(benchmarks/decode_in_processes.py's window).

A variant is `shipped` (the reader as it is) or `+`-joined changes to it:

- `one-load-thread`: partitions loaded on one thread, as before trainfeed.io.loads;
- `bare-decode`: each decode thread's work per image cut down to one `cv2.resize` of a fixed
  120 x 120 window of the raw record into its slot: no crop plan, no header check, no flip.
  What is left is OpenCV's resize and the pipeline around it. Needs a raw-pixel dataset
  (`upload --max-side 256`, the default raw records);
- `no-decode`: nothing decoded (the batch arrays are left as they are): the read path's own
  ceiling.

    python benchmarks/reader_bounds.py --storage DIR --dataset NAME --images 60000 --rounds 3
    python benchmarks/reader_bounds.py --make 4000   # its own raw 256-px data, in --workdir

None of the changes is a product option: they exist here to bound the reader.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from decode_in_processes import measure_window, parsed, run_rounds, window_parser
from fairness import every_core
from stop_cleanly import exit_cleanly_on_signals

CHANGES = ("one-load-thread", "bare-decode", "no-decode")
DEFAULT_VARIANTS = ("shipped", "one-load-thread", "bare-decode", "bare-decode+one-load-thread",
                    "no-decode", "no-decode+one-load-thread")
# The window `bare-decode` resizes (rows, columns): inside any raw record of a 256-px upload
# whose shorter side is 120 pixels or more.
BARE_WINDOW = (120, 120)


def variant_changes(text: str) -> frozenset[str]:
    """The changes a variant makes (none for `shipped`); argparse's check of a variant."""
    if text == "shipped":
        return frozenset()
    changes = frozenset(text.split("+"))
    if not changes <= set(CHANGES) or {"bare-decode", "no-decode"} <= changes:
        raise argparse.ArgumentTypeError(
            f"a variant is 'shipped' or changes joined by '+' from {', '.join(CHANGES)} "
            f"(bare-decode and no-decode exclude each other), got {text!r}")
    return changes


def variant_arg(text: str) -> str:
    variant_changes(text)
    return text


def apply(changes: frozenset[str]) -> None:
    """Patches this (child) process's trainfeed with `changes`, before any reader exists."""
    import numpy as np

    import trainfeed.reader.pipeline as pipeline
    import trainfeed.reader.reader as reader
    from trainfeed.decode import raw
    from trainfeed.decode.pixels import CROP_CHUNK, DecodedBatch, ImageDecoder
    from trainfeed.decode.resize import cv2_module

    if "one-load-thread" in changes:
        pipeline.load_threads = reader.load_threads = lambda: 1  # type: ignore[attr-defined]
    if not changes & {"bare-decode", "no-decode"}:
        return
    resize = cv2_module().resize
    bare = "bare-decode" in changes

    def into_batch(self: ImageDecoder, blobs: Sequence[Any], where: Any,
                   plans: Any) -> DecodedBatch:
        n = len(blobs)
        assert self.crops is not None
        out = self._batches.empty((n, *self.crops.size, self.channels), np.uint8)
        if bare and n and not raw.is_raw(blobs[0]):
            raise SystemExit("bare-decode needs a raw-pixel dataset (upload --max-side 256)")

        def work(start: int, stop: int) -> None:
            for i in range(start, stop):
                window = np.ndarray((*BARE_WINDOW, 3), np.uint8, blobs[i], raw.HEADER_BYTES)
                resize(window, out.shape[2:0:-1], dst=out[i])
        if bare:
            self._run(work, n, CROP_CHUNK)
        return DecodedBatch(out, np.ones(n, dtype=bool), ())
    ImageDecoder._decode_into_batch = into_batch  # type: ignore[method-assign]


def run_variant(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """`variant`'s window, measured in a child process of its own."""
    cmd = [sys.executable, os.path.abspath(__file__), "--role", variant, "--storage",
           args.storage, "--dataset", args.dataset, "--images", str(args.images),
           "--warmup", str(args.warmup)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"variant {variant} failed:\n{done.stderr[-3000:]}")
    return {"variant": variant, **json.loads(done.stdout.splitlines()[-1])}


def table(rows: Sequence[dict[str, Any]], variants: Sequence[str]) -> str:
    """Medians per variant (min-max of images/s and of the cores), in the order asked."""
    out = [f"| variant | images/s median (min-max) | cores busy (of {every_core()}) | "
           f"CPU ms/image | foreign cores | load 1m |", "|---|---:|---:|---:|---:|---:|"]
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]

        def spread(key: str, form: str, of: list[dict[str, Any]] = mine) -> str:
            values = [r[key] for r in of]
            return (f"{statistics.median(values):{form}} ({min(values):{form}}-"
                    f"{max(values):{form}})")

        def median(key: str, of: list[dict[str, Any]] = mine) -> float:
            return statistics.median(r[key] for r in of)
        out.append(f"| {variant} | {spread('images_per_s', ',.0f')} | "
                   f"{spread('cores_busy', '.2f')} | {median('cpu_ms_per_image'):.3f} | "
                   f"{median('foreign_cores'):.2f} | {median('loadavg_1m'):.2f} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # a window's child is killed with this run (subprocess.run)
    args = parsed(window_parser(__doc__.split("\n\n")[0], 60_000, variant_arg,
                                DEFAULT_VARIANTS), argv)
    if args.role:
        apply(variant_changes(args.role))
        print(json.dumps(measure_window(args.storage, args.dataset, args.images, args.warmup)))
        return 0
    run_rounds(args, run_variant, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
