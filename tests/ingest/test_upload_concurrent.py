"""Two uploads of one dataset at once (issue 25 §5): the second fails at once with an error that
names the dataset and the running upload and says what to do, and the published dataset stays
whole. Once, in 11 rounds of two concurrent `upload --overwrite` runs, 3 died with a traceback
(a temporary file or data folder the other had removed) and 2 published a manifest whose shards
the other then deleted."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from sample_data import make_image_list

from trainfeed.errors import ConcurrentUploadError
from trainfeed.formats.manifest import dataset_storage, read_manifest
from trainfeed.storage import open_storage
from trainfeed.upload import LOCK_NAME, UploadOptions, upload

# An upload that stops after its first shard until told to go on: a real second process
# holding the dataset's upload lock, paused at a known point.
PAUSED_UPLOAD = """
import sys, time
from pathlib import Path
from trainfeed.upload import UploadOptions, upload

listing, storage, ready, go = sys.argv[1:5]

def pause(shard):
    if shard == 0:
        Path(ready).touch()
        deadline = time.monotonic() + 60
        while not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.02)

result = upload(listing, "flowers", storage, UploadOptions(overwrite=True, row_group_rows=16,
                                                           shard_row_groups=2),
                progress=False, on_shard=pause)
print(result.num_records)
"""


def cli_upload(listing: Path, storage: str, dataset: str = "flowers") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "trainfeed.cli.main", "upload", str(listing),
                             "--dataset", dataset, "--storage", storage, "--overwrite",
                             "--no-progress", "--rows-per-group", "16"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records_readable(storage: str) -> int:
    """Every record of the published dataset, read through a reader in its own process."""
    run = subprocess.run([sys.executable, "-c", "from trainfeed import LocalSource, dist; "
                          f"r = dist.reader('flowers', source=LocalSource({storage!r})); "
                          "print(sum(1 for _ in r()))"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


@pytest.fixture
def two_lists(tmp_path: Path) -> tuple[Path, Path]:
    return (make_image_list(tmp_path / "a", 200, seed=1),
            make_image_list(tmp_path / "b", 200, seed=2))


def test_a_second_upload_fails_at_once_naming_the_first(two_lists: tuple[Path, Path],
                                                        tmp_path: Path) -> None:
    first_list, second_list = two_lists
    storage = str(tmp_path / "storage")
    upload(str(second_list), "flowers", storage, progress=False)  # an earlier version
    ready, go = tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", PAUSED_UPLOAD, str(first_list), storage,
                              str(ready), str(go)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr
            time.sleep(0.02)
        second = cli_upload(second_list, storage)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert "Traceback" not in err
        assert (f"error: dataset 'flowers' in {storage}/flowers is being uploaded by another "
                f"process (pid {first.pid} on ") in err
        assert "this one wrote nothing. Wait for that upload to end, then run this one " in err
        go.touch()
        out, err = first.communicate(timeout=120)
    finally:
        go.touch()
        first.kill()
        first.wait()
    assert first.returncode == 0 and out.strip() == "200", err
    assert records_readable(storage) == 200
    published = read_manifest(open_storage(storage), "flowers")
    assert published.source == first_list.name
    assert not (Path(storage) / "flowers" / LOCK_NAME).exists()


def test_concurrent_overwrites_end_cleanly_and_leave_a_whole_dataset(
        two_lists: tuple[Path, Path], tmp_path: Path) -> None:
    for round_ in range(3):
        storage = str(tmp_path / f"storage{round_}")
        upload(str(two_lists[0]), "flowers", storage, progress=False)
        runs = [cli_upload(listing, storage) for listing in reversed(two_lists)]
        for run in runs:
            _, err = run.communicate(timeout=120)
            assert run.returncode == 0 or (
                run.returncode == 2 and "is being uploaded by another process" in err), err
            assert "Traceback" not in err
        assert records_readable(storage) == 200, f"round {round_}"


def test_without_a_lock_an_upload_replaced_meanwhile_publishes_nothing(
        two_lists: tuple[Path, Path]) -> None:
    """Object stores cannot lock: an upload checks before publishing that the dataset is still
    the one it found, and never deletes the data of the manifest that is published."""
    first_list, second_list = two_lists
    storage = open_storage(f"memory://concurrent-{time.monotonic_ns()}")
    assert not storage.is_local
    upload(str(first_list), "flowers", storage, progress=False)
    other: dict[str, object] = {}

    def meanwhile(shard: int) -> None:
        if shard == 0 and not other:
            other["result"] = upload(str(second_list), "flowers", storage,
                                     UploadOptions(overwrite=True), progress=False)

    with pytest.raises(ConcurrentUploadError, match=r"dataset 'flowers' in memory://.* was "
                                                    r"replaced by another upload while this "
                                                    r"one ran .*this upload published nothing"):
        upload(str(first_list), "flowers", storage,
               UploadOptions(overwrite=True, row_group_rows=16, shard_row_groups=2,
                             comments=False),  # another layout: not already published
               progress=False, on_shard=meanwhile)
    published = read_manifest(storage, "flowers")
    assert published.source == second_list.name and published.num_records == 200
    folder = dataset_storage(storage, "flowers")
    for shard in published.shards:
        assert folder.exists(shard.path)
