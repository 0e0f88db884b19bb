"""`trainfeed doctor`: versions, decoders, extras and settings in effect, for bug reports."""
from __future__ import annotations

import argparse
import json

from trainfeed.doctor import render, report
from trainfeed.terminal_text import visible


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor", help="show versions, decoders, extras and settings (paste into bug reports)",
        description="Print what this installation is: Python and package versions, which "
                    "library decodes each image format (JPEG must say simplejpeg / "
                    "libjpeg-turbo), which extras are installed, and the storage, master and "
                    "state settings the environment selects. Tokens and keys are shown as "
                    "set/unset, never their values.")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    info = report()
    # Settings come from the environment: shown visibly (JSON escapes them itself).
    print(json.dumps(info, indent=2) if args.json else visible(render(info), multiline=True))
    return 0
