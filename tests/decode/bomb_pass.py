"""One reader pass in a process of its own, for tests that measure its peak memory:
`python bomb_pass.py STORAGE DATASET [crops]` prints one JSON line with the ids delivered, the
decode failures counted, the error that ended the pass, if any, and the native (non-Python)
threads the pass started: Arrow's pool threads, left running at exit, can abort the interpreter's
finalization with "terminate called without an active exception" (Arrow #34314)."""
from __future__ import annotations

import json
import os
import sys
import threading
import time


def native_threads() -> set[int]:
    """The process's threads that Python did not start (thread pools of C/C++ libraries)."""
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python


def settled_native_threads(before: set[int]) -> set[int]:
    """Native threads started since `before` that are still there after up to 2 s: a Python
    thread that just ended leaves threading's list before its OS thread is gone (CI counted
    one, under load); a pool thread stays."""
    deadline = time.monotonic() + 2.0
    while (started := native_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return started


def warm_up() -> None:
    """Starts the native threads a reader is expected to have (OpenCV's resize pool, Arrow's
    allocator thread) so that only those a pass starts on top are counted."""
    import cv2
    import numpy as np
    import pyarrow as pa

    cv2.resize(np.zeros((2000, 2000, 3), np.uint8), (500, 500), interpolation=cv2.INTER_AREA)
    pa.array(np.arange(1 << 16))


def main() -> None:
    storage, dataset, path = sys.argv[1], sys.argv[2], sys.argv[3]
    from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions, dist

    warm_up()
    before = native_threads()
    crop = ((0.08, 1.0), (3 / 4, 4 / 3)) if path == "crops" else None
    pipeline = PipelineOptions(
        decode=DecodeOptions(True, image_size=(16, 16), errors="skip", threads=2,
                             random_resized_crop=crop),
        batch=BatchOptions(size=16))
    ids: list[int] = []
    error = None
    reader = dist.reader(dataset, source=LocalSource(storage=storage), pipeline=pipeline)
    try:
        for batch in reader():
            ids += batch["_id"].tolist()
    except BaseException as e:  # the test reports whatever ended the pass
        error = f"{type(e).__name__}: {e}"
    failures = reader.decode_failures
    reader.close()
    started = len(settled_native_threads(before))
    print(json.dumps({"ids": ids, "failures": failures, "error": error,
                      "native_threads_started": started}))


if __name__ == "__main__":
    main()
