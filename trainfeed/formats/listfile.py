"""Parsing `.list` files: one instance per line, tab-separated columns.

Two kinds exist. File lists (`path<TAB>label`) name files relative to the list's folder; the files'
raw bytes become the `image` field. Text lists (`source<TAB>target`, …) are all text. Parsing is
strict and reports `file:line` with the offending line, because a silently dropped or misaligned
row is a training bug that is very hard to find later.

A line whose first character is `#` is a comment and a blank line is skipped; neither gets a
record id, and every error still names the line's number in the file. A UTF-8 byte-order mark
(which some Windows editors write) is dropped. Text lists whose data may start with `#` pass
`comments=False`.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from trainfeed.errors import ListFileError

Kind = Literal["file", "text"]
KINDS: tuple[Kind, ...] = ("file", "text")
# A file list has exactly these columns; their default field names follow Paddle's image readers.
FILE_LIST_COLUMNS = ("image", "label")
COMMENT = "#"
BOM = "\ufeff"


@dataclass(frozen=True)
class ListEntry:
    """One instance: its ordinal (the stable record id), its 1-based line number and columns."""

    record_id: int
    line: int
    columns: tuple[str, ...]


@dataclass(frozen=True)
class ParsedList:
    """A validated `.list` file. For file lists, `entries[i].columns[0]` is an absolute path."""

    path: str
    kind: Kind
    field_names: tuple[str, ...]
    entries: tuple[ListEntry, ...]

    @property
    def label_index(self) -> int | None:
        """Column holding the class label (file lists), else None (text lists have no label)."""
        return 1 if self.kind == "file" else None


def _show(line: str) -> str:
    return repr(line if len(line) <= 200 else line[:200] + "…")


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ListFileError(f"{path}: no such list file") from None
    except IsADirectoryError:
        raise ListFileError(f"{path}: is a folder, expected a .list file") from None
    lines = raw.split(b"\n")
    decoded = []
    for number, line in enumerate(lines, start=1):
        try:
            decoded.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise ListFileError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte "
                                f"{e.start}): {line[:200]!r}") from None
    if decoded and decoded[0].startswith(BOM):
        decoded[0] = decoded[0][len(BOM):]
    return decoded


# A first column ending like a file name ("x.jpg", "scan.tiff"), for kind detection.
_FILE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,4}$")
# How many rows kind detection looks at.
_DETECT_ROWS = 100


def _looks_like_path(first_column: str, base_dir: str) -> bool:
    """A column a file list could mean: an existing file or folder, a path with a separator, or
    a name with a file suffix. Kind detection errs towards "file": a file list detected as text
    publishes path strings silently, while a text list detected as a file list fails loudly
    (its "files" are missing)."""
    column = first_column.strip()
    if not column:
        return False
    return (os.path.exists(os.path.join(base_dir, column)) or "/" in column or "\\" in column
            or bool(_FILE_SUFFIX.search(column)))


def detect_kind(rows: list[tuple[int, str]], base_dir: str) -> Kind:
    """"file" unless no first column of the first rows looks like a path (see above)."""
    if any(_looks_like_path(line.split("\t")[0], base_dir) for _, line in rows[:_DETECT_ROWS]):
        return "file"
    return "text"


def outside_paths(entries: tuple[ListEntry, ...], base_dir: str) -> list[tuple[int, str]]:
    """(line, path) of file-list entries that resolve outside `base_dir`: `..` climbs, absolute
    paths, symlinks pointing out. A list must not make an upload pack files its author did not
    put beside it (`../../etc/passwd` once reached a reader)."""
    root = os.path.realpath(base_dir)
    inside = root if root.endswith(os.sep) else root + os.sep
    parts = [os.path.split(e.columns[0]) for e in entries]
    listed = Counter(folder for folder, _ in parts)
    folders: dict[str, str] = {}  # each folder resolved once: realpath costs an lstat per part
    # Each folder's symlinks, from one scan of it (None: checked path by path, `_symlinks_in`).
    links: dict[str, frozenset[str] | None] = {}

    def resolved(path: str, folder: str, name: str) -> str:
        if name in ("", ".", ".."):
            return os.path.realpath(path)
        if folder not in links:
            links[folder] = _symlinks_in(folder, listed[folder])
        known = links[folder]
        if (name in known) if known is not None else os.path.islink(path):
            return os.path.realpath(path)
        if folder not in folders:
            folders[folder] = os.path.realpath(folder)
        return os.path.join(folders[folder], name)

    def outside(path: str, folder: str, name: str) -> bool:
        real = resolved(path, folder, name)
        return real != root and not real.startswith(inside)

    return [(e.line, e.columns[0]) for e, (folder, name) in zip(entries, parts)
            if outside(e.columns[0], folder, name)]


def _symlinks_in(folder: str, listed: int) -> frozenset[str] | None:
    """The names of the symbolic links in `folder`, from one scan of it (the file types come
    with the names: no lstat per file, 0.07 CPU-s of 10,000 photos' upload), or None when it
    cannot be scanned or holds far more entries than the `listed` paths the list names in it
    (then each of those is checked alone: a few files of a huge folder cost no scan of it)."""
    limit = 4 * listed + 64
    names = []
    try:
        with os.scandir(folder or os.curdir) as found:
            for count, entry in enumerate(found):
                if count >= limit:
                    return None
                if entry.is_symlink():
                    names.append(entry.name)
    except OSError:
        return None
    return frozenset(names)


def parse_list(path: str, kind: Kind | None = None,
               field_names: tuple[str, ...] | None = None,
               comments: bool = True) -> ParsedList:
    """Reads and validates a `.list` file.

    Args:
        path: the list file.
        kind: "file" or "text"; None detects it: "file" if a first column among the first
            100 rows names an existing file or folder, has a path separator or a file suffix;
            "text" only when none does (detect_kind).
        field_names: names for the columns; default `image, label` for file lists and
            `text0, text1, …` for text lists.
        comments: skip lines that start with `#` (the default); False keeps them as data.

    Raises:
        ListFileError: naming `path:line` and the line, for an unreadable file, wrong column
            counts, an empty path, or an empty list. Missing files are not checked here (the
            upload stats them all in parallel and lists every one).
    """
    if kind is not None and kind not in KINDS:
        raise ListFileError(f"unknown list kind {kind!r}; expected one of {sorted(KINDS)}")
    base_dir = os.path.dirname(os.path.abspath(path))
    rows = _instance_rows(path, comments)
    first_line, first = rows[0]
    if kind is None:
        kind = detect_kind(rows, base_dir)
    width = len(FILE_LIST_COLUMNS) if kind == "file" else len(first.split("\t"))
    if field_names is not None:
        _check_field_names(f"{path}:{first_line}", field_names, width)
    names = field_names or (FILE_LIST_COLUMNS if kind == "file"
                            else tuple(f"text{i}" for i in range(width)))
    expected = (f"{width} tab-separated columns ({', '.join(names)})")
    entries = tuple(ListEntry(record_id, number,
                              _columns(path, number, line, kind, width, expected, base_dir))
                    for record_id, (number, line) in enumerate(rows))
    return ParsedList(os.path.abspath(path), kind, names, entries)


def _instance_rows(path: str, comments: bool) -> list[tuple[int, str]]:
    """(line number, line) of every line that is an instance: not blank, not a comment."""
    rows = [(n, line) for n, line in enumerate(_read_lines(path), start=1)
            if line.strip() and not (comments and line.startswith(COMMENT))]
    if not rows:
        raise ListFileError(f"{path}: the list has no instances (every line is empty"
                            f"{' or a # comment' if comments else ''})")
    return rows


def _check_field_names(where: str, field_names: tuple[str, ...], width: int) -> None:
    """Names given for the columns (`--columns`): one per column, distinct, not reserved."""
    if len(field_names) != width:
        raise ListFileError(f"{where}: --columns gives {len(field_names)} names "
                            f"{list(field_names)} but the list has {width} columns")
    if len(set(field_names)) != len(field_names) or any(
            not n or n.startswith("_") for n in field_names):
        raise ListFileError(f"column names must be distinct, non-empty and not start with "
                            f"'_' (reserved): {list(field_names)}")


def _columns(path: str, number: int, line: str, kind: Kind, width: int, expected: str,
             base_dir: str) -> tuple[str, ...]:
    """The columns of line `number` of the list at `path`, a file list's path made absolute."""
    columns = tuple(line.split("\t"))
    if len(columns) != width:
        raise ListFileError(f"{path}:{number}: expected {expected}, got {len(columns)}: "
                            f"{_show(line)}")
    if kind == "file":
        if not columns[0].strip():
            raise ListFileError(f"{path}:{number}: empty file path: {_show(line)}")
        columns = (os.path.join(base_dir, columns[0]),) + columns[1:]
    return columns
