"""One reader pass in a process of its own, for tests that measure its peak memory:
`python bomb_pass.py STORAGE DATASET [crops]` prints one JSON line with the ids delivered, the
decode failures counted and the error that ended the pass, if any."""
from __future__ import annotations

import json
import sys


def main() -> None:
    storage, dataset, path = sys.argv[1], sys.argv[2], sys.argv[3]
    from trainfeed import BatchOptions, DecodeOptions, LocalSource, PipelineOptions, dist

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
    print(json.dumps({"ids": ids, "failures": failures, "error": error}))


if __name__ == "__main__":
    main()
