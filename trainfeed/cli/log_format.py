"""How the CLI's logs look: text for people, or one JSON object per line for log collectors
(`trainfeed --log-format json`, or `$TRAINFEED_LOG_FORMAT=json`).

A JSON line holds `time` (UTC, ISO 8601 with milliseconds), `level`, `logger` and `message`
(arguments already substituted), plus `exception` (the formatted traceback) when one is logged
and `stack` for `stack_info=True`. Each line is a complete object, so a multi-line traceback
never splits into several log entries, which text logs do in Kubernetes' log pipeline.

Both formats show control characters visibly (trainfeed.terminal_text): a FAILED reason or a
worker's text quoted in a message must not move the cursor, retitle the terminal or start a
fake line. A text record's message is one line (`\\n` shown as such); its traceback keeps its
lines. A JSON line escapes what `json.dumps` leaves raw (DEL, the C1 controls, bidi and other
format characters) as `\\u` escapes of JSON itself, so a collector decodes the same message.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from trainfeed import settings
from trainfeed.terminal_text import visible

LOG_FORMAT_ENV = settings.LOG_FORMAT.name
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, timezone.utc)
        entry = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json_visible(json.dumps(entry, ensure_ascii=False))


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT with untrusted text made visible: the message on one line, the traceback
    and stack with their line breaks but no other control character."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return visible(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return visible(super().formatException(ei), multiline=True)

    def formatStack(self, stack_info: str) -> str:
        return visible(super().formatStack(stack_info), multiline=True)


def json_visible(line: str) -> str:
    """A line of JSON (`ensure_ascii=False`) with every non-printable character left in it
    written as a JSON `\\uXXXX` escape (a surrogate pair beyond U+FFFF): still the same JSON
    value, with nothing in it a terminal obeys. Printable non-ASCII text stays as it is."""
    if line.isprintable():
        return line
    return "".join(char if char.isprintable() else _json_escape(char) for char in line)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def default_log_format() -> str:
    """`$TRAINFEED_LOG_FORMAT`, else "text"; ValueError naming the variable if unknown."""
    value = settings.LOG_FORMAT.get()
    if value not in LOG_FORMATS:
        raise ValueError(f"${LOG_FORMAT_ENV}={value!r}: expected one of {list(LOG_FORMATS)}")
    return value


def configure_logging(log_format: str, verbose: bool = False) -> None:
    """Sends the root logger's records to stderr in `log_format`. Like logging.basicConfig,
    does nothing if the root logger has handlers already (pytest's, or an embedding program's,
    which this must not replace)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; expected one of "
                         f"{list(LOG_FORMATS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else TextFormatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
