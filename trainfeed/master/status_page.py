"""The master's status page (issue 29): `/status` (HTML) and `/status.json` on the metrics port.

Server-rendered HTML from `trainfeed.master.status.snapshot`: no JavaScript at all (the page
refreshes itself with a meta refresh every REFRESH_S; `?refresh=0` stops it), inline SVG
sparklines, one column that reflows on a phone. Everything shown is escaped.

Access: behind the master's token, like its gRPC API. A request carries `Authorization: Bearer
<token>` (the master's token: every job; a job token: that job only), or the cookie of a session
opened by posting the token to the `/login` form. Sessions live in this process only (a master
restart logs everyone out), SESSION_S at most; the cookie is HttpOnly, SameSite=Strict, and holds
a random id, never the token. A master run `--insecure` shows the page to anyone, as it serves
its API to anyone. `/metrics` stays open (Prometheus scrapes it; it names no secret either).
"""
from __future__ import annotations

import hmac
import html
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from trainfeed.security import JOB_TOKEN_PREFIX, job_token

PATHS = ("/", "/status", "/status/", "/status.json", "/login", "/logout", "/metrics")

# How often the page reloads itself: the sparklines step every 10 s, the readers call faster.
REFRESH_S = 5
# A login lasts this long (seconds); a bounded number of sessions are kept (oldest dropped).
SESSION_S = 12 * 3600
MAX_SESSIONS = 1000
COOKIE = "trainfeed_status"
# The largest login form body read.
MAX_FORM_BYTES = 4096
# Every scope: the master's token (or no token at all).
ALL_JOBS = ""

Snapshot = Callable[[str | None], dict[str, Any]]
Uploads = Callable[[], dict[str, Any]]
StartResponse = Callable[..., Any]
_HEADERS = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
            ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
                                        "img-src data:; form-action 'self'")]


class Access:
    """Who may see what: checks bearer tokens and keeps login sessions. Thread-safe."""

    def __init__(self, token: str | None, clock: Callable[[], float] = time.time):
        self._token = token
        self._clock = clock
        self._sessions: dict[str, tuple[str, float]] = {}  # id -> (scope, expiry)
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        """No token: the master runs --insecure, and so does its page."""
        return self._token is None

    def scope_of_token(self, given: str) -> str | None:
        """ALL_JOBS for the master's token, a job's name for its job token, None otherwise."""
        if self._token is None:
            return ALL_JOBS
        if hmac.compare_digest(given.encode("utf-8", "replace"), self._token.encode()):
            return ALL_JOBS
        if given.startswith(JOB_TOKEN_PREFIX):
            job = given[len(JOB_TOKEN_PREFIX):].rpartition(":")[0]
            if job and hmac.compare_digest(given.encode("utf-8", "replace"),
                                           job_token(self._token, job).encode()):
                return job
        return None

    def login(self, given: str) -> str | None:
        """A new session id for a valid token, else None."""
        scope = self.scope_of_token(given)
        if scope is None:
            return None
        sid = secrets.token_urlsafe(32)
        with self._lock:
            now = self._clock()
            for old in [s for s, (_, until) in self._sessions.items() if until < now]:
                del self._sessions[old]
            while len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]
            self._sessions[sid] = (scope, now + SESSION_S)
        return sid

    def scope_of_request(self, environ: dict[str, Any]) -> str | None:
        """The scope a request may see (ALL_JOBS or a job), None if it may see nothing."""
        if self.open:
            return ALL_JOBS
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and given.strip():
            return self.scope_of_token(given.strip())
        cookie = SimpleCookie()
        try:
            cookie.load(environ.get("HTTP_COOKIE", ""))
        except Exception:
            return None
        morsel = cookie.get(COOKIE)
        if morsel is None:
            return None
        with self._lock:
            found = self._sessions.get(morsel.value)
        if found is None or found[1] < self._clock():
            return None
        return found[0]


class StatusApp:
    """The WSGI app of `/status`, `/status.json` and `/login`, in front of `fallback` (the
    Prometheus exporter's app, for `/metrics` and anything else).

    Args:
        snapshot: the master's status for a scope (None: every job; else one job's name);
            called from the HTTP server's threads (the master's hops to its event loop).
        uploads: the uploads of the master's storage (trainfeed.master.status.UploadWatch),
            called from the same threads; None shows no uploads section.
    """

    def __init__(self, snapshot: Snapshot, access: Access,
                 fallback: Callable[[dict[str, Any], StartResponse], Iterable[bytes]],
                 uploads: Uploads | None = None):
        self._snapshot = snapshot
        self.access = access
        self._fallback = fallback
        self._uploads = uploads

    def __call__(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/", "/status", "/status/"):
            return self._status(environ, start, as_json=False)
        if path == "/status.json":
            return self._status(environ, start, as_json=True)
        if path == "/login":
            return self._login(environ, start)
        if path == "/logout":
            return _respond(start, "303 See Other", b"", "text/plain",
                            [("Location", "/login"), ("Set-Cookie", _cookie("", 0))])
        return self._fallback(environ, start)

    def _status(self, environ: dict[str, Any], start: StartResponse,
                as_json: bool) -> Iterable[bytes]:
        scope = self.access.scope_of_request(environ)
        if scope is None:
            if as_json:
                body = json.dumps({"error": "this master requires its token: send "
                                   "'Authorization: Bearer <token>' (the master's token or a "
                                   "job token)"}).encode()
                return _respond(start, "401 Unauthorized", body, "application/json",
                                [("WWW-Authenticate", 'Bearer realm="trainfeed"')])
            return _respond(start, "303 See Other", b"", "text/plain", [("Location", "/login")])
        data = self._snapshot(scope or None)
        if self._uploads is not None:
            data = with_uploads(data, self._uploads(), every_job=scope == ALL_JOBS)
        if as_json:
            return _respond(start, "200 OK", json.dumps(data).encode(), "application/json")
        query = parse_qs(environ.get("QUERY_STRING", ""))
        refresh = query.get("refresh", [str(REFRESH_S)])[0]
        seconds = int(refresh) if refresh.isdigit() else REFRESH_S
        page = render(data, refresh_s=seconds, logout=not self.access.open)
        return _respond(start, "200 OK", page.encode(), "text/html; charset=utf-8")

    def _login(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            return _respond(start, "200 OK", login_form().encode(), "text/html; charset=utf-8")
        try:
            length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_FORM_BYTES)
        except ValueError:
            length = 0
        form = parse_qs(environ["wsgi.input"].read(length).decode("utf-8", "replace"))
        sid = self.access.login(form.get("token", [""])[0].strip())
        if sid is None:
            return _respond(start, "401 Unauthorized",
                            login_form("That is not this master's token, nor a job token of "
                                       "it.").encode(), "text/html; charset=utf-8")
        return _respond(start, "303 See Other", b"", "text/plain",
                        [("Location", "/status"), ("Set-Cookie", _cookie(sid, SESSION_S))])


def with_uploads(data: dict[str, Any], uploads: dict[str, Any],
                 every_job: bool) -> dict[str, Any]:
    """A snapshot with the uploads its reader may see: every upload with the master's token,
    else those of its job's dataset (a job token sees its own dataset's new uploads only)."""
    datasets = {j["dataset"] for j in data["jobs"]}
    shown = uploads["uploads"] if every_job else [
        u for u in uploads["uploads"] if u["dataset"] in datasets]
    return {**data, "uploads": shown, "uploads_error": uploads["uploads_error"]}


def _cookie(value: str, max_age: int) -> str:
    return f"{COOKIE}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"


def _respond(start: StartResponse, status: str, body: bytes, kind: str,
             headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    start(status, [("Content-Type", kind), ("Content-Length", str(len(body))), *_HEADERS,
                   *(headers or [])])
    return [body]


# -- rendering ---------------------------------------------------------------------------------
_STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:70rem;padding:.5rem 1rem;
color:#111;background:#fff}
h1{font-size:1.3rem}h2{font-size:1.15rem;margin:1.5rem 0 .3rem}
h3{font-size:1rem;margin:1rem 0 .3rem}
.job{border-top:3px solid #2b6cb0;padding-top:.3rem}
.bar{background:#e2e8f0;height:1.2rem;border-radius:.3rem;overflow:hidden}
.bar>div{background:#2b6cb0;height:100%}
.grid{display:flex;flex-wrap:wrap;gap:.3rem 1.5rem}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:.9rem}
td,th{padding:.15rem .5rem;border-bottom:1px solid #e2e8f0;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}
tr.flagged td{background:#fed7d7}
.flag{background:#c53030;color:#fff;border-radius:.2rem;padding:0 .3rem;margin-right:.2rem}
.muted{color:#666}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def sparkline(points: Iterable[float], width: int = 120, height: int = 24) -> str:
    """A small inline SVG polyline of `points` (oldest first), scaled to its maximum."""
    values = list(points)
    if not values:
        return ""
    top = max(values) or 1.0
    step = width / max(1, len(values) - 1)
    coords = " ".join(f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}"
                      for i, v in enumerate(values))
    return (f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} '
            f'{height}" role="img" aria-label="rate over the last minutes, peak {top:,.0f}/s">'
            f'<polyline fill="none" stroke="#2b6cb0" stroke-width="1.5" points="{coords}"/>'
            f'</svg>')


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def render(data: dict[str, Any], refresh_s: int = REFRESH_S, logout: bool = False) -> str:
    """The whole page for a `snapshot`."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s > 0 else ""
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["generated_at"]))
    jobs = data["jobs"]
    out = ['<!doctype html><html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width,initial-scale=1">', refresh,
           f"<title>trainfeed: {len(jobs)} job(s)</title><style>{_STYLE}</style></head><body>",
           f'<h1>trainfeed master</h1><p class="muted">{_e(generated)} · {len(jobs)} job(s)'
           + (f" · refreshes every {refresh_s} s" if refresh_s > 0 else "")
           + (' · <a href="/logout">log out</a>' if logout else "") + "</p>"]
    if not jobs:
        out.append("<p>No job yet: a reader creates its job when it opens it.</p>")
    out += [_job(job, data) for job in jobs]
    if "uploads" in data:
        out.append(_uploads(data["uploads"], data.get("uploads_error")))
    out.append("</body></html>")
    return "".join(out)


def _job(job: dict[str, Any], data: dict[str, Any]) -> str:
    name = _e(job["job"])
    done, failed, total = job["done"], job["failed"], job["num_partitions"]
    share = job["input_bound"]
    parts = [
        f'<section class="job" id="job-{name}"><h2>Job {name}</h2>',
        f'<div class="grid"><span>dataset <b>{_e(job["dataset"])}</b> '
        f'({job["num_records"]:,} records)</span>',
        f'<span>readers alive <b>{job["workers_alive"]}</b></span>',
        f'<span>rate <b>{job["records_per_s"]:,.0f}</b> records/s '
        f'{sparkline(job["sparkline"])}</span>',
        f'<span>input-bound <b class="input-bound">{share:.0%}</b></span>',
        f'<span>refused reports <b class="refused">{job["reports_refused"]}</b></span></div>',
        f'<h3>Epoch <span class="epoch">{job["epoch"]}</span></h3>',
        f'<p class="progress" data-epoch="{job["epoch"]}" data-done="{done}" '
        f'data-failed="{failed}" data-todo="{job["todo"]}" data-pending="{job["pending"]}" '
        f'data-partitions="{total}">{done + failed}/{total} partitions '
        f'({job["progress"]:.0%}) · todo {job["todo"]} · pending {job["pending"]} · '
        f'done {done} · failed {failed}</p>',
        f'<div class="bar"><div style="width:{100 * job["progress"]:.1f}%"></div></div>',
        _readers(job["readers"], data),
        _sync(job["sync_group"]),
        _failed(job["failed_partitions"]),
        _refusals(job["refusals"]),
        _histogram(job["label_histogram"]),
        "</section>",
    ]
    return "".join(parts)


def _readers(readers: list[dict[str, Any]], data: dict[str, Any]) -> str:
    if not readers:
        return "<h3>Readers</h3><p>None connected.</p>"
    minutes = data["sparkline_step_s"] * 30 / 60
    rows = ['<h3>Readers</h3><div class="scroll"><table class="readers"><tr><th>reader</th>'
            '<th>records/s</th><th>input-bound</th><th>leases</th><th>last contact</th>'
            '<th>read</th><th>decode failures</th>'
            f'<th>last {minutes:.0f} min</th><th>flags</th></tr>']
    for r in readers:
        flags = "".join(f'<span class="flag">{_e(f)}</span>' for f in r["flags"])
        rows.append(
            f'<tr class="reader{" flagged" if r["flags"] else ""}" data-worker="{_e(r["worker"])}"'
            f' data-flags="{_e(" ".join(r["flags"]))}"><td>{_e(r["worker"])}</td>'
            f'<td>{r["records_per_s"]:,.1f}</td><td>{r["input_bound"]:.0%}</td>'
            f'<td>{r["leases_held"]}</td><td>{_ago(r["last_contact_s"])}</td>'
            f'<td>{_size(r["read_bytes_per_s"])}/s</td><td>{r["decode_failures"]}</td>'
            f'<td>{sparkline(r["sparkline"], 90, 18)}</td><td>{flags}</td></tr>')
    rows.append("</table></div>")
    return "".join(rows)


def _sync(group: dict[str, Any] | None) -> str:
    if group is None:
        return ""
    ranks = ", ".join(f"{_e(r)}: {_e(w)}" for r, w in group["ranks"].items()) or "none yet"
    broken = (f' <span class="flag">broken</span> {_e(group["broken"])}'
              if group["broken"] else "")
    return (f'<h3>Synchronous group</h3><p>world size {group["world_size"]}, batch size '
            f'{group["batch_size"]}; ranks {ranks}{broken}</p>')


def _failed(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<h3>Lost partitions</h3><p>None.</p>"
    body = "".join(f'<tr><td>{r["epoch"]}</td><td>{r["partition"]}</td><td>{r["records"]}</td>'
                   f'<td style="text-align:left;white-space:normal">{_e(r["reason"])}</td></tr>'
                   for r in rows)
    return ('<h3>Lost partitions</h3><div class="scroll"><table class="lost"><tr><th>epoch</th>'
            f'<th>partition</th><th>records</th><th>reason</th></tr>{body}</table></div>')


def _refusals(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    body = "".join(f'<tr><td>{_ago(r["ago_s"])}</td><td>{_e(r["worker"])}</td>'
                   f'<td>{r["count"]}</td><td style="text-align:left;white-space:normal">'
                   f'{_e(r["why"])}</td></tr>' for r in rows)
    return ('<h3>Refused reports</h3><div class="scroll"><table class="refusals"><tr><th>when'
            f'</th><th>reader</th><th>reports</th><th>why</th></tr>{body}</table></div>')


def _histogram(histogram: dict[str, int]) -> str:
    if not histogram:
        return ""
    top = max(histogram.values()) or 1
    rows = "".join(
        f'<tr><td>{_e(label)}</td><td>{n:,}</td><td style="width:60%"><div class="bar">'
        f'<div style="width:{100 * n / top:.1f}%"></div></div></td></tr>'
        for label, n in histogram.items())
    return f'<h3>Labels</h3><div class="scroll"><table class="labels">{rows}</table></div>'


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else \
        f"{minutes}:{secs:02d}"


def _uploads(uploads: list[dict[str, Any]], error: str | None) -> str:
    """The uploads of the master's storage (trainfeed.ingest.board.summarize)."""
    out = ['<section class="uploads" id="uploads"><h2>Uploads</h2>']
    if error:
        out.append(f'<p><span class="flag">error</span> {_e(error)}</p>')
    if not uploads:
        out.append("<p>None in progress, none published in the last hour.</p>")
    out += [_upload(u) for u in uploads]
    out.append("</section>")
    return "".join(out)


def _upload(u: dict[str, Any]) -> str:
    share = u["records_done"] / u["records_total"] if u["records_total"] else 0.0
    bad = u["state"] in ("failed", "stale")
    state = f'<span class="flag">{_e(u["state"])}</span>' if bad else f'<b>{_e(u["state"])}</b>'
    slices = (f' · {u["slices_done"]}/{u["slices"]} slices done · {u["slices_running"]} '
              f'running' + (f' · {u["slices_waiting"]} not started' if u["slices_waiting"]
                            else "") if u["mode"] == "slices" else "")
    eta = f' · ETA {_duration(u["eta_s"])}' if u["eta_s"] is not None else ""
    ago = f' · {_ago(u["updated_ago_s"])}' if u["state"] == "published" else ""
    parts = [
        f'<div class="upload" data-dataset="{_e(u["dataset"])}" data-state="{_e(u["state"])}" '
        f'data-records-done="{u["records_done"]}" data-records-total="{u["records_total"]}" '
        f'data-slices="{u["slices"]}" data-slices-done="{u["slices_done"]}" '
        f'data-slices-failed="{u["slices_failed"]}" data-slices-stale="{u["slices_stale"]}">',
        f'<h3>{_e(u["dataset"])} <span class="muted">({_e(u["mode"])}, fingerprint '
        f'{_e(u["fingerprint"])})</span></h3>',
        f'<p class="upload-progress">{state}{slices} · {u["records_done"]:,}/'
        f'{u["records_total"]:,} records ({share:.0%}) · {_size(u["bytes_done"])} · '
        f'{u["records_per_s"]:,.0f} records/s{eta}{ago}</p>',
        f'<div class="bar"><div style="width:{100 * share:.1f}%"></div></div>',
    ]
    parts += [f'<p class="problem"><span class="flag">!</span> {_e(p)}</p>'
              for p in u["problems"]]
    rows = [s for s in u["slice_rows"] if u["mode"] == "slices"]
    if rows:
        parts.append('<div class="scroll"><table class="slices"><tr><th>slice</th><th>state'
                     '</th><th>records</th><th>records/s</th><th>host</th><th>last report</th>'
                     '<th style="text-align:left">reason</th></tr>')
        for r in rows:
            flagged = r["state"] in ("failed", "stale")
            parts.append(
                f'<tr class="slice{" flagged" if flagged else ""}" data-slice="{r["slice"]}" '
                f'data-state="{_e(r["state"])}" data-records-done="{r["records_done"]}">'
                f'<td>{r["slice"]}</td><td>{_e(r["state"])}</td><td>{r["records_done"]:,}/'
                f'{r["records_total"]:,}</td><td>{r["records_per_s"]:,.1f}</td>'
                f'<td>{_e(r["host"])}</td><td>{_ago(r["updated_ago_s"])}</td>'
                f'<td style="text-align:left;white-space:normal">{_e(r["reason"] or "")}</td>'
                '</tr>')
        if u["slice_rows_hidden"]:
            parts.append(f'<tr><td colspan="7">… and {u["slice_rows_hidden"]} more slices'
                         '</td></tr>')
        parts.append("</table></div>")
    parts.append("</div>")
    return "".join(parts)


def login_form(problem: str = "") -> str:
    message = f'<p class="flag">{_e(problem)}</p>' if problem else ""
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            'content="width=device-width,initial-scale=1"><title>trainfeed: log in</title>'
            f'<style>{_STYLE}</style></head><body><h1>trainfeed master</h1>{message}'
            '<form method="post" action="/login"><p><label>Token (the master\'s, or a job '
            'token from <code>trainfeed token JOB</code>)<br><input type="password" '
            'name="token" id="token" autocomplete="current-password" size="40" required>'
            '</label></p><p><button type="submit" id="login">Log in</button></p></form>'
            '</body></html>')
