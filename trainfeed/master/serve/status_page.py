"""The master's status page (issue 29): `/status` (HTML) and `/status.json` on the metrics port.

Server-rendered HTML from `trainfeed.master.serve.status.snapshot`: no JavaScript at all (the page
refreshes itself with a meta refresh every REFRESH_S; `?refresh=0` stops it), inline SVG
sparklines, one column that reflows on a phone. Every value shown is escaped, by one function
(`html`: MarkupSafe's escaping formatter), never by care at each place.

Access: behind the master's token, like its gRPC API. A request carries `Authorization: Bearer
<token>` (the master's token: every job; a job token: that job only), or the cookie of a session
opened by posting the token to the `/login` form. Sessions live in this process only (a master
restart logs everyone out), SESSION_S at most; the cookie is HttpOnly, SameSite=Strict, and holds
a random id, never the token. A master run `--insecure` shows the page to anyone, as it serves
its API to anyone. `/metrics` stays open (Prometheus scrapes it; it names no secret either).
"""
from __future__ import annotations

import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from markupsafe import Markup

from trainfeed.security import JOB_TOKEN_PREFIX, job_token

# How often the page reloads itself: the sparklines step every 10 s, the readers call faster.
REFRESH_S = 5
# `?refresh=N` is taken as ASCII digits only, clamped to this (an hour); anything else is REFRESH_S.
MAX_REFRESH_S = 3600
# A login lasts this long (seconds).
SESSION_S = 12 * 3600
# Sessions kept per job token's scope, each scope dropping only its own oldest: a job token
# logging in without end cannot log out anyone but its own job's earlier sessions.
MAX_SESSIONS_PER_JOB = 32
# Sessions of every job's scope together (only the master's token can mint job tokens, so only
# its holder can reach this); past it the oldest job session goes.
MAX_JOB_SESSIONS = 1000
# Sessions of the master's token (the operators), a pool of their own no job token touches.
MAX_OPERATOR_SESSIONS = 64
COOKIE = "trainfeed_status"
# The largest login form body read (a token is under 200 bytes); trainfeed.master.serve.metrics
# makes it the HTTP server's body limit for every path.
MAX_FORM_BYTES = 4096
# Every path the app answers itself; anything else goes to the Prometheus exporter (`/metrics`).
PAGE_PATHS = ("/", "/status", "/status/")
PATHS: tuple[str, ...] = (*PAGE_PATHS, "/status.json", "/login", "/logout", "/metrics")
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
        self._sessions = _Sessions()
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
            self._sessions.add(sid, scope, self._clock())
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
            return self._sessions.scope(morsel.value, self._clock())


class _Sessions:
    """Login sessions, in pools with their own caps: the operators' (ALL_JOBS) and each job's,
    so that a pool that is full drops its own oldest session, never another pool's. Not
    thread-safe (Access holds its lock)."""

    def __init__(self) -> None:
        self._scopes: dict[str, dict[str, float]] = {}  # scope -> id -> expiry, oldest first
        self._scope_of: dict[str, str] = {}  # id -> scope
        self._job_sessions = 0

    def add(self, sid: str, scope: str, now: float) -> None:
        self._expire(now)
        pool = self._scopes.setdefault(scope, {})
        cap = MAX_OPERATOR_SESSIONS if scope == ALL_JOBS else MAX_SESSIONS_PER_JOB
        while len(pool) >= cap:
            self._drop(next(iter(pool)))
        while scope != ALL_JOBS and self._job_sessions >= MAX_JOB_SESSIONS:
            self._drop(self._oldest_job_session())
        self._scopes.setdefault(scope, pool)[sid] = now + SESSION_S
        self._scope_of[sid] = scope
        self._job_sessions += scope != ALL_JOBS

    def scope(self, sid: str, now: float) -> str | None:
        scope = self._scope_of.get(sid)
        if scope is None or self._scopes[scope][sid] < now:
            return None
        return scope

    def __len__(self) -> int:
        return len(self._scope_of)

    def _expire(self, now: float) -> None:
        for sid in [s for s, scope in self._scope_of.items() if self._scopes[scope][s] < now]:
            self._drop(sid)

    def _oldest_job_session(self) -> str:
        return min(((next(iter(pool.values())), next(iter(pool))) for scope, pool
                    in self._scopes.items() if scope != ALL_JOBS and pool))[1]

    def _drop(self, sid: str) -> None:
        scope = self._scope_of.pop(sid)
        pool = self._scopes[scope]
        del pool[sid]
        if not pool:
            del self._scopes[scope]
        self._job_sessions -= scope != ALL_JOBS


class StatusApp:
    """The WSGI app of `/status`, `/status.json` and `/login`, in front of `fallback` (the
    Prometheus exporter's app, for `/metrics` and anything else).

    Args:
        snapshot: the master's status for a scope (None: every job; else one job's name);
            called from the HTTP server's threads (the master's hops to its event loop).
        uploads: the uploads of the master's storage (trainfeed.master.serve.status.UploadWatch),
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
        if path in PAGE_PATHS:
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
        seconds = refresh_of(environ.get("QUERY_STRING", ""))
        page = render(data, refresh_s=seconds, logout=not self.access.open)
        return _respond(start, "200 OK", page.encode(), "text/html; charset=utf-8")

    def _login(self, environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "POST":
            return _respond(start, "200 OK", login_form().encode(), "text/html; charset=utf-8")
        length, problem = form_length(environ.get("CONTENT_LENGTH"))
        if problem is not None:
            return _respond(start, problem, f"{problem}: the login form is a body of 0 to "
                            f"{MAX_FORM_BYTES} bytes with its Content-Length\n".encode(),
                            "text/plain; charset=utf-8")
        try:
            form = parse_qs(environ["wsgi.input"].read(length).decode("utf-8", "replace"),
                            max_num_fields=8)
        except ValueError:  # more fields than the form has
            form = {}
        sid = self.access.login(form.get("token", [""])[0].strip())
        if sid is None:
            return _respond(start, "401 Unauthorized",
                            login_form("That is not this master's token, nor a job token of "
                                       "it.").encode(), "text/html; charset=utf-8")
        return _respond(start, "303 See Other", b"", "text/plain",
                        [("Location", "/status"), ("Set-Cookie", _cookie(sid, SESSION_S))])


_DIGITS = re.compile(r"[0-9]{1,9}")


def refresh_of(query: str) -> int:
    """The page's refresh period asked by `?refresh=N`: ASCII digits, clamped to
    MAX_REFRESH_S; anything else (none, a Unicode digit, a sign, 5,000 digits) is REFRESH_S."""
    try:
        given = parse_qs(query, max_num_fields=32).get("refresh", [""])[0]
    except ValueError:  # more fields than that: not a query this page makes
        return REFRESH_S
    return min(int(given), MAX_REFRESH_S) if _DIGITS.fullmatch(given) else REFRESH_S


def form_length(header: str | None) -> tuple[int, str | None]:
    """The login form's length from its Content-Length (the server has read at most
    MAX_FORM_BYTES of it), or the 4xx status for a missing, malformed or too large one."""
    if header is None or header == "":
        return 0, "411 Length Required"
    if not _DIGITS.fullmatch(header):
        return 0, "400 Bad Request" if not header.isascii() or not header.isdigit() else \
            "413 Content Too Large"
    length = int(header)
    return (length, None) if length <= MAX_FORM_BYTES else (0, "413 Content Too Large")


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
_STYLE = Markup("""
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
.newer-version{background:#fefcbf;padding:.2rem .4rem;border-radius:.2rem}
details.finished-jobs>summary{cursor:pointer;font-size:1.15rem;margin:1.5rem 0 .3rem}
""")


def html(template: str, *args: Any, **kwargs: Any) -> Markup:
    """The one way a value reaches the page: `template` is this module's own markup, and every
    argument is escaped by MarkupSafe's formatter (format specs such as `{n:,}` apply first)
    unless it is itself a Markup built here. Nothing else concatenates text into the page."""
    return Markup(template).format(*args, **kwargs)


def _join(parts: Iterable[Markup]) -> Markup:
    return Markup("").join(parts)


def sparkline(points: Iterable[float], width: int = 120, height: int = 24) -> Markup:
    """A small inline SVG polyline of `points` (oldest first), scaled to its maximum."""
    values = [float(v) for v in points]
    if not values:
        return Markup("")
    top = max(values) or 1.0
    step = width / max(1, len(values) - 1)
    coords = " ".join(f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}"
                      for i, v in enumerate(values))
    return html('<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
                'aria-label="rate over the last minutes, peak {top:,.0f}/s"><polyline '
                'fill="none" stroke="#2b6cb0" stroke-width="1.5" points="{coords}"/></svg>',
                w=width, h=height, top=top, coords=coords)


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
    refresh = html('<meta http-equiv="refresh" content="{}">', refresh_s) if refresh_s > 0 \
        else Markup("")
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data["generated_at"]))
    jobs = data["jobs"]
    out = [html('<!doctype html><html lang="en"><head><meta charset="utf-8"><meta '
                'name="viewport" content="width=device-width,initial-scale=1">{refresh}<title>'
                'trainfeed: {n} job(s)</title><style>{style}</style></head><body><h1>trainfeed '
                'master</h1><p class="muted">{generated} · {n} job(s){every}{logout}</p>',
                refresh=refresh, n=len(jobs), style=_STYLE, generated=generated,
                every=f" · refreshes every {refresh_s} s" if refresh_s > 0 else "",
                logout=Markup(' · <a href="/logout">log out</a>') if logout else "")]
    if not jobs:
        out.append(Markup("<p>No job yet: a reader creates its job when it opens it.</p>"))
    running = [job for job in jobs if job.get("state") != "finished"]
    finished = [job for job in jobs if job.get("state") == "finished"]
    out += [_job(job, data) for job in running]
    if finished:  # folded below the running ones: a <details> needs no script
        out.append(html('<details class="finished-jobs" id="finished-jobs"><summary>{n} '
                        'finished job(s)</summary>{jobs}</details>', n=len(finished),
                        jobs=_join(_job(job, data) for job in finished)))
    if data.get("decoders"):
        out.append(_decoders(data["decoders"]))
    if "uploads" in data:
        out.append(_uploads(data["uploads"], data.get("uploads_error")))
    out.append(Markup("</body></html>"))
    return str(_join(out))


# A job's state (trainfeed.master.serve.status.job_state) as the page shows it: a red flag only
# for a broken synchronous group.
_STATES = {"running": '<b class="state">{}</b>', "idle": '<b class="state">{}</b>',
           "finished": '<span class="state muted">{}</span>',
           "broken": '<span class="state flag">{}</span>'}


def _job(job: dict[str, Any], data: dict[str, Any]) -> Markup:
    done, failed = job["done"], job["failed"]
    state = job.get("state", "running")
    return _join([
        html('<section class="job" id="job-{name}" data-state="{state}"><h2>Job {name} {shown}'
             '</h2>{newer}<div class="grid"><span>'
             'dataset <b>{dataset}</b> ({records:,} records)</span><span>readers alive <b>'
             '{alive}</b></span><span>rate <b>{rate:,.0f}</b> records/s {spark}</span><span>'
             'input-bound <b class="input-bound">{share:.0%}</b></span><span>refused reports '
             '<b class="refused">{refused}</b></span></div>',
             name=job["job"], state=state, shown=html(_STATES.get(state, "{}"), state),
             newer=_newer(job.get("newer_version")),
             dataset=job["dataset"], records=job["num_records"],
             alive=job["workers_alive"], rate=job["records_per_s"],
             spark=sparkline(job["sparkline"]), share=job["input_bound"],
             refused=job["reports_refused"]),
        html('<h3>Epoch <span class="epoch">{epoch}</span></h3><p class="progress" '
             'data-epoch="{epoch}" data-done="{done}" data-failed="{failed}" data-todo="{todo}" '
             'data-pending="{pending}" data-partitions="{total}">{finished}/{total} partitions '
             '({progress:.0%}) · todo {todo} · pending {pending} · done {done} · failed {failed}'
             '</p><div class="bar"><div style="width:{width:.1f}%"></div></div>{left}',
             epoch=job["epoch"], done=done, failed=failed, todo=job["todo"],
             pending=job["pending"], total=job["num_partitions"], finished=done + failed,
             progress=job["progress"], width=100 * job["progress"], left=_left(job)),
        _readers(job["readers"], data),
        _scaling(job.get("decoder_scaling")),
        _sync(job["sync_group"]),
        _failed(job["failed_partitions"]),
        _refusals(job["refusals"]),
        _histogram(job["label_histogram"]),
        Markup("</section>"),
    ])


def _left(job: dict[str, Any]) -> Markup:
    """Records left in the epoch and the time to its end at the recent rate ("—": no rate)."""
    if "records_left" not in job:
        return Markup("")
    eta_s = job["eta_s"]
    return html('<p class="left" data-records-left="{left}" data-eta-s="{eta_s}">records left '
                '<b class="records-left">{left:,}</b> · to the end of the epoch <b class="eta">'
                '{eta}</b>{at}</p>', left=job["records_left"],
                eta_s="" if eta_s is None else f"{eta_s:.0f}",
                eta="—" if eta_s is None else _duration(eta_s),
                at=f" at {job['records_per_s']:,.0f} records/s" if eta_s else
                (" (no records read lately)" if eta_s is None else ""))


def _decoders(listed: list[dict[str, Any]]) -> Markup:
    """The decoders registered with this master (issue 37), the least busy first."""
    rows = _join(html('<tr><td>{address}</td><td>{busy:.0%}</td><td>{slots}</td></tr>',
                      address=d["address"], busy=d["busy"], slots=d["slots"]) for d in listed)
    return html('<section class="decoders" id="decoders"><h2>Decoders <b>{n}</b></h2><table>'
                '<tr><th>address</th><th>busy</th><th>slots</th></tr>{rows}</table></section>',
                n=len(listed), rows=rows)


def _scaling(scaling: dict[str, Any] | None) -> Markup:
    """A job's decoder autoscaler and its last decision (the `detail` is the cluster's text:
    escaped like every argument of `html`)."""
    if not scaling:
        return Markup("")
    decision = scaling.get("decision")
    if decision is None:
        last = Markup("no decision yet")
    else:
        last = html('<b class="scaling-action">{action}</b> {before} → <b class="decoders-size">'
                    '{replicas}</b> ({reason}: {detail}) · decoders busy {busy:.0%} · '
                    'input-bound {bound:.0%}', action=decision["action"],
                    before=decision["before"], replicas=decision["replicas"],
                    reason=decision["reason"], detail=decision["detail"],
                    busy=decision["decoders_busy"], bound=decision["input_bound"])
    return html('<p class="decoder-scaling">decoders ({deployment}, {bounds}): {last}</p>',
                deployment=scaling["deployment"], bounds=scaling["bounds"], last=last)


def _newer(newer: dict[str, Any] | None) -> Markup:
    if not newer:
        return Markup("")
    return html('<p class="newer-version" data-version="{v}"><b>newer data</b> {notice}</p>',
                v=newer["version"], notice=newer["notice"])


def _readers(readers: list[dict[str, Any]], data: dict[str, Any]) -> Markup:
    if not readers:
        return Markup("<h3>Readers</h3><p>None connected.</p>")
    rows = [html('<h3>Readers</h3><div class="scroll"><table class="readers"><tr><th>reader</th>'
                 '<th>records/s</th><th>input-bound</th><th>leases</th><th>last contact</th>'
                 '<th>read</th><th>decode failures</th><th>last {:.0f} min</th><th>flags</th>'
                 '</tr>', data["sparkline_step_s"] * 30 / 60)]
    for r in readers:
        rows.append(html(
            '<tr class="reader{flagged}" data-worker="{worker}" data-flags="{flag_list}"><td>'
            '{worker}</td><td>{rate:,.1f}</td><td>{share:.0%}</td><td>{leases}</td><td>{ago}'
            '</td><td>{read}/s</td><td>{failures}</td><td>{spark}</td><td>{flags}</td></tr>',
            flagged=" flagged" if r["flags"] else "", worker=r["worker"],
            flag_list=" ".join(r["flags"]), rate=r["records_per_s"], share=r["input_bound"],
            leases=r["leases_held"], ago=_ago(r["last_contact_s"]),
            read=_size(r["read_bytes_per_s"]), failures=r["decode_failures"],
            spark=sparkline(r["sparkline"], 90, 18),
            flags=_join(html('<span class="flag">{}</span>', f) for f in r["flags"])))
    rows.append(Markup("</table></div>"))
    return _join(rows)


def _sync(group: dict[str, Any] | None) -> Markup:
    if group is None:
        return Markup("")
    ranks = ", ".join(f"{r}: {w}" for r, w in group["ranks"].items()) or "none yet"
    if group["broken"]:
        state = html(' <span class="flag">broken</span> {}', group["broken"])
    elif group.get("finished"):
        state = html(' <b class="finished">finished</b> {}', group["finished"])
    else:
        state = Markup("")
    return html('<h3>Synchronous group</h3><p class="sync">world size {world}, batch size '
                '{batch}; ranks {ranks}{state}</p>', world=group["world_size"],
                batch=group["batch_size"], ranks=ranks, state=state)


def _failed(rows: list[dict[str, Any]]) -> Markup:
    if not rows:
        return Markup("<h3>Lost partitions</h3><p>None.</p>")
    body = _join(html('<tr><td>{}</td><td>{}</td><td>{}</td><td style="text-align:left;'
                      'white-space:normal">{}</td></tr>', r["epoch"], r["partition"],
                      r["records"], r["reason"]) for r in rows)
    return html('<h3>Lost partitions</h3><div class="scroll"><table class="lost"><tr><th>epoch'
                '</th><th>partition</th><th>records</th><th>reason</th></tr>{}</table></div>',
                body)


def _refusals(rows: list[dict[str, Any]]) -> Markup:
    if not rows:
        return Markup("")
    body = _join(html('<tr><td>{}</td><td>{}</td><td>{}</td><td style="text-align:left;'
                      'white-space:normal">{}</td></tr>', _ago(r["ago_s"]), r["worker"],
                      r["count"], r["why"]) for r in rows)
    return html('<h3>Refused reports</h3><div class="scroll"><table class="refusals"><tr><th>'
                'when</th><th>reader</th><th>reports</th><th>why</th></tr>{}</table></div>',
                body)


def _histogram(histogram: dict[str, int]) -> Markup:
    if not histogram:
        return Markup("")
    top = max(histogram.values()) or 1
    rows = _join(html('<tr><td>{}</td><td>{:,}</td><td style="width:60%"><div class="bar">'
                      '<div style="width:{:.1f}%"></div></div></td></tr>', label, n,
                      100 * n / top) for label, n in histogram.items())
    return html('<h3>Labels</h3><div class="scroll"><table class="labels">{}</table></div>',
                rows)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else \
        f"{minutes}:{secs:02d}"


def _uploads(uploads: list[dict[str, Any]], error: str | None) -> Markup:
    """The uploads of the master's storage (trainfeed.ingest.board.summarize)."""
    out = [Markup('<section class="uploads" id="uploads"><h2>Uploads</h2>')]
    if error:
        out.append(html('<p><span class="flag">error</span> {}</p>', error))
    if not uploads:
        out.append(Markup("<p>None in progress, none published in the last hour.</p>"))
    out += [_upload(u) for u in uploads]
    out.append(Markup("</section>"))
    return _join(out)


def _upload(u: dict[str, Any]) -> Markup:
    share = u["records_done"] / u["records_total"] if u["records_total"] else 0.0
    bad = u["state"] in ("failed", "stale")
    state = html('<span class="flag">{}</span>' if bad else "<b>{}</b>", u["state"])
    slices = (f' · {u["slices_done"]}/{u["slices"]} slices done · {u["slices_running"]} '
              f'running' + (f' · {u["slices_waiting"]} not started' if u["slices_waiting"]
                            else "") if u["mode"] == "slices" else "")
    eta = f' · ETA {_duration(u["eta_s"])}' if u["eta_s"] is not None else ""
    ago = f' · {_ago(u["updated_ago_s"])}' if u["state"] == "published" else ""
    parts = [
        html('<div class="upload" data-dataset="{dataset}" data-state="{state}" '
             'data-records-done="{done}" data-records-total="{total}" data-slices="{slices}" '
             'data-slices-done="{slices_done}" data-slices-failed="{failed}" '
             'data-slices-stale="{stale}"><h3>{dataset} <span class="muted">({mode}, '
             'fingerprint {fingerprint})</span></h3><p class="upload-progress">{shown}{counts}'
             ' · {done:,}/{total:,} records ({share:.0%}) · {size} · {rate:,.0f} records/s'
             '{eta}{ago}</p><div class="bar"><div style="width:{width:.1f}%"></div></div>',
             dataset=u["dataset"], state=u["state"], done=u["records_done"],
             total=u["records_total"], slices=u["slices"], slices_done=u["slices_done"],
             failed=u["slices_failed"], stale=u["slices_stale"], mode=u["mode"],
             fingerprint=u["fingerprint"], shown=state, counts=slices, share=share,
             size=_size(u["bytes_done"]), rate=u["records_per_s"], eta=eta, ago=ago,
             width=100 * share),
    ]
    parts += [html('<p class="problem"><span class="flag">!</span> {}</p>', p)
              for p in u["problems"]]
    rows = [s for s in u["slice_rows"] if u["mode"] == "slices"]
    if rows:
        parts.append(Markup('<div class="scroll"><table class="slices"><tr><th>slice</th><th>'
                            'state</th><th>records</th><th>records/s</th><th>host</th><th>last '
                            'report</th><th style="text-align:left">reason</th></tr>'))
        parts += [_slice_row(r) for r in rows]
        if u["slice_rows_hidden"]:
            parts.append(html('<tr><td colspan="7">… and {} more slices</td></tr>',
                              u["slice_rows_hidden"]))
        parts.append(Markup("</table></div>"))
    parts.append(Markup("</div>"))
    return _join(parts)


def _slice_row(r: dict[str, Any]) -> Markup:
    flagged = r["state"] in ("failed", "stale")
    return html('<tr class="slice{flagged}" data-slice="{slice}" data-state="{state}" '
                'data-records-done="{done}"><td>{slice}</td><td>{state}</td><td>{done:,}/'
                '{total:,}</td><td>{rate:,.1f}</td><td>{host}</td><td>{ago}</td><td style='
                '"text-align:left;white-space:normal">{reason}</td></tr>',
                flagged=" flagged" if flagged else "", slice=r["slice"], state=r["state"],
                done=r["records_done"], total=r["records_total"], rate=r["records_per_s"],
                host=r["host"], ago=_ago(r["updated_ago_s"]), reason=r["reason"] or "")


def login_form(problem: str = "") -> str:
    message = html('<p class="flag">{}</p>', problem) if problem else ""
    return str(html(
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        'content="width=device-width,initial-scale=1"><title>trainfeed: log in</title><style>'
        '{style}</style></head><body><h1>trainfeed master</h1>{message}<form method="post" '
        'action="/login"><p><label>Token (the master\'s, or a job token from <code>trainfeed '
        'token JOB</code>)<br><input type="password" name="token" id="token" '
        'autocomplete="current-password" size="40" required></label></p><p><button '
        'type="submit" id="login">Log in</button></p></form></body></html>',
        style=_STYLE, message=message))
