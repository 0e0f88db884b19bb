from __future__ import annotations

from pathlib import Path

import pytest

from trainfeed.errors import ListFileError
from trainfeed.formats.listfile import parse_list


def write(tmp_path: Path, text: str | bytes, name: str = "train_data.list") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_file_list_is_detected_and_paths_resolved_against_the_list_folder(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(b"x")
    parsed = parse_list(str(write(tmp_path, "img/a.jpg\tcat\nimg/b.jpg\tdog\n")))
    assert parsed.kind == "file"
    assert parsed.field_names == ("image", "label")
    assert [e.columns for e in parsed.entries] == [
        (str(tmp_path / "img" / "a.jpg"), "cat"), (str(tmp_path / "img" / "b.jpg"), "dog")]
    assert [(e.record_id, e.line) for e in parsed.entries] == [(0, 1), (1, 2)]


def test_text_list_is_detected_with_numbered_columns(tmp_path: Path) -> None:
    parsed = parse_list(str(write(tmp_path, "hello world\tbonjour le monde\r\nbye\tsalut\n")))
    assert parsed.kind == "text"
    assert parsed.field_names == ("text0", "text1")
    assert [e.columns for e in parsed.entries] == [("hello world", "bonjour le monde"),
                                                   ("bye", "salut")]
    assert parsed.label_index is None


def test_blank_lines_are_skipped_but_line_numbers_stay_true(tmp_path: Path) -> None:
    parsed = parse_list(str(write(tmp_path, "a\tb\n\n  \nc\td\n")), kind="text")
    assert [(e.record_id, e.line) for e in parsed.entries] == [(0, 1), (1, 4)]


def test_wrong_column_count_names_file_line_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jpg\tcat\nb.jpg\tdog\textra\n")
    with pytest.raises(ListFileError) as e:
        parse_list(str(path), kind="file")
    assert str(e.value) == (f"{path}:2: expected 2 tab-separated columns (image, label), got 3: "
                            f"'b.jpg\\tdog\\textra'")


def test_text_list_column_count_follows_the_first_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a\tb\tc\nd\te\n")
    with pytest.raises(ListFileError, match=r":2: expected 3 tab-separated columns .* got 2"):
        parse_list(str(path))


def test_empty_path_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jpg\tcat\n\tdog\n")
    with pytest.raises(ListFileError, match=r"train_data.list:2: empty file path: '\\tdog'"):
        parse_list(str(path), kind="file")


def test_invalid_utf8_is_reported_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, b"a\tb\nc\t\xff\xfe\n")
    with pytest.raises(ListFileError, match=r"train_data.list:2: not valid UTF-8"):
        parse_list(str(path))


def test_empty_and_missing_lists(tmp_path: Path) -> None:
    with pytest.raises(ListFileError, match="has no instances"):
        parse_list(str(write(tmp_path, "\n\n")))
    with pytest.raises(ListFileError, match="no such list file"):
        parse_list(str(tmp_path / "nope.list"))


def test_column_names_override_and_are_validated(tmp_path: Path) -> None:
    path = write(tmp_path, "a\tb\n")
    assert parse_list(str(path), field_names=("src", "dst")).field_names == ("src", "dst")
    with pytest.raises(ListFileError, match="gives 3 names"):
        parse_list(str(path), field_names=("a", "b", "c"))
    commented = write(tmp_path, "# source\ttarget\na\tb\n", "commented.list")
    with pytest.raises(ListFileError) as raised:  # names the first instance's true line
        parse_list(str(commented), field_names=("a", "b", "c"))
    assert str(raised.value) == (f"{commented}:2: --columns gives 3 names ['a', 'b', 'c'] but "
                                 f"the list has 2 columns")
    with pytest.raises(ListFileError, match="reserved"):
        parse_list(str(path), field_names=("_id", "b"))
    with pytest.raises(ListFileError, match="distinct"):
        parse_list(str(path), field_names=("a", "a"))


def test_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ListFileError, match="unknown list kind 'csv'"):
        parse_list(str(write(tmp_path, "a\tb\n")), kind="csv")  # type: ignore[arg-type]


def test_comment_lines_are_skipped_and_do_not_flip_kind_detection(tmp_path: Path) -> None:
    """A `#` comment on line 1 once made the list a text list and the error point at line 2."""
    (tmp_path / "img").mkdir()
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / "img" / name).write_bytes(b"x")
    parsed = parse_list(str(write(tmp_path, "# flowers, v2\nimg/a.jpg\tcat\n"
                                            "#img/old.jpg\tcat\nimg/b.jpg\tdog\n")))
    assert parsed.kind == "file"
    assert [(e.record_id, e.line) for e in parsed.entries] == [(0, 2), (1, 4)]


def test_errors_after_comments_name_the_true_line(tmp_path: Path) -> None:
    with pytest.raises(ListFileError, match=r"train_data.list:3: expected 2 tab-separated"):
        parse_list(str(write(tmp_path, "# header\na\tb\nc\td\te\n")), kind="text")


def test_comments_off_keeps_hash_lines_as_data(tmp_path: Path) -> None:
    parsed = parse_list(str(write(tmp_path, "#tag\tlabel\nplain\tx\n")), kind="text",
                        comments=False)
    assert [e.columns for e in parsed.entries] == [("#tag", "label"), ("plain", "x")]


def test_a_list_of_only_comments_is_empty(tmp_path: Path) -> None:
    with pytest.raises(ListFileError, match="no instances.*# comment"):
        parse_list(str(write(tmp_path, "# nothing yet\n\n")))


def test_a_utf8_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"x")
    parsed = parse_list(str(write(tmp_path, "\ufeffa.jpg\tcat\n".encode())))
    assert parsed.kind == "file"
    assert parsed.entries[0].columns == (str(tmp_path / "a.jpg"), "cat")


def test_kind_detection_reads_separators_and_suffixes_not_only_existing_files(
        tmp_path: Path) -> None:
    """Missing files still mean a file list when the column looks like a path: a separator
    (either slash) or a file suffix; plain words mean text."""
    from trainfeed.formats.listfile import detect_kind

    for column in ("img/missing.jpg", "img/missing", "img\\missing", "missing.png", "scan.tiff"):
        assert detect_kind([(1, f"{column}\tcat")], str(tmp_path)) == "file", column
    for column in ("hello world", "img", "version 2", "  "):
        assert detect_kind([(1, f"{column}\tcat")], str(tmp_path)) == "text", column
    # Only the first 100 rows are looked at.
    rows = [(n, f"word{n}\tx") for n in range(1, 101)] + [(101, "a/b.jpg\tx")]
    assert detect_kind(rows, str(tmp_path)) == "text"
    assert detect_kind(rows[:99] + rows[100:], str(tmp_path)) == "file"


def test_outside_paths_names_every_escape_and_nothing_else(tmp_path: Path) -> None:
    from trainfeed.formats.listfile import ListEntry, outside_paths

    base = tmp_path / "list"
    (base / "img").mkdir(parents=True)
    (base / "img" / "ok.jpg").write_bytes(b"x")
    (tmp_path / "secret").write_text("s")
    (base / "link.jpg").symlink_to(tmp_path / "secret")
    (base / "inner.jpg").symlink_to(base / "img" / "ok.jpg")
    entries = tuple(ListEntry(i, i + 1, (path, "x")) for i, path in enumerate([
        str(base / "img" / "ok.jpg"), str(base / ".." / "secret"), "/etc/passwd",
        str(base / "link.jpg"), str(base / "inner.jpg"), str(base / "img" / ".." / "img")]))
    assert outside_paths(entries, str(base)) == [
        (2, str(base / ".." / "secret")), (3, "/etc/passwd"), (4, str(base / "link.jpg"))]
    assert outside_paths(entries[:1], str(base)) == []


def test_the_empty_list_message_mentions_comments_only_when_they_are_skipped(
        tmp_path: Path) -> None:
    path = write(tmp_path, "\n\n")
    with pytest.raises(ListFileError) as e:
        parse_list(str(path))
    assert str(e.value) == f"{path}: the list has no instances (every line is empty or a # comment)"
    with pytest.raises(ListFileError) as e:
        parse_list(str(path), comments=False)
    assert str(e.value) == f"{path}: the list has no instances (every line is empty)"
