"""The CLI's last line of defence for URL credentials: whatever the process writes to stdout
or stderr (its messages, its log lines, a traceback, a thread's dying words, a warning) passes
through trainfeed.redaction first.

Code that raises with a URL should redact it itself (trainfeed.redaction.redact_url); this
catches what it did not, e.g. `ValueError: etcd state URL 'etcd://root:PW@…'` from a parser
deep below, or a driver quoting its connection string. The secrets looked for are those of
every URL the process was given (its arguments and its environment), plus the password of any
`scheme://user:password@` that a line shows.

Limits: only Python-level writes to `sys.stdout`/`sys.stderr` are covered, not what C code
writes to file descriptors 1 and 2 itself (gRPC's core logs no URLs of ours); and a secret is
found within one `write()` call, which print(), logging and traceback printing each make per
line or per message.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TextIO

from trainfeed.redaction import redact_text, secrets_in

__all__ = ["RedactingStream", "redacted_output", "unredacted"]


class RedactingStream:
    """A text stream that writes `redact(text)` to `stream`; everything else (flush, fileno,
    isatty, encoding…) is the wrapped stream's. Thread-safe as far as the wrapped stream is."""

    def __init__(self, stream: TextIO, redact: Callable[[str], str]) -> None:
        self.stream = stream
        self.redact = redact

    def write(self, text: str) -> int:
        self.stream.write(self.redact(text))
        return len(text)  # what the caller asked to write, as TextIO.write promises

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextmanager
def redacted_output(given: Iterable[str]) -> Iterator[Callable[[str], str]]:
    """Within the block, sys.stdout and sys.stderr redact the secrets of every URL in `given`
    (e.g. `sys.argv + list(os.environ.values())`) and of any URL they show; yields the
    redacting function. Restores both streams on exit (a logging handler made inside keeps
    its redacting stream, which still writes to the original)."""
    redact = partial(redact_text, secrets=secrets_in(given))
    saved = sys.stdout, sys.stderr
    sys.stdout = RedactingStream(saved[0], redact)  # type: ignore[assignment]
    sys.stderr = RedactingStream(saved[1], redact)  # type: ignore[assignment]
    try:
        yield redact
    finally:
        sys.stdout, sys.stderr = saved


def unredacted(stream: TextIO) -> TextIO:
    """The stream beneath a RedactingStream (else `stream` itself), for output that is data a
    program takes as it is, not a message: `submit --dry-run`'s manifests, piped to `kubectl
    apply`, must hold the URLs they were given (masked, they would deploy `***`)."""
    inner = stream.stream if isinstance(stream, RedactingStream) else stream
    return inner
