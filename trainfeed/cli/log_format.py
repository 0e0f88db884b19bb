"""How the CLI's logs look: text for people, or one JSON object per line for log collectors
(`trainfeed --log-format json`, or `$TRAINFEED_LOG_FORMAT=json`).

A JSON line holds `time` (UTC, ISO 8601 with milliseconds), `level`, `logger` and `message`
(arguments already substituted), plus `exception` (the formatted traceback) when one is logged
and `stack` for `stack_info=True`. Each line is a complete object, so a multi-line traceback
never splits into several log entries, which text logs do in Kubernetes' log pipeline.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

from trainfeed import settings

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
        return json.dumps(entry, ensure_ascii=False)


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
                         else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
