"""`trainfeed publish-builtin`: fill the storage's public/ area with preset datasets."""
from __future__ import annotations

import argparse

from trainfeed.builtin import BUILTIN, publish_builtin
from trainfeed.cli.common import add_storage_options, storage_from


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish-builtin", help="publish preset datasets under public/",
        description="Write datasets that ship inside PyPI packages (scikit-learn's handwritten "
                    "digits) to public/NAME, readable by every job as dist.reader('public/NAME').")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"datasets to publish (default: all of {', '.join(sorted(BUILTIN))})")
    add_storage_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for r in publish_builtin(storage_from(args), args.names or None):
        state = "already published" if r.already_published else "published"
        print(f"{state}: {r.dataset} ({r.num_records} records) at {r.url}")
    return 0
