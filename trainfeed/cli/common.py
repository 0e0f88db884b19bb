"""Options shared by several subcommands."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from trainfeed.storage import STORAGE_ENV, Storage, open_storage


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
