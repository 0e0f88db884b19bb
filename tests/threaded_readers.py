"""Several distributed readers of one job, as threads of the test process: what each epoch
delivered, for the tests that check an epoch is split exactly once."""
from __future__ import annotations

import threading
from collections import Counter

from trainfeed import MasterSource, dist


def ids_per_epoch(dataset: str, master: str, job: str, readers: int = 3,
                  epochs: int = 2) -> dict[int, Counter[int]]:
    """Epoch -> Counter of first-field values (the row ids) delivered by `readers` readers."""
    got: dict[int, Counter[int]] = {}
    lock = threading.Lock()

    def work() -> None:
        with dist.reader(dataset, source=MasterSource(master, job=job)) as reader:
            for _ in range(epochs):
                ids = [row[0] for row in reader()]
                with lock:
                    got.setdefault(reader.epoch or 0, Counter()).update(ids)

    threads = [threading.Thread(target=work) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return got
