"""trainfeed.redaction: passwords and tokens never leave a URL that is shown or stored, with and
without psycopg's libpq parser, and nothing else of the URL changes (an IPv6 host stays
bracketed). The SQLite half of "no secret reaches a manifest, a log or an error" is here; the
PostgreSQL half is tests/integration/test_sql_secrets.py."""
from __future__ import annotations

import logging
import sqlite3
import sys
import traceback
from pathlib import Path

import pytest

from trainfeed.redaction import REDACTED, redact_url, scrub, url_secrets
from trainfeed.settings import settings_in_effect
from trainfeed.sql import SqlError, register_sql_dataset, sql

SECRET = "s3cret-Zq8"

# (url, shown, stored): what people see, and what a manifest keeps.
CASES = [
    ("postgresql://alice@db/shop?password=s3cret-Zq8",
     "postgresql://alice@db/shop?password=***", "postgresql://alice@db/shop"),
    ("postgresql://alice:s3cret-Zq8@[::1]:5432/shop",
     "postgresql://alice:***@[::1]:5432/shop", "postgresql://alice@[::1]:5432/shop"),
    ("postgresql://alice@[::1],h2:5433/shop?sslmode=require&sslpassword=s3cret-Zq8",
     "postgresql://alice@[::1],h2:5433/shop?sslmode=require&sslpassword=***",
     "postgresql://alice@[::1],h2:5433/shop?sslmode=require"),
    ("postgres://bob:s3cret-Zq8@db/x?application_name=t&sslkey=/keys/k.pem",
     "postgres://bob:***@db/x?application_name=t&sslkey=/keys/k.pem",
     "postgres://bob@db/x?application_name=t&sslkey=/keys/k.pem"),
    ("postgresql://u@db/x?oauth_client_secret=s3cret-Zq8&access_token=s3cret-Zq8",
     "postgresql://u@db/x?oauth_client_secret=***&access_token=***", "postgresql://u@db/x"),
    ("postgresql://u@db/x?pass%77ord=s3cret-Zq8",
     "postgresql://u@db/x?pass%77ord=***", "postgresql://u@db/x"),
    ("s3://bucket/data?X-Amz-Signature=s3cret-Zq8&versionId=3",
     "s3://bucket/data?X-Amz-Signature=***&versionId=3", "s3://bucket/data?versionId=3"),
    ("etcd://root:s3cret-Zq8@etcd:2379/trainfeed?ttl=5",
     "etcd://root:***@etcd:2379/trainfeed?ttl=5", "etcd://root@etcd:2379/trainfeed?ttl=5"),
]


@pytest.mark.parametrize("url,shown,stored", CASES)
def test_secrets_are_masked_for_people_and_dropped_for_manifests(url: str, shown: str,
                                                                 stored: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(url, drop=True) == stored
    assert SECRET not in shown and SECRET not in stored


def test_urls_without_secrets_and_plain_paths_are_kept_exactly() -> None:
    for url in ["postgresql://alice@[::1]:5432/shop", "postgresql://[::1]/x?sslmode=disable",
                "sqlite:///data/shop.db", "/data/shop.db", "s3://bucket/prefix",
                "postgresql://alice@db1:5432,db2:5433/shop?target_session_attrs=read-write"]:
        assert redact_url(url) == url == redact_url(url, drop=True)


def test_libpq_reads_a_password_where_a_generic_parser_sees_none() -> None:
    # libpq: the user info runs to the first '@' before any '/', so the password is "p?x".
    pytest.importorskip("psycopg")
    url = "postgresql://alice:s3cret?Zq8@db/shop"
    assert "s3cret" not in redact_url(url) and "s3cret" not in redact_url(url, drop=True)
    assert redact_url(url) == f"postgresql://alice:{REDACTED}@db/shop"


def test_without_psycopg_the_textual_rules_still_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` raises ImportError
    monkeypatch.setitem(sys.modules, "psycopg.conninfo", None)
    for url, shown, stored in CASES:
        assert redact_url(url) == shown and redact_url(url, drop=True) == stored


def test_a_driver_message_is_scrubbed_of_every_form_of_the_secret() -> None:
    url = "postgresql://alice:s3cret%2FZq8@db/shop?sslpassword=other-secret"
    assert set(url_secrets(url)) >= {"s3cret%2FZq8", "s3cret/Zq8", "other-secret"}
    message = "auth failed for s3cret/Zq8 (s3cret%2FZq8), key other-secret"
    assert scrub(message, url) == "auth failed for *** (***), key ***"


def test_settings_in_effect_masks_a_url_password() -> None:
    shown = settings_in_effect({"TRAINFEED_STATE": f"etcd://root:{SECRET}@etcd:2379",
                                "TRAINFEED_STORAGE": f"https://u:{SECRET}@files.example/x"})
    assert SECRET not in repr(shown)
    assert shown["TRAINFEED_STATE"] == "etcd://root:***@etcd:2379"


def everything_said(error: BaseException) -> str:
    """The exception as a user sees it: message, repr, and the whole chained traceback."""
    return "\n".join([str(error), repr(error),
                      *traceback.format_exception(type(error), error, error.__traceback__)])


def test_sqlite_registration_and_its_errors_hold_no_secret(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "shop.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO orders VALUES (?, ?)", [(i, f"n{i}") for i in range(40)])
    storage = tmp_path / "storage"
    manifest = register_sql_dataset("orders", sql("SELECT * FROM orders", f"sqlite:///{db}"),
                                    str(storage), num_partitions=4)
    assert manifest.extra["sql"]["url"] == f"sqlite:///{db}"
    # A URL carrying a token (which SQLite cannot use: the file does not exist) fails at
    # registration, naming the URL with the token masked.
    secret_url = f"sqlite:///{tmp_path}/missing.db?access_token={SECRET}"
    with pytest.raises(SqlError) as caught:
        register_sql_dataset("leaky", sql("SELECT 1", secret_url), str(storage))
    assert "access_token=***" in str(caught.value)
    with pytest.raises(ValueError) as bad_scheme:
        sql("SELECT 1", f"mysql://root:{SECRET}@db/x")
    for error in (caught.value, bad_scheme.value):
        assert SECRET not in everything_said(error)
    assert repr(sql("SELECT 1", f"postgresql://a:{SECRET}@db/x")).count(SECRET) == 0
    assert not [r for r in caplog.records if SECRET in r.getMessage()]
    for path in storage.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
