"""Edge cases of `.list` parsing that tests/formats/test_listfile.py does not reach: the first
line deciding the width, kind detection with spaces, empty trailing columns, the cut of long
lines in error messages.

Equivalent mutant (mutmut, tools/mutation.py), left alive on purpose:
- `_read_lines`: `decode("utf-8")` → `decode("UTF-8")`: codec names are case-insensitive.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainfeed.errors import ListFileError
from trainfeed.formats.listfile import parse_list


def write(tmp_path: Path, text: str | bytes, name: str = "train_data.list") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_a_file_list_whose_first_line_has_three_columns_fails_on_that_line(
        tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"x")
    path = write(tmp_path, "a.jpg\tcat\textra\na.jpg\tdog\n")
    with pytest.raises(ListFileError) as e:
        parse_list(str(path))  # detected as a file list: 2 columns, whatever line 1 says
    assert str(e.value) == (f"{path}:1: expected 2 tab-separated columns (image, label), got 3: "
                            f"'a.jpg\\tcat\\textra'")


def test_paths_with_spaces_are_detected_as_a_file_list(tmp_path: Path) -> None:
    (tmp_path / "my images").mkdir()
    (tmp_path / "my images" / "a b.jpg").write_bytes(b"x")
    parsed = parse_list(str(write(tmp_path, "my images/a b.jpg\tcat\n")))
    assert parsed.kind == "file"
    assert parsed.entries[0].columns == (str(tmp_path / "my images" / "a b.jpg"), "cat")


def test_a_first_column_naming_a_folder_is_a_file_list_and_nothing_is_text(
        tmp_path: Path) -> None:
    """A folder looks like a path: the list is a file list (its upload then names the line),
    never silently a text dataset of path strings (issue 14)."""
    (tmp_path / "images").mkdir()
    assert parse_list(str(write(tmp_path, "images\tcat\n"))).kind == "file"
    assert parse_list(str(write(tmp_path, "\tcat\n"))).kind == "text"


def test_a_trailing_empty_text_column_is_kept(tmp_path: Path) -> None:
    parsed = parse_list(str(write(tmp_path, "a\tb\t\r\nc\td\t\n")))
    assert parsed.field_names == ("text0", "text1", "text2")
    assert [e.columns for e in parsed.entries] == [("a", "b", ""), ("c", "d", "")]
    path = write(tmp_path, "a\tb\t\nc\td\n")
    with pytest.raises(ListFileError, match=r":2: expected 3 tab-separated columns .* got 2"):
        parse_list(str(path))


def test_only_the_carriage_return_of_a_crlf_line_is_stripped(tmp_path: Path) -> None:
    parsed = parse_list(str(write(tmp_path, "a \tBOX\r\n")), kind="text")
    assert parsed.entries[0].columns == ("a ", "BOX")


def test_long_lines_are_cut_at_200_characters_in_errors(tmp_path: Path) -> None:
    exact = "x" * 196 + "\ty\tz"  # 200 characters: shown whole
    path = write(tmp_path, f"a\tb\n{exact}\n")
    with pytest.raises(ListFileError) as e:
        parse_list(str(path))
    assert str(e.value).endswith(f": {exact!r}")
    longer = "x" * 197 + "\ty\tz"  # 201: the first 200 and an ellipsis
    path = write(tmp_path, f"a\tb\n{longer}\n")
    with pytest.raises(ListFileError) as e:
        parse_list(str(path))
    assert str(e.value).endswith(": " + repr(longer[:200] + "…"))


def test_a_long_undecodable_line_is_cut_at_200_bytes(tmp_path: Path) -> None:
    line = b"\xff" + b"y" * 299
    path = write(tmp_path, b"a\tb\n" + line + b"\n")
    with pytest.raises(ListFileError) as e:
        parse_list(str(path))
    assert str(e.value) == (f"{path}:2: not valid UTF-8 (invalid start byte at byte 0): "
                            f"{line[:200]!r}")


def test_a_folder_is_not_a_list(tmp_path: Path) -> None:
    with pytest.raises(ListFileError, match=rf"^{tmp_path}: is a folder, expected a .list file$"):
        parse_list(str(tmp_path))


def test_the_parsed_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "a\tb\n")
    monkeypatch.chdir(tmp_path)
    parsed = parse_list("train_data.list")
    assert parsed.path == os.path.join(str(tmp_path), "train_data.list")
