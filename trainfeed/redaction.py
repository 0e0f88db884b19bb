"""Secrets out of URLs: the one redaction of trainfeed, for messages, logs and manifests.

A database URL may carry a password in its user info (`postgresql://alice:s3cret@db/shop`) or
in its query (`?password=…`, `?sslpassword=…`), and any URL may carry a token in a query
parameter (`?token=…`, `?X-Amz-Signature=…`). :func:`redact_url` replaces those with `***` for
people to read, or drops them (`drop=True`) for a URL that other processes will use and that
must not hold a secret (a SQL dataset's manifest: its workers take the password from their own
environment, `PGPASSWORD` or `~/.pgpass`, as libpq does).

The rewrite is textual: everything that is not a secret is kept as written, so a host `[::1]`
stays `[::1]` and several hosts stay several. For PostgreSQL URLs, libpq's own parser
(`psycopg.conninfo`, when the `sql` extra is installed) decides what the password is, so a URL
libpq reads differently from a generic URL parser (`postgresql://a:p?x@db`, a password `p?x`)
leaks nothing either; without psycopg (SQLite, etcd, S3 URLs) the textual rules alone apply.

This module sits at the bottom of the house (no trainfeed imports): settings, storage and the
SQL sources all use it.

Example:
    >>> redact_url("postgresql://alice:s3cret@[::1]:5432/shop?sslpassword=x&sslmode=require")
    'postgresql://alice:***@[::1]:5432/shop?sslpassword=***&sslmode=require'
    >>> redact_url("postgresql://alice@db/shop?password=s3cret", drop=True)
    'postgresql://alice@db/shop'
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote

__all__ = ["MIN_KNOWN_SECRET_CHARS", "REDACTED", "is_secret_parameter", "redact_text",
           "redact_url", "scrub", "secrets_in", "url_secrets"]

#: What a secret is replaced with in text meant for people.
REDACTED = "***"

#: A known secret (:func:`secrets_in`) shorter than this is masked only where it stands in a
#: URL, not everywhere: masking every "pw" of a traceback would garble it beyond reading.
MIN_KNOWN_SECRET_CHARS = 4

# A URL inside free text: a scheme, then anything up to a blank, a quote or a bracket (the
# ends of a URL in a message, a repr or a log line). Within one command-line argument or
# environment value, a URL runs to the end of the value (_URL_TO_END), quotes included.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_URL_TO_END = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://.*", re.DOTALL)

# Query parameters whose values are secrets: libpq's password and sslpassword, OAuth client
# secrets, bearer and session tokens, API and access keys, signed-URL signatures and
# credentials. `sslkey`/`sslcert`/`passfile` name files, not secrets, and are kept.
_SECRET_PARAMETER = re.compile(
    r"pass(word|wd)?$|pwd$|secret|token|credential|signature|^sig$|api_?key|access_?key|^key$"
    r"|^auth", re.IGNORECASE)
_POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_secret_parameter(name: str) -> bool:
    """Whether a URL query (or libpq connection) parameter named `name` holds a secret."""
    return bool(_SECRET_PARAMETER.search(unquote(name)))


def redact_url(url: str, *, drop: bool = False) -> str:
    """`url` with every secret replaced by `***` (or, with `drop`, removed).

    Secrets are the password of the user info and the values of secret query parameters
    (see :func:`is_secret_parameter`). Everything else is kept exactly as written. A string
    without `://` (a plain path) is returned unchanged.

    Args:
        url: Any URL.
        drop: Remove the secrets instead of masking them: the result is a working URL for a
            process that has the secrets from elsewhere (its environment).
    """
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    userinfo, hosts, path, query = _split(rest)
    found: set[str] = set()
    if userinfo is not None and ":" in userinfo:
        user, password = userinfo.split(":", 1)
        found.add(password)
        userinfo = user if drop else f"{user}:{REDACTED}"
    kept: list[str] = []
    for parameter in query.split("&") if query else []:
        name, eq, value = parameter.partition("=")
        if eq and is_secret_parameter(name):
            found.add(value)
            if drop:
                continue
            parameter = f"{name}={REDACTED}"
        kept.append(parameter)
    result = (f"{scheme}://{'' if userinfo is None else userinfo + '@'}{hosts}{path}"
              + (f"?{'&'.join(kept)}" if kept else ""))
    # libpq may read a secret where the textual rules saw none; never let one through.
    for secret in _libpq_secrets(scheme, url) - {unquote(s) for s in found} - found:
        for form in sorted({secret, quote(secret, safe="")}, key=len, reverse=True):
            result = result.replace(form, REDACTED)
    return result


def url_secrets(url: str) -> list[str]:
    """Every form (as written, percent-decoded) in which `url`'s secrets could show up in a
    message (a database driver's error), longest first; empty values are left out."""
    found: set[str] = set()
    if "://" in url:
        scheme, rest = url.split("://", 1)
        userinfo, _, _, query = _split(rest)
        if userinfo is not None and ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
        for parameter in query.split("&") if query else []:
            name, eq, value = parameter.partition("=")
            if eq and is_secret_parameter(name):
                found.add(value)
        found |= _libpq_secrets(scheme, url)
    forms = {s for s in found if s} | {unquote(s) for s in found if s}
    return sorted(forms, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` (a driver's message about `url`) with each of `url`'s secrets replaced."""
    for secret in url_secrets(url):
        text = text.replace(secret, REDACTED)
    return text


def secrets_in(values: Iterable[str]) -> list[str]:
    """The secrets of every URL found in `values` (command-line arguments, environment
    values), in every form a message could show them in (as written, percent-decoded, escaped
    as in a repr or in JSON), longest first; those shorter than MIN_KNOWN_SECRET_CHARS are
    left out (see there).

    Example:
        >>> secrets_in(["master", "--state=etcd://root:s3cret@db:2379", "memory://"])
        ['s3cret']
    """
    found: set[str] = set()
    for value in values:
        for url in _URL_TO_END.findall(value):
            for secret in url_secrets(url):
                found |= {secret, repr(secret)[1:-1],
                          json.dumps(secret, ensure_ascii=False)[1:-1]}
    return sorted((s for s in found if len(s) >= MIN_KNOWN_SECRET_CHARS), key=len,
                  reverse=True)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` (a message, a log line, a traceback) with every URL in it redacted
    (:func:`redact_url`), then each of the known `secrets` masked wherever it appears.

    The first catches a URL the text shows whole; the second a secret shown apart from its
    URL (a driver quoting the password it was given) or in a URL the first pass cannot
    delimit (a password holding a blank or a quote). Pass :func:`secrets_in` of the values a
    process was given.

    Example:
        >>> redact_text("ValueError: bad URL 'etcd://root:s3cret@db:2379'")
        "ValueError: bad URL 'etcd://root:***@db:2379'"
    """
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def _split(rest: str) -> tuple[str | None, str, str, str]:
    """What follows `scheme://` as (user info or None, hosts, path, query), each as written.

    The user info ends at the last `@` before the first `/`: that covers both libpq's reading
    (the first `@` before any `/`, so a `?` may sit in a password) and a generic URL parser's
    (the last `@` of the authority), so whichever a consumer uses, its password is found.
    """
    slash = rest.find("/")
    head = rest if slash < 0 else rest[:slash]
    at = head.rfind("@")
    userinfo = rest[:at] if at >= 0 else None
    after = rest[at + 1:]
    end = re.search(r"[/?]", after)
    hosts, tail = (after, "") if end is None else (after[:end.start()], after[end.start():])
    path, _, query = tail.partition("?")
    return userinfo, hosts, path, query


def _libpq_secrets(scheme: str, url: str) -> set[str]:
    """The secret values libpq reads from a PostgreSQL `url` (empty without psycopg, for other
    schemes, or for a URL libpq cannot parse: then the textual rules are all there is)."""
    if scheme.lower() not in _POSTGRES_SCHEMES:
        return set()
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return set()
    try:
        params = conninfo_to_dict(url)
    except Exception:  # psycopg.ProgrammingError: not a valid connection string
        return set()
    return {str(v) for k, v in params.items() if v and is_secret_parameter(k)}
