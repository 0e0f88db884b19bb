"""Options and output shared by several subcommands."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TextIO

from trainfeed.storage import STORAGE_ENV, Storage, open_storage
from trainfeed.terminal_text import visible


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", metavar="URL",
                        help=f"fsspec URL of the storage root: a local or mounted folder, "
                             f"s3://bucket/prefix, hdfs://… (default: ${STORAGE_ENV}, else "
                             f"./trainfeed-data)")
    parser.add_argument("--s3-endpoint", metavar="URL",
                        help="endpoint of a non-AWS S3 server (SeaweedFS, MinIO, Ceph); default "
                             "$TRAINFEED_S3_ENDPOINT or $AWS_ENDPOINT_URL; credentials come from "
                             "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")


def storage_from(args: argparse.Namespace) -> Storage:
    return open_storage(args.storage, s3_endpoint=args.s3_endpoint)


def whole_number_or_none(expected: str) -> Callable[[str], int | None]:
    """An argparse type for an option that takes a whole number or 'none' (None); `expected`
    names the number in the error ("a port number")."""
    def parse(text: str) -> int | None:
        if text.lower() == "none":
            return None
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {expected} or 'none', got {text!r}") from None
    return parse


def say(line: str, file: TextIO | None = None) -> None:
    """Prints `line`, which holds text from a master, a storage, a manifest or the cluster,
    with every control character in it shown visibly (trainfeed.terminal_text): such text
    must not move the cursor, retitle the terminal or start a fake line."""
    print(visible(line), file=file or sys.stdout)


def say_cells(*cells: object, file: TextIO | None = None) -> None:
    """Prints `cells` separated by tabs (a table for `cut` and people), each made visible
    alone, so that only the separators are tabs."""
    print("\t".join(visible(str(cell)) for cell in cells), file=file or sys.stdout)
