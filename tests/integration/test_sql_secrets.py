"""No secret from a database URL reaches a manifest, a log line or an error message: PostgreSQL
URLs carrying a password (user info, `password=`), an `sslpassword` and tokens are registered
as datasets and read, and made to fail (unknown host, refused port, bad query, an unknown
parameter), against a real server. The server trusts loopback, so the secrets are never needed
to connect: the test is where they travel, not whether they work."""
from __future__ import annotations

import json
import logging
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from trainfeed import LocalSource, dist
from trainfeed.errors import TrainfeedError
from trainfeed.sql import register_sql_dataset, sql

pytestmark = pytest.mark.integration

PASSWORD = "pw-Xq81zL"
SSL_PASSWORD = "sslpw-Tm42vK"
TOKEN = "tok-Rb77nW"
SECRETS = (PASSWORD, SSL_PASSWORD, TOKEN)


def everything_said(error: BaseException) -> str:
    """The exception as a user sees it: message, repr, and the whole chained traceback."""
    return "\n".join([str(error), repr(error),
                      *traceback.format_exception(type(error), error, error.__traceback__)])


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} reached {where}"


def assert_no_secret_in_files(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert_no_secret(path.read_bytes().decode("utf-8", "replace"), str(path))


@pytest.fixture
def table(postgres_url: str) -> str:
    name = f"orders_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(f"CREATE TABLE {name} AS SELECT i AS id, i * 2 AS value "
                   f"FROM generate_series(0, 199) AS i")
    return name


def test_a_registered_query_keeps_no_secret_and_an_ipv6_host_stays_bracketed(
        postgres_url: str, table: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port = urlsplit(postgres_url).port
    # libpq tries [::1] first (nothing listens there: the server is on 127.0.0.1), then the
    # IPv4 host: the URL must reach the manifest with both hosts as written.
    url = (f"postgresql://postgres:{PASSWORD}@[::1]:{port},127.0.0.1:{port}/postgres"
           f"?sslpassword={SSL_PASSWORD}&connect_timeout=5&application_name=trainfeed-test")
    storage = tmp_path / "storage"
    manifest = register_sql_dataset("orders", sql(f"SELECT * FROM {table}", url,
                                                  key_columns=["id"]),
                                    str(storage), num_partitions=8)
    stored = manifest.extra["sql"]["url"]
    assert stored == (f"postgresql://postgres@[::1]:{port},127.0.0.1:{port}/postgres"
                      f"?connect_timeout=5&application_name=trainfeed-test")
    assert_no_secret(json.dumps(manifest.extra), "the manifest")
    assert_no_secret_in_files(storage)
    # The stored URL works for a reader (this server trusts it; a real one would take the
    # password from PGPASSWORD or ~/.pgpass).
    reader = dist.reader("orders", source=LocalSource(storage=str(storage)))
    ids = sorted(row[0] for row in reader())
    assert ids == list(range(200))
    assert_no_secret("\n".join(r.getMessage() for r in caplog.records), "a log record")


@pytest.mark.parametrize("make_url,query", [
    # an unknown host (DNS fails)
    (lambda port: f"postgresql://postgres:{PASSWORD}@no-such-host.invalid:{port}/postgres"
                  f"?sslpassword={SSL_PASSWORD}&connect_timeout=5", "SELECT 1"),
    # a port nothing listens on, the password in the query
    (lambda port: f"postgresql://postgres@127.0.0.1:1/postgres?password={PASSWORD}"
                  f"&connect_timeout=5", "SELECT 1"),
    # a bad query on a working connection
    (lambda port: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/postgres"
                  f"?sslpassword={SSL_PASSWORD}", "SELECT * FROM no_such_table_here"),
    # a parameter libpq does not know, holding a token
    (lambda port: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/postgres"
                  f"?api_token={TOKEN}", "SELECT 1"),
], ids=["unknown-host", "refused-port", "bad-query", "unknown-parameter"])
def test_a_failing_registration_says_nothing_secret(
        postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        make_url: Callable[[int | None], str], query: str) -> None:
    caplog.set_level(logging.DEBUG)
    url = make_url(urlsplit(postgres_url).port)
    storage = tmp_path / "storage"
    with pytest.raises(TrainfeedError) as caught:
        register_sql_dataset("broken", sql(query, url), str(storage))
    said = everything_said(caught.value)
    assert "SQL query failed on postgresql://postgres" in said  # the URL is named, redacted
    assert_no_secret(said, "the exception")
    assert_no_secret("\n".join(r.getMessage() for r in caplog.records), "a log record")
    if storage.exists():
        assert_no_secret_in_files(storage)
    assert not (storage / "broken").exists()  # nothing published


def test_the_cli_reports_a_failure_without_the_secret(
        postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    from trainfeed.cli.main import main

    caplog.set_level(logging.DEBUG)
    port = urlsplit(postgres_url).port
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/postgres?sslpassword={SSL_PASSWORD}"
    assert main(["sql", "broken", "--query", "SELECT nope FROM no_such_table_here", "--db", url,
                 "--storage", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "no_such_table_here" in err
    assert_no_secret(out + err, "the CLI's output")
    assert_no_secret("\n".join(r.getMessage() for r in caplog.records), "a log record")
