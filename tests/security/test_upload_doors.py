"""The doors of `trainfeed upload` (issue 35): the dataset name, which becomes a folder in
storage, and the files a list names.

A dataset's shards live under `NAME/data/...`, and `NAME/data` was a legal name: two uploads, of
`flowers` and `flowers/data`, started together, in 2 of 8 rounds left one that printed
"published" and exited 0 with its manifest gone (the other's publish removed it as stale data),
and in 4 others one died with a raw FileNotFoundError. A dataset's own entries are now reserved
name segments, and the check of nested names runs again under the storage's publish lock.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from ingest.test_upload_concurrent import cli_upload
from peak_rss import run_measured
from sample_data import make_image_list

from trainfeed import LocalSource, dist
from trainfeed.errors import HardLinkedFilesError, InvalidNameError, OutsidePathsError
from trainfeed.formats.manifest import (
    MANIFEST_NAME,
    VERSIONS_DIR,
    check_name_is_free,
    list_datasets,
)
from trainfeed.formats.sources import SOURCES_FILE
from trainfeed.ingest.inputs import DATA_DIR
from trainfeed.ingest.lock import PUBLISH_LOCK
from trainfeed.names import RESERVED_SEGMENTS, check_new_dataset_name, validate_dataset_name
from trainfeed.reader.transforms import TRANSFORMERS_DIR
from trainfeed.storage import open_storage
from trainfeed.upload import UploadOptions, upload

RECORDS = 60
ROUNDS = 4  # per pair of names; each round is two real upload processes started together


def ids(storage: str, name: str) -> list[int]:
    """Every record id of dataset `name`, read back through a reader."""
    reader = dist.reader(name, source=LocalSource(storage=storage))
    return [i for b in reader.column_batches(16) for i in b["_id"].tolist()]


def test_every_entry_of_a_dataset_folder_is_a_reserved_segment() -> None:
    """The layout (trainfeed.formats.manifest) and the reserved names must not drift apart."""
    assert {MANIFEST_NAME, VERSIONS_DIR, DATA_DIR, TRANSFORMERS_DIR} <= RESERVED_SEGMENTS
    assert SOURCES_FILE not in RESERVED_SEGMENTS  # it lives in data/<fingerprint>/, not on top


@pytest.mark.parametrize("name", ["flowers/data", "flowers/versions", "flowers/transformers",
                                  "flowers/manifest.json", "public/Data", "ns/VERSIONS"])
def test_a_new_dataset_may_not_be_named_after_a_dataset_folders_entry(name: str) -> None:
    head = name.split("/")[0]
    with pytest.raises(InvalidNameError,
                       match=f"would lie inside dataset '{head}', among its own files"):
        check_new_dataset_name(name)
    assert validate_dataset_name(name) == name  # one published before the rule stays readable


@pytest.mark.parametrize("name", ["data", "versions", "data/flowers", "public/digits",
                                  "flowers/data2", "flowers/my-data"])
def test_names_that_cannot_collide_stay_legal(name: str, tmp_path: Path) -> None:
    assert check_new_dataset_name(name) == name
    check_name_is_free(open_storage(str(tmp_path)), name)


def test_an_upload_to_a_reserved_name_writes_nothing(tmp_path: Path) -> None:
    listing = make_image_list(tmp_path / "list", 8)
    storage = tmp_path / "storage"
    run = cli_upload(listing, str(storage), "flowers/data")
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2 and "Traceback" not in err, err
    assert "invalid dataset name 'flowers/data'" in err
    assert not (storage / "flowers").exists()


@pytest.mark.slow
@pytest.mark.parametrize("nested", ["flowers/data", "flowers/more"])
def test_racing_uploads_of_nested_names_publish_one_and_refuse_the_other(
        nested: str, tmp_path: Path) -> None:
    """Every round: one upload exits 0 and its dataset reads back every record id; the other
    exits 2 with an error naming both datasets, no traceback, and nothing published under its
    name. `flowers/data` is refused by name; `flowers/more` by whichever publishes first."""
    lists = {"flowers": make_image_list(tmp_path / "a", RECORDS, seed=1),
             nested: make_image_list(tmp_path / "b", RECORDS, seed=2)}
    for round_ in range(ROUNDS):
        storage = str(tmp_path / f"storage{round_}")
        runs = {name: cli_upload(listing, storage, name) for name, listing in lists.items()}
        ended = {name: run.communicate(timeout=300) + (run.returncode,)
                 for name, run in runs.items()}
        winners = [name for name, (_, _, rc) in ended.items() if rc == 0]
        assert len(winners) == 1, f"round {round_}: {ended}"
        winner, = winners
        loser, = set(lists) - {winner}
        out, _, _ = ended[winner]
        _, err, rc = ended[loser]
        assert rc == 2 and "Traceback" not in err, f"round {round_}: {err}"
        assert "'flowers'" in err and f"'{nested}'" in err, f"round {round_}: {err}"
        assert f"published {winner!r}: {RECORDS} records" in out
        assert sorted(ids(storage, winner)) == list(range(RECORDS)), f"round {round_}"
        assert not (Path(storage) / loser / MANIFEST_NAME).exists()
        if nested == "flowers/data":
            assert winner == "flowers"


def test_a_name_made_unsafe_while_uploading_fails_at_publishing(tmp_path: Path) -> None:
    """`flowers/more` passes the check at its start; a real `flowers` upload publishes while it
    packs; at publishing it fails, publishes nothing and removes its shards, and `flowers`
    reads back whole."""
    nested = make_image_list(tmp_path / "b", RECORDS, seed=2)
    outer = make_image_list(tmp_path / "a", RECORDS, seed=1)
    storage = str(tmp_path / "storage")

    def publish_outer(shard: int) -> None:
        if shard == 0:
            run = cli_upload(outer, storage, "flowers")
            _, err = run.communicate(timeout=300)
            assert run.returncode == 0, err

    with pytest.raises(InvalidNameError) as refused:
        upload(str(nested), "flowers/more", storage,
               UploadOptions(row_group_rows=16, shard_row_groups=1), progress=False,
               on_shard=publish_outer)
    assert re.search(r"'flowers/more' would lie inside dataset 'flowers''s folder.*published "
                     r"by another upload while this one ran: this upload of 'flowers/more' "
                     r"published nothing", str(refused.value))
    assert not (Path(storage) / "flowers/more" / MANIFEST_NAME).exists()
    assert not os.listdir(Path(storage) / "flowers/more" / DATA_DIR)
    assert sorted(ids(storage, "flowers")) == list(range(RECORDS))


def test_a_dataset_keeps_off_a_nested_uploads_temporary_files(tmp_path: Path) -> None:
    """An upload removes temporary files a killed one left in its own folder, and no others:
    a nested dataset's upload may be writing them."""
    storage = tmp_path / "storage"
    own = storage / "flowers" / DATA_DIR / "0123" / "shard.tmp-1"
    nested = storage / "flowers" / "more" / DATA_DIR / "0123" / "shard.tmp-1"
    for path in (own, nested):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x")
    listing = make_image_list(tmp_path / "a", 8)
    upload(str(listing), "flowers", str(storage), progress=False)
    assert not own.exists() and nested.exists()


def test_the_publish_lock_is_no_dataset(tmp_path: Path) -> None:
    listing = make_image_list(tmp_path / "a", 8)
    storage = str(tmp_path / "storage")
    upload(str(listing), "flowers", storage, progress=False)
    assert (Path(storage) / PUBLISH_LOCK).exists()
    assert list_datasets(open_storage(storage)) == ["flowers"]


# -- hard links: a file whose other names may lie outside the list's folder ---------------------
def test_a_hard_linked_file_is_refused_naming_it_and_its_line(tmp_path: Path) -> None:
    """A hard link to a file outside the list's folder was packed (symlinks, `..` and absolute
    paths were refused). Where a link's other names are cannot be known: every regular file
    with more than one name is refused, unless --allow-hard-links (or --allow-outside)."""
    listing = make_image_list(tmp_path / "src", 4)
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"not for the dataset")
    os.link(secret, listing.parent / "inside.jpg")
    listing.write_text(listing.read_text() + "inside.jpg\tcat\n")
    storage = tmp_path / "storage"
    run = cli_upload(listing, str(storage), "flowers")
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2 and "Traceback" not in err, err
    assert "1 file(s) named in" in err and "have more than one name (hard links)" in err
    assert f"{listing}:5: {listing.parent / 'inside.jpg'} (2 names)" in err
    assert "--allow-hard-links" in err
    assert not (storage / "flowers").exists()
    with pytest.raises(HardLinkedFilesError) as caught:  # an OutsidePathsError too
        upload(str(listing), "flowers", str(storage), progress=False)
    assert isinstance(caught.value, OutsidePathsError) and caught.value.outside == [
        (5, str(listing.parent / "inside.jpg"))]
    for options in (UploadOptions(allow_hard_links=True), UploadOptions(allow_outside=True)):
        result = upload(str(listing), "flowers", str(storage), options, progress=False)
        assert result.num_records == 5


def test_allow_hard_links_reaches_a_cluster_uploads_packers() -> None:
    from trainfeed.cli.main import build_parser
    from trainfeed.cli.upload_cmd import options_from, upload_arguments
    args = build_parser().parse_args(["upload", "x.list", "--dataset", "d",
                                      "--allow-hard-links"])
    assert options_from(args).allow_hard_links and "--allow-hard-links" in upload_arguments(args)


# -- one large record: the memory an upload takes for it ------------------------------------------
BIG_RECORD = 128 << 20
# Peak RSS above an upload of a tiny file, per byte of the record (docs/usage.md, "Large
# records"): its read buffer (1x, plus at most 4 MiB) and Parquet's writer (2x: its values
# encoder and its page, both copies of the value). Measured 3.1x; f44c545 took 5.3x (a second
# read buffer made and zeroed for nothing, an eighth more on each, and a copy of the whole
# value when locating it in the shard).
RECORD_PEAK_RATIO = 3.5


def upload_peak_mib(folder: Path, size: int) -> float:
    """The peak RSS of `trainfeed upload` (one process) of a list of one random file of
    `size` bytes, in MiB."""
    (folder / "data").mkdir(parents=True)
    with open(folder / "data" / "big.bin", "wb") as f:
        for _ in range(0, size, 1 << 20):
            f.write(os.urandom(min(1 << 20, size)))
    (folder / "big.list").write_text("data/big.bin\tx\n")
    run = run_measured([sys.executable, "-m", "trainfeed.cli.main", "upload",
                        str(folder / "big.list"), "--dataset", "big", "--storage",
                        str(folder / "storage"), "--no-progress", "--processes", "1",
                        "--max-record-bytes", str(1 << 30)])
    assert run.returncode == 0, run.stderr
    return run.peak_mb


@pytest.mark.slow
def test_a_large_record_takes_about_three_times_its_size(tmp_path: Path) -> None:
    base = upload_peak_mib(tmp_path / "small", 1 << 10)
    big = upload_peak_mib(tmp_path / "big", BIG_RECORD)
    assert big - base <= RECORD_PEAK_RATIO * (BIG_RECORD >> 20), (base, big)


@pytest.mark.parametrize("at", [0, 7, (64 << 10) - 2, (64 << 10) + 5, (1 << 20) + (64 << 10) - 1,
                                3 << 20])
def test_a_value_is_found_wherever_it_lies_without_copying_it_whole(at: int) -> None:
    """`_place` searches its 4-byte length in copies of 1 MiB (a window spanning the value
    copied all of it); a length that straddles two copies, and a decoy length before the value
    (right length, wrong bytes), are handled."""
    from zlib import crc32

    from trainfeed.formats.shards import _place
    value = os.urandom(300_000)
    head = len(value).to_bytes(4, "little")
    decoy = head + bytes(len(value))
    room = bytearray(os.urandom(at + len(decoy) + 4 + len(value) + 100))
    room[0:len(decoy)] = decoy if at >= len(decoy) else room[0:len(decoy)]
    room[at:at + 4 + len(value)] = head + value
    assert _place(memoryview(room), 0, len(value), crc32(value)) == at
    assert _place(memoryview(room), 0, len(value), crc32(value) ^ 1) == -1
