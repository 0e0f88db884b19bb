"""Reader sessions of a job: who may speak as a worker id, and bounds on what callers may send.

Issue 25 found that a job token was enough to report as another reader (its worker id and lease
tokens leaked into error texts and logs, and ids were never checked). Now `OpenJob` gives each
session a secret, and every later call of the session must carry it.

Secrets are derived, not stored: a session's secret is HMAC-SHA256(job key, worker id), where the
job key is 256 random bits made when the job is created and saved with the job's state (its
snapshot, never the journal). So a restarted master still knows every session of its jobs, with no
per-session record to journal, and nobody without the key can compute a secret (a worker id, which
logs and status may show, gives nothing away). A checkpoint carries the session's resume
credential, derived with another label: it lets a restored reader rewind that session's work
(re-deliver records) but not act as the session. Read access to the state store is therefore
access to every session: the store is as trusted as the master itself (whoever can write it can
rewrite the ledger anyway).

Bounds: worker names at most MAX_WORKER_NAME_BYTES printable ASCII bytes; at most `max_sessions`
live sessions per job (MasterConfig); refusals logged through a `RateLimitedLog` with every
caller-chosen text clipped.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field

# A name is for people reading logs (host:pid, rank0-host:pid): 256 bytes is ample, and keeps what
# the master holds per session small (issue 25: 1 MiB names grew the master by 370 MB).
MAX_WORKER_NAME_BYTES = 256
# Live sessions (heard from within three lease timeouts) per job: far above any trainer fleet
# seen (hundreds of readers), far below what makes a master slow (it counts them per OpenJob).
DEFAULT_MAX_SESSIONS = 4096
# 256-bit keys; secrets and credentials are 128 bits of an HMAC-SHA256, as hex.
KEY_BYTES = 32
SECRET_BYTES = 16
# Caller-chosen text (worker ids, names, reasons) in a log line or error: at most this many chars.
CLIP_CHARS = 120


def clip(text: str, limit: int = CLIP_CHARS) -> str:
    """`text` cut to `limit` characters, saying how long it was: a hostile caller's 4 MiB name
    must not reach a log in full."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text)} chars]"


def check_worker_name(name: str, what: str = "worker name") -> str | None:
    """None if `name` may name a worker, else why not (for INVALID_ARGUMENT)."""
    raw = name.encode("utf-8", "replace")
    if len(raw) > MAX_WORKER_NAME_BYTES:
        return (f"{what} of {len(raw)} bytes ({clip(name, 40)!r}): at most "
                f"{MAX_WORKER_NAME_BYTES} bytes; name the reader host:pid (the default)")
    if not (name.isascii() and name.isprintable()):
        return (f"{what} {clip(name, 40)!r}: only printable ASCII characters may name a "
                f"worker (it appears in logs)")
    return None


@dataclass(frozen=True)
class SessionKeys:
    """One job's session key: derives and checks the secrets of its sessions. Immutable, so
    thread-safe; checks take the same time wherever a guess differs (`hmac.compare_digest`)."""

    key: bytes

    def __post_init__(self) -> None:
        if len(self.key) < 16:
            raise ValueError(f"a session key needs at least 16 bytes, got {len(self.key)}")

    @classmethod
    def new(cls) -> SessionKeys:
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def from_state(cls, saved: str | None) -> SessionKeys:
        """The key saved with a job (`hex()`); a new one for a state older than sessions (its
        readers, which carry no secret, must open a new session)."""
        return cls(bytes.fromhex(saved)) if saved else cls.new()

    def hex(self) -> str:
        return self.key.hex()

    def _derive(self, label: bytes, worker: str) -> str:
        mac = hmac.new(self.key, label + b"\0" + worker.encode("utf-8", "surrogatepass"),
                       hashlib.sha256)
        return mac.hexdigest()[:2 * SECRET_BYTES]

    def secret(self, worker: str) -> str:
        """What every call of session `worker` carries (OpenJobResponse.session_secret)."""
        return self._derive(b"session", worker)

    def resume_credential(self, worker: str) -> str:
        """What a checkpoint of `worker` carries to rewind its work (ResumePosition.credential)."""
        return self._derive(b"resume", worker)

    def is_secret(self, worker: str, given: str) -> bool:
        return hmac.compare_digest(self.secret(worker).encode(), given.encode("utf-8", "replace"))

    def is_resume_credential(self, worker: str, given: str) -> bool:
        return hmac.compare_digest(self.resume_credential(worker).encode(),
                                   given.encode("utf-8", "replace"))


@dataclass
class RateLimitedLog:
    """At most `burst` warnings per `every_s` seconds; the rest are counted and their number is
    said by the next line logged. Hostile callers can make refusals as fast as the network
    allows (issue 25: 300 MB of log in 7 s); the log must stay readable and bounded."""

    logger: logging.Logger
    every_s: float = 10.0
    burst: int = 5
    _window_start: float = float("-inf")
    _in_window: int = 0
    _suppressed: int = field(default=0)

    def warning(self, message: str, now: float | None = None) -> bool:
        """Logs `message` (already clipped by the caller) unless over the rate; returns whether
        it did."""
        now = time.monotonic() if now is None else now
        if now - self._window_start >= self.every_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self._suppressed += 1
            return False
        self._in_window += 1
        if self._suppressed:
            message += f" ({self._suppressed} similar line(s) suppressed before this one)"
            self._suppressed = 0
        self.logger.warning("%s", message)
        return True
