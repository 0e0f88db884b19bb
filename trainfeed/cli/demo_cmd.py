"""`trainfeed demo`: the quickstart on the embedded default."""
from __future__ import annotations

import argparse

from trainfeed.cli.common import add_storage_options, storage_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="make, upload and read a small image dataset with a master and 2 readers",
        description="Quickstart: writes a few thousand small JPEGs and a .list, uploads them, "
                    "starts a master and reader processes locally and prints what each got.")
    add_storage_options(p)
    p.add_argument("--workers", type=int, default=2, help="reader processes (default 2)")
    p.add_argument("--images", type=int, default=2000, help="images to make (default 2000)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainfeed.demo import run_demo
    return run_demo(storage_from(args), args.workers, args.images)
