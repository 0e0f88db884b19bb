"""One reader pass in a process of its own, for tests that measure its peak memory:
`python bomb_pass.py STORAGE DATASET [crops]` prints one JSON line with the ids delivered, the
decode failures counted and the error that ended the pass, if any."""
from __future__ import annotations

import json
import sys


def main() -> None:
    storage, dataset, path = sys.argv[1], sys.argv[2], sys.argv[3]
    from trainfeed import dist

    options: dict[str, object] = {"decode": True, "image_size": (16, 16), "batch_size": 16,
                                  "decode_errors": "skip", "decode_threads": 2}
    if path == "crops":
        options["random_resized_crop"] = ((0.08, 1.0), (3 / 4, 4 / 3))
    ids: list[int] = []
    error = None
    reader = dist.reader(dataset, local=True, storage=storage, **options)  # type: ignore[arg-type]
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
