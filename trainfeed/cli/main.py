"""`trainfeed` — entry point: one subcommand per module, each with its own --help."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import select
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from trainfeed import __version__
from trainfeed.cli.log_format import (
    LOG_FORMAT_ENV,
    LOG_FORMATS,
    configure_logging,
    default_log_format,
)
from trainfeed.cli.redacting import redacted_output
from trainfeed.errors import TrainfeedError
from trainfeed.terminal_text import visible

logger = logging.getLogger("trainfeed.cli")
# Each subcommand's module, in `--help` order. Only the module of the command being run is
# imported (with `--help` or no command: all of them), so that `trainfeed upload` does not pay
# for the master's, the cluster's and the reader's imports (tests/test_cli.py checks the table).
COMMAND_MODULES: dict[str, str] = {
    "upload": "upload_cmd", "master": "master_cmd", "health": "health_cmd",
    "ls": "datasets_cmd", "info": "datasets_cmd", "publish-builtin": "builtin_cmd",
    "demo": "demo_cmd", "preprocess": "preprocess_cmd", "sql": "sql_cmd",
    "submit": "cluster_cmd", "scale": "cluster_cmd", "status": "cluster_cmd",
    "delete": "cluster_cmd", "submit-upload": "submit_upload_cmd",
    "upload-slice": "submit_upload_cmd", "upload-commit": "submit_upload_cmd",
    "doctor": "doctor_cmd", "token": "token_cmd", "decoder": "decoder_cmd",
}


# Each command's line in `trainfeed --help`, in the same order: the list is printed without
# importing any command's module (0.69 -> 0.06 CPU-s). The modules register the same text
# (tests/test_cli_start.py compares them).
COMMAND_HELP: dict[str, str] = {
    "upload": "pack a .list file into a dataset",
    "master": "run the master (hands out partitions over gRPC)",
    "health": "check that a master serves (exit 0 if SERVING): for exec probes",
    "ls": "list the published datasets",
    "info": "show one dataset's manifest",
    "publish-builtin": "publish preset datasets under public/",
    "demo": "make, upload and read a small image dataset with a master and 2 readers",
    "preprocess": "pack arrays into mini-batch buffers (MADlib training_preprocessor_dl)",
    "sql": "publish a SQL query as a dataset (PostgreSQL or SQLite)",
    "submit": "run a training job on Kubernetes (master + GPU workers)",
    "scale": "change the number of worker pods of a job",
    "status": "a job's progress (from its master) and pods (from Kubernetes); uploads in "
              "progress (--uploads)",
    "delete": "delete a job's objects from Kubernetes",
    "submit-upload": "upload a .list as a Kubernetes Indexed Job of packers",
    "upload-slice": "pack one slice of an upload (an index of submit-upload's Job)",
    "upload-commit": "publish an upload packed as slices, once every slice is done",
    "doctor": "show versions, decoders, extras and settings (paste into bug reports)",
    "token": "print a token that opens one job only",
    "decoder": "run a decode worker (trainers with TRAINFEED_DECODE=remote send it partitions)",
}

# Commands whose process uses numpy only to move bytes, never for linear algebra: numpy's
# OpenBLAS starts a thread per core at import, which spins ~0.1 CPU-s before it sleeps (issue 30
# §2: 7 % of a 3,000-photo upload's CPU). They ask OpenBLAS for one thread, unless the caller
# chose otherwise ($OPENBLAS_NUM_THREADS set) or numpy is already loaded (main called in-process).
ONE_BLAS_THREAD_COMMANDS = frozenset({"upload", "upload-slice", "upload-commit"})


def command_named(argv: Sequence[str] | None) -> str | None:
    """The subcommand `argv` names, if any (its first word that is one)."""
    return next((a for a in argv or () if a in COMMAND_MODULES), None)


def command_modules(argv: Sequence[str] | None = None) -> list[Any]:
    """The modules registering the command named in `argv` (all of them when none is)."""
    named = command_named(argv)
    names = [COMMAND_MODULES[named]] if named is not None else list(
        dict.fromkeys(COMMAND_MODULES.values()))
    return [importlib.import_module(f"trainfeed.cli.{name}") for name in names]


def build_parser(argv: Sequence[str] | None = None,
                 listing: bool = False) -> argparse.ArgumentParser:
    """The CLI's parser; given the arguments, with only the subcommand they name. `listing`:
    every command by name and line of help only (COMMAND_HELP), none of their modules
    imported: enough for arguments that name no command (`--help`, `--version`, a typo)."""
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
    if listing:
        for name, text in COMMAND_HELP.items():
            sub.add_parser(name, help=text)
        return parser
    for module in command_modules(argv):
        module.register(sub)
    return parser


#: A shell's exit status for a process ended by SIGPIPE (128 + 13): what `trainfeed info DS |
#: head` reports, as `cat` would, when `head` has read enough and closed the pipe.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one subcommand; returns its exit status (2 for a TrainfeedError, 1 for anything
    unexpected, 130 for Ctrl-C, 141 when the reader of stdout went away).

    Everything it writes to stdout and stderr, tracebacks and logs included, has the
    credentials of any URL it was given (arguments, environment) masked (cli.redacting).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if command_named(argv) in ONE_BLAS_THREAD_COMMANDS and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    with redacted_output([*argv, *os.environ.values()]):
        return _main(argv)


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (`| head` that has read enough).

    Then (only then) stdout is pointed at /dev/null, so that Python's own flush at exit does
    not fail a second time: the quiet ending the Python docs recommend, rather than restoring
    SIGPIPE's default action, which would also kill a master whose metrics client hung up.
    """
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(events & select.POLLERR for _, events in poller.poll(0))
        if gone:
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        return gone
    except (OSError, ValueError, AttributeError):  # no real stdout (captured, embedded)
        return False


def _main(argv: Sequence[str]) -> int:
    parser = build_parser(argv, listing=command_named(argv) is None)
    args = parser.parse_args(argv)
    if args.log_format is None:
        try:
            args.log_format = default_log_format()
        except ValueError as e:
            parser.error(str(e))
    configure_logging(args.log_format, args.verbose)
    json_logs = args.log_format == "json"
    try:
        status = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, inside main, not at interpreter exit
        return status
    except BrokenPipeError:
        if _stdout_gone():
            return EXIT_BROKEN_PIPE
        _report_unexpected(args.command, json_logs)
        return 1
    except TrainfeedError as e:
        if json_logs:  # a log collector gets the reason as one entry, like every other line
            logger.error("trainfeed %s: error: %s", args.command, e)
        else:
            # An error may quote a master's, a storage's or a manifest's text: shown visibly.
            print(visible(f"trainfeed {args.command}: error: {e}", multiline=True),
                  file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception:
        _report_unexpected(args.command, json_logs)
        return 1


def _report_unexpected(command: str, json_logs: bool) -> None:
    """The traceback of the exception being handled, printed here rather than by Python at
    exit so that it passes the redaction (and, shown visibly, any text its message quotes)."""
    if json_logs:
        logger.exception("trainfeed %s failed", command)  # the traceback as one entry
    else:
        sys.stderr.write(visible(traceback.format_exc(), multiline=True))


if __name__ == "__main__":
    sys.exit(main())
