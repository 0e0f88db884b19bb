"""`outside_paths` learns which listed files are symbolic links from one scan of their folder,
not an lstat per file (issue 30 §2: 0.07 of 0.1 CPU-s per 10,000 photos), except in a folder
holding far more entries than the list names there, where it checks each listed path alone."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainfeed.formats import listfile
from trainfeed.formats.listfile import ListEntry, outside_paths


def entries_of(paths: list[Path]) -> tuple[ListEntry, ...]:
    return tuple(ListEntry(i, i + 1, (str(p), "x")) for i, p in enumerate(paths))


@pytest.fixture()
def counted_islink(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = os.path.islink

    def islink(path: str) -> bool:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(listfile.os.path, "islink", islink)
    return calls


def test_a_folder_of_listed_files_is_scanned_once_and_its_links_out_named(
        tmp_path: Path, counted_islink: list[str]) -> None:
    base = tmp_path / "list"
    (base / "img").mkdir(parents=True)
    files = []
    for i in range(200):
        (base / "img" / f"{i}.jpg").write_bytes(b"x")
        files.append(base / "img" / f"{i}.jpg")
    (tmp_path / "secret").write_text("s")
    (base / "img" / "out.jpg").symlink_to(tmp_path / "secret")
    (base / "img" / "in.jpg").symlink_to(base / "img" / "0.jpg")
    listed = [*files, base / "img" / "out.jpg", base / "img" / "in.jpg"]
    assert outside_paths(entries_of(listed), str(base)) == [(201, str(base / "img" / "out.jpg"))]
    assert counted_islink == []


def test_a_few_files_of_a_large_folder_are_checked_one_by_one(
        tmp_path: Path, counted_islink: list[str]) -> None:
    base = tmp_path / "list"
    base.mkdir()
    for i in range(300):
        (base / f"{i}.jpg").write_bytes(b"x")
    (tmp_path / "secret").write_text("s")
    (base / "out.jpg").symlink_to(tmp_path / "secret")
    listed = [base / "1.jpg", base / "out.jpg"]
    assert outside_paths(entries_of(listed), str(base)) == [(2, str(base / "out.jpg"))]
    assert counted_islink == [str(p) for p in listed]
    assert listfile._symlinks_in(str(base), 2) is None
    assert listfile._symlinks_in(str(base), 100) == frozenset({"out.jpg"})


def test_a_folder_that_cannot_be_scanned_falls_back_to_one_check_per_path(
        tmp_path: Path) -> None:
    assert listfile._symlinks_in(str(tmp_path / "missing"), 10) is None
