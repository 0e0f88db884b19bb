"""`trainfeed` — entry point: one subcommand per module, each with its own --help."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from trainfeed import __version__
from trainfeed.cli import (
    builtin_cmd,
    datasets_cmd,
    demo_cmd,
    master_cmd,
    preprocess_cmd,
    sql_cmd,
    upload_cmd,
)
from trainfeed.errors import TrainfeedError

COMMANDS = (upload_cmd, master_cmd, datasets_cmd, builtin_cmd, demo_cmd, preprocess_cmd,
            sql_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainfeed",
        description="Feed deep-learning training from shared storage: upload datasets, run the "
                    "master, inspect what is stored.")
    parser.add_argument("--version", action="version", version=f"trainfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except TrainfeedError as e:
        print(f"trainfeed {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
