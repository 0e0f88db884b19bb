"""Session secrets, name bounds and the rate-limited refusal log
(trainfeed.master.core.sessions)."""
from __future__ import annotations

import logging

import pytest

from trainfeed.master.core.sessions import (
    MAX_WORKER_NAME_BYTES,
    SECRET_BYTES,
    RateLimitedLog,
    SessionKeys,
    check_worker_name,
    clip,
)


def test_secrets_are_per_worker_per_key_and_survive_a_saved_key() -> None:
    keys = SessionKeys.new()
    secret = keys.secret("host:1-ab")
    assert len(bytes.fromhex(secret)) == SECRET_BYTES  # 128 bits
    assert keys.is_secret("host:1-ab", secret)
    assert not keys.is_secret("host:1-ac", secret)  # another session
    assert not keys.is_secret("host:1-ab", "")
    assert not keys.is_secret("host:1-ab", secret[:-1] + "x")
    assert not SessionKeys.new().is_secret("host:1-ab", secret)  # another job's key
    restored = SessionKeys.from_state(keys.hex())
    assert restored.is_secret("host:1-ab", secret)  # a restarted master still knows it


def test_a_resume_credential_is_not_the_session_secret() -> None:
    keys = SessionKeys.new()
    credential = keys.resume_credential("w")
    assert credential != keys.secret("w")
    assert keys.is_resume_credential("w", credential) and not keys.is_secret("w", credential)
    assert not keys.is_resume_credential("w", keys.secret("w"))


def test_a_state_without_a_key_gets_a_new_one() -> None:
    assert SessionKeys.from_state(None).key != SessionKeys.from_state(None).key
    with pytest.raises(ValueError, match="at least 16 bytes"):
        SessionKeys(b"short")


def test_worker_names_are_short_and_printable() -> None:
    assert check_worker_name("host:12-rank0") is None
    assert check_worker_name("x" * MAX_WORKER_NAME_BYTES) is None
    too_long = check_worker_name("x" * (MAX_WORKER_NAME_BYTES + 1))
    assert too_long and "257 bytes" in too_long and len(too_long) < 300
    assert "printable" in (check_worker_name("a\nb") or "")
    assert "printable" in (check_worker_name("é") or "")


def test_clip_says_how_long_the_text_was() -> None:
    assert clip("abc") == "abc"
    clipped = clip("x" * 10_000, 10)
    assert clipped.startswith("x" * 10) and "10000 chars" in clipped and len(clipped) < 40


def test_the_refusal_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(logging.getLogger("test.refusals"), every_s=10.0, burst=2)
    with caplog.at_level(logging.WARNING, "test.refusals"):
        said = [log.warning(f"refusal {i}", now=100.0 + i * 0.01) for i in range(1000)]
        assert said[:2] == [True, True] and not any(said[2:])
        assert log.warning("later", now=111.0)
    assert len(caplog.records) == 3
    assert "998 similar line(s) suppressed" in caplog.records[-1].getMessage()
