"""Round-trip helpers for the storage integration tests: make images, read them back, compare.

A round trip is: write N small JPEGs and a `.list` file, upload them, read the dataset back with
real reader processes (and with the local reader), and check what came back against the source
files, record by record. The comparison is on `(record id, SHA-256 of the bytes, label)`, so a
lost, duplicated, mis-labelled or corrupted record all show up, and the failure message names it.

Run as a script, this module is one distributed reader (see `main`): the tests start several of
them as separate processes, as training nodes would be, and collect what each one was delivered.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: What a record is compared by: (record id, SHA-256 hex of its file bytes, label).
Record = tuple[int, str, str]

LABELS = ("cat", "dog", "bird")
#: How long a reader child may take in all (start-up, every pass). Generous: a CI machine has
#: two cores shared by the storage server, the master and the readers.
READERS_TIMEOUT_S = 120.0
#: A reader child gives up on an unreachable master after this long instead of the default
#: two minutes, so that a master that died shows up as that error, not as the test's timeout.
MASTER_GIVE_UP_S = "20"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------
# source data


@dataclass(frozen=True)
class SourceImages:
    """N JPEG files and the `.list` file that names them, with what a reader must deliver."""

    list_path: Path
    records: tuple[Record, ...]  # indexed by record id (the line's ordinal in the list)

    @property
    def ids(self) -> set[int]:
        return {record_id for record_id, _, _ in self.records}

    def expected(self) -> Counter[Record]:
        """The multiset of records one full pass must deliver: each exactly once."""
        return Counter(self.records)


def make_jpeg_list(
    folder: Path, count: int, labels: Sequence[str] = LABELS, seed: int = 0
) -> SourceImages:
    """Writes `count` distinct JPEGs under `folder/images/` and `folder/train_data.list`.

    Image `i` is seeded noise (so every file's bytes differ) labelled `labels[i % len(labels)]`;
    the list names files relative to its own folder, as users write them.
    """
    # Imported here: run as a script (a reader child), this module needs only trainfeed.
    from sample_data import file_digests, make_image_list

    list_path = make_image_list(folder, count, tuple(labels), seed=seed)
    digests = file_digests(list_path)
    return SourceImages(list_path, tuple((i, *digests[i]) for i in range(count)))


# --------------------------------------------------------------------------------------------
# reading


def read_pass(reader: object, batch_size: int, step_s: float = 0.0) -> list[Record]:
    """One pass of `reader.column_batches(batch_size)`, as records in delivery order.

    `step_s` sleeps after each batch, standing in for a training step: it keeps one fast reader
    from draining an epoch before the others have asked for work.
    """
    records: list[Record] = []
    for batch in reader.column_batches(batch_size):  # type: ignore[attr-defined]
        ids = batch["_id"].tolist()
        assert len(ids) == len(batch["image"]) == len(batch["label"]), "ragged column batch"
        records.extend(
            (int(i), sha256(image), str(label))
            for i, image, label in zip(ids, batch["image"], batch["label"])
        )
        if step_s:
            time.sleep(step_s)
    return records


@dataclass(frozen=True)
class ReaderOutput:
    """What one reader process was delivered: its records of each epoch it took part in."""

    index: int
    passes: list[tuple[int | None, list[Record]]]  # (epoch, records in delivery order) per pass

    @property
    def epochs(self) -> list[int | None]:
        return [epoch for epoch, _ in self.passes]

    def records(self, epoch: int) -> list[Record]:
        return [r for e, records in self.passes if e == epoch for r in records]


def run_readers(
    count: int,
    dataset: str,
    master: str,
    workdir: Path,
    *,
    epochs: int,
    env: Mapping[str, str] | None = None,
    job: str = "roundtrip",
    batch_size: int = 8,
    step_s: float = 0.01,
    timeout_s: float = READERS_TIMEOUT_S,
) -> list[ReaderOutput]:
    """Runs `count` reader processes of one job, each reading `epochs` passes; returns their output.

    The readers connect first and then start reading together (a file barrier), so every one of
    them takes part from the first epoch. Each child's stdout and stderr go to files (no pipe can
    fill up and stall a child while the test waits on another). Every child is killed in a
    `finally`, and a child that fails or overruns `timeout_s` fails the test with its stderr.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    go = workdir / "go"
    child_env = {
        **os.environ,
        **(env or {}),
        "TRAINFEED_MASTER": master,
        "TRAINFEED_MASTER_GIVE_UP_S": MASTER_GIVE_UP_S,
    }
    child_env.pop("TRAIN_LOCAL", None)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[tuple[Path, Path]] = []
    deadline = time.monotonic() + timeout_s
    try:
        for i in range(count):
            out, err = workdir / f"reader-{i}.out", workdir / f"reader-{i}.err"
            logs.append((out, err))
            argv = [
                sys.executable, __file__, dataset, "--job", job, "--epochs", str(epochs),
                "--batch-size", str(batch_size), "--step-s", str(step_s),
                "--ready", str(workdir / f"ready-{i}"), "--go", str(go),
                "--timeout-s", str(timeout_s),
            ]  # fmt: skip
            with open(out, "wb") as stdout, open(err, "wb") as stderr:
                procs.append(
                    subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=child_env
                    )
                )
        ready = [workdir / f"ready-{i}" for i in range(count)]
        while not all(p.exists() for p in ready):
            _check_children(procs, logs, deadline, "connecting to the master")
            time.sleep(0.02)
        go.touch()
        while any(p.poll() is None for p in procs):
            _check_children(procs, logs, deadline, "reading")
            time.sleep(0.05)
        _check_children(procs, logs, deadline, "reading")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
    outputs = []
    for i, (out, _) in enumerate(logs):
        passes = [
            (done["epoch"], [(int(r[0]), str(r[1]), str(r[2])) for r in done["records"]])
            for done in map(json.loads, out.read_text().splitlines())
        ]
        outputs.append(ReaderOutput(i, passes))
    return outputs


def _check_children(
    procs: Sequence[subprocess.Popen[bytes]],
    logs: Sequence[tuple[Path, Path]],
    deadline: float,
    doing: str,
) -> None:
    for i, p in enumerate(procs):
        if p.poll() not in (None, 0):
            raise AssertionError(
                f"reader {i} exited with status {p.returncode} while {doing}; "
                f"its stderr:\n{_tail(logs[i][1])}"
            )
    if time.monotonic() > deadline:
        stuck = [i for i, p in enumerate(procs) if p.poll() is None]
        raise AssertionError(
            f"readers {stuck} still {doing} at the deadline; their stderr:\n"
            + "\n".join(f"--- reader {i}\n{_tail(logs[i][1])}" for i in stuck)
        )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"<no log at {path}: {e}>"


def run_reader_expecting_failure(
    dataset: str,
    env: Mapping[str, str],
    workdir: Path,
    *,
    master: str | None = None,
    timeout_s: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Runs one reader process (local when `master` is None) that must fail; returns its result.

    Fails the test if the child does not end within `timeout_s` (a hang) or succeeds.
    """
    child_env = {**os.environ, **env, "TRAINFEED_MASTER_GIVE_UP_S": MASTER_GIVE_UP_S}
    child_env.pop("TRAIN_LOCAL", None)
    argv = [sys.executable, __file__, dataset, "--epochs", "1", "--timeout-s", str(timeout_s)]
    if master is None:
        argv.append("--local")
    else:
        child_env["TRAINFEED_MASTER"] = master
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            argv,
            check=False,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=child_env,
            timeout=timeout_s,
            cwd=workdir,
        )
    except subprocess.TimeoutExpired as e:  # run() has already killed the child
        raise AssertionError(
            f"the reader hung: no exit within {timeout_s:g} s; its stderr:\n"
            f"{(e.stderr or b'')[-4000:]!r}"
        ) from None
    assert done.returncode != 0, (
        f"the reader was expected to fail but exited 0; stdout:\n{done.stdout[-2000:]}"
    )
    return done


# --------------------------------------------------------------------------------------------
# checking


def describe_difference(got: Counter[Record], want: Counter[Record]) -> str:
    """A short account of how two record multisets differ, by record id."""
    missing = want - got
    extra = got - want
    ids = Counter(record_id for record_id, _, _ in got.elements())
    duplicated = sorted(i for i, n in ids.items() if n > 1)
    wrong = sorted({r[0] for r in extra} & {r[0] for r in missing})
    return (
        f"{sum(missing.values())} missing (ids {sorted(r[0] for r in missing)[:20]}), "
        f"{sum(extra.values())} unexpected; ids delivered more than once: {duplicated[:20]}; "
        f"ids with wrong bytes or label: {wrong[:20]}"
    )


def assert_every_epoch_exactly_once(
    outputs: Iterable[ReaderOutput], source: SourceImages, epochs: int
) -> dict[int, dict[int, int]]:
    """Checks that epochs 0..epochs-1 each delivered every source record exactly once, with the
    source's bytes and label, split over the readers. Returns epoch -> reader -> record count.
    """
    outputs = list(outputs)
    want = source.expected()
    shares: dict[int, dict[int, int]] = {}
    for out in outputs:
        assert out.epochs == list(range(epochs)), (
            f"reader {out.index} read epochs {out.epochs} (None: a pass that got no work), "
            f"expected {list(range(epochs))}"
        )
    for epoch in range(epochs):
        got: Counter[Record] = Counter()
        for out in outputs:
            got.update(out.records(epoch))
        ids = Counter(record_id for record_id, _, _ in got.elements())
        assert set(ids) == source.ids, f"epoch {epoch}: {describe_difference(got, want)}"
        assert all(n == 1 for n in ids.values()), f"epoch {epoch}: {describe_difference(got, want)}"
        assert got == want, f"epoch {epoch}: {describe_difference(got, want)}"
        shares[epoch] = {out.index: len(out.records(epoch)) for out in outputs}
    return shares


# --------------------------------------------------------------------------------------------
# the reader child


def main(argv: Sequence[str] | None = None) -> int:
    """One reader process: prints `{"epoch": E, "records": [[id, sha256, label], …]}` per pass."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dataset")
    parser.add_argument("--job", default="roundtrip")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--local", action="store_true", help="read from storage (TRAIN_LOCAL)")
    parser.add_argument("--storage", help="storage URL for --local (default $TRAINFEED_STORAGE)")
    parser.add_argument("--ready", type=Path, help="touch this file once connected")
    parser.add_argument("--go", type=Path, help="then wait for this file before reading")
    parser.add_argument("--timeout-s", type=float, default=READERS_TIMEOUT_S)
    args = parser.parse_args(argv)

    from trainfeed import dist

    deadline = time.monotonic() + args.timeout_s
    from trainfeed import LocalSource, MasterSource

    source = (LocalSource(storage=args.storage) if args.local
              else MasterSource(job=args.job))  # the master: $TRAINFEED_MASTER
    with dist.reader(args.dataset, source=source) as reader:
        # Connect first (OpenJob on the master, or the manifest read when local), then say so.
        assert reader.field_names == ("image", "label"), reader.field_names
        if args.ready is not None:
            args.ready.touch()
        if args.go is not None:
            while not args.go.exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"no go signal at {args.go} within {args.timeout_s:g} s")
                time.sleep(0.01)
        for pass_index in range(args.epochs):
            records = read_pass(reader, args.batch_size, args.step_s)
            # A distributed reader learns its epoch from the master (None if it got no work);
            # a local reader's passes are its epochs.
            epoch = pass_index if args.local else reader.epoch
            print(json.dumps({"epoch": epoch, "records": records}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
