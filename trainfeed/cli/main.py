"""`trainfeed` — entry point: one subcommand per module, each with its own --help."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from trainfeed import __version__
from trainfeed.cli import (
    builtin_cmd,
    cluster_cmd,
    datasets_cmd,
    demo_cmd,
    doctor_cmd,
    health_cmd,
    master_cmd,
    preprocess_cmd,
    sql_cmd,
    token_cmd,
    upload_cmd,
)
from trainfeed.cli.log_format import (
    LOG_FORMAT_ENV,
    LOG_FORMATS,
    configure_logging,
    default_log_format,
)
from trainfeed.errors import TrainfeedError

logger = logging.getLogger("trainfeed.cli")
COMMANDS = (upload_cmd, master_cmd, health_cmd, datasets_cmd, builtin_cmd, demo_cmd,
            preprocess_cmd, sql_cmd, cluster_cmd, doctor_cmd, token_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainfeed",
        description="Feed deep-learning training from shared storage: upload datasets, run the "
                    "master, inspect what is stored.")
    parser.add_argument("--version", action="version", version=f"trainfeed {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                        help=f"'text' (default) or 'json': one JSON object per line with time, "
                             f"level, logger, message and exception, for log collectors "
                             f"(default ${LOG_FORMAT_ENV}, else text)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_format is None:
        try:
            args.log_format = default_log_format()
        except ValueError as e:
            parser.error(str(e))
    configure_logging(args.log_format, args.verbose)
    json_logs = args.log_format == "json"
    try:
        return int(args.run(args) or 0)
    except TrainfeedError as e:
        if json_logs:  # a log collector gets the reason as one entry, like every other line
            logger.error("trainfeed %s: error: %s", args.command, e)
        else:
            print(f"trainfeed {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception:
        if not json_logs:
            raise
        logger.exception("trainfeed %s failed", args.command)  # the traceback as one entry
        return 1


if __name__ == "__main__":
    sys.exit(main())
