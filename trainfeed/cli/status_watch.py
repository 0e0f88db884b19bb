"""`trainfeed status JOB --watch`: the master's status page as a live terminal view (issue 29).

It polls the master's `/status.json` (on its metrics port, which its JobStatus answer names; the
same data as `/status`) every `--interval` seconds. On a terminal it redraws in place (ANSI:
cursor home, clear below), a screenful per refresh; when stdout is not a terminal (a pipe, a log)
it prints each refresh as plain lines, prefixed by the time, with no control characters. Ctrl-C
ends it (exit 0).

No extra dependency: the view is a few aligned lines, which ANSI's two sequences redraw well.

The snapshot's text is not ours to trust (a FAILED reason is any job-token holder's, a reader's
name its own, an upload's fields any storage writer's): every line shown passes
trainfeed.terminal_text.visible, so REDRAW is the only control sequence this view writes.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TextIO

from trainfeed.cli import status_uploads
from trainfeed.errors import AuthenticationError, MasterUnavailableError
from trainfeed.terminal_text import visible

# Cursor to the top-left corner, then clear to the end of the screen.
REDRAW = "\x1b[H\x1b[J"
FETCH_TIMEOUT_S = 10.0
MAX_READERS_SHOWN = 30
SPARK = "▁▂▃▄▅▆▇█"
MAX_PORT = 65535


def fetch(url: str, token: str | None) -> dict[str, Any]:
    """The status of `url` (…/status.json), sending the token as a bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as answer:
            return dict(json.load(answer))
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise AuthenticationError(f"{url}: the master wants its token: set $TRAINFEED_TOKEN "
                                  f"(the master's token, or this job's from `trainfeed token "
                                  f"JOB`)") from None
        raise MasterUnavailableError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise MasterUnavailableError(f"{url}: cannot reach the master's metrics port ({reason}); "
                              f"give --status-url http://HOST:PORT/status.json, or start the "
                              f"master with --metrics-port") from None


def status_url(address: str, metrics_port: int) -> str | None:
    """The /status.json of the master at `address` (HOST:PORT, its gRPC address) whose metrics
    port is `metrics_port` (what its JobStatus says); None if 0: it exports no metrics."""
    if metrics_port == 0:
        return None
    if metrics_port > MAX_PORT:
        raise MasterUnavailableError(f"the master at {address} names metrics port "
                                     f"{metrics_port}, not a port (1..{MAX_PORT}); give "
                                     f"--status-url http://HOST:PORT/status.json")
    return f"http://{address.rpartition(':')[0]}:{metrics_port}/status.json"


def spark(points: list[float]) -> str:
    """A sparkline of block characters, scaled to the maximum."""
    top = max(points, default=0.0)
    if top <= 0:
        return SPARK[0] * len(points)
    return "".join(SPARK[min(len(SPARK) - 1, int(p / top * (len(SPARK) - 1)))] for p in points)


def render(data: dict[str, Any], job: str | None) -> list[str]:
    """The lines shown for `job` in a status snapshot (trainfeed.master.serve.status), then the
    uploads the snapshot has (the master's storage's); only those when `job` is None. Each
    line is one line of printable text, whatever the snapshot holds (terminal_text.visible)."""
    if job is None:
        return status_uploads.render(data.get("uploads", []))
    uploads = [line for u in data.get("uploads", ()) for line in status_uploads.upload_lines(u)]
    return [visible(line) for line in _job_lines(data, job)] + uploads


def _job_lines(data: dict[str, Any], job: str) -> list[str]:
    """The view of `job` in the snapshot `data`: its summary, then what the snapshot adds about
    it (newer data, its sync group, its readers, its lost partitions and refused reports); one
    line naming the jobs there are when this master has no `job`."""
    found = next((j for j in data.get("jobs", ()) if j["job"] == job), None)
    if found is None:
        names = ", ".join(j["job"] for j in data.get("jobs", ())) or "none"
        return [f"job {job!r} not on this master (jobs: {names})"]
    return (_summary_lines(found) + _newer_lines(found) + _sync_group_lines(found)
            + _reader_lines(found) + _trouble_lines(found))


def _summary_lines(j: dict[str, Any]) -> list[str]:
    """The lines every job has: its dataset, the epoch's counts, the rate and the readers."""
    state = f" · {j['state']}" if "state" in j else ""
    return [
        f"job         {j['job']} (dataset {j['dataset']}, {j['num_records']:,} records){state}",
        f"epoch       {j['epoch']}: {j['done'] + j['failed']}/{j['num_partitions']} partitions "
        f"({j['progress']:.0%}) · todo {j['todo']} · pending {j['pending']} · done {j['done']}"
        f" · failed {j['failed']}",
        *_left_lines(j),
        f"rate        {j['records_per_s']:,.0f} records/s  {spark(j['sparkline'])}",
        f"input-bound {j['input_bound']:.0%} of the trainers' time waiting for data",
        f"readers     {j['workers_alive']} alive · refused reports {j['reports_refused']}",
    ]


def _newer_lines(j: dict[str, Any]) -> list[str]:
    """The notice of a newer version of the dataset, if the master has one to tell."""
    newer = j.get("newer_version")
    return [f"newer data  {newer['notice']}"] if newer else []


def _sync_group_lines(j: dict[str, Any]) -> list[str]:
    """The job's sync group (synchronous training), with why it broke or that it finished."""
    group = j.get("sync_group")
    if not group:
        return []
    state = (f" · BROKEN: {group['broken']}" if group["broken"] else
             " · finished (every rank quiet or gone between epochs)"
             if group.get("finished") else "")
    return [f"sync group  world size {group['world_size']}, batch size "
            f"{group['batch_size']}{state}"]


def _reader_lines(j: dict[str, Any]) -> list[str]:
    """A table of the first MAX_READERS_SHOWN readers (a screenful), then how many are left out."""
    readers = j["readers"]
    if not readers:
        return []
    shown = readers[:MAX_READERS_SHOWN]
    width = max(len(r["worker"]) for r in shown)
    lines = [f"{'reader':<{width}}  {'records/s':>9}  {'input-bound':>11}  "
             f"{'leases':>6}  {'contact':>8}  flags"]
    for r in shown:
        lines.append(f"{r['worker']:<{width}}  {r['records_per_s']:>9,.1f}  "
                     f"{r['input_bound']:>11.0%}  {r['leases_held']:>6}  "
                     f"{r['last_contact_s']:>7.0f}s  {' '.join(r['flags'])}".rstrip())
    if len(readers) > MAX_READERS_SHOWN:
        lines.append(f"… and {len(readers) - MAX_READERS_SHOWN} more readers")
    return lines


def _trouble_lines(j: dict[str, Any]) -> list[str]:
    """The first lost partitions and refused reports, each reason cut to 200 characters so a
    long one cannot push the rest of the view off the screen."""
    lost = [f"lost        epoch {p['epoch']} partition {p['partition']}: {p['reason'][:200]}"
            for p in j["failed_partitions"][:5]]
    refused = [f"refused     {r['count']} report(s) of {r['worker']}: {r['why'][:200]}"
               for r in j["refusals"][:3]]
    return lost + refused


def _left_lines(j: dict[str, Any]) -> list[str]:
    """Records left in the epoch and the time to its end at the recent rate ("—": no rate)."""
    if "records_left" not in j:
        return []
    eta_s = j["eta_s"]
    eta = "—" if eta_s is None else duration(eta_s)
    rate = (f" at {j['records_per_s']:,.0f} records/s" if eta_s else
            " (no records read lately)" if eta_s is None else "")
    return [f"left        {j['records_left']:,} records · to the end of the epoch {eta}{rate}"]


def duration(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else \
        f"{minutes}:{secs:02d}"


def watch(get: Callable[[], dict[str, Any]], job: str | None, interval_s: float, out: TextIO,
          tty: bool, count: int | None = None,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """Shows `job` (None: the uploads alone) every `interval_s` until Ctrl-C (or `count`
    refreshes); returns 0."""
    shown = 0
    try:
        while count is None or shown < count:
            lines = render(get(), job)
            if tty:
                out.write(REDRAW + "\n".join(lines) + "\n")
            else:
                stamp = time.strftime("%H:%M:%S")
                out.write("".join(f"{stamp} {line}\n" for line in lines))
            out.flush()
            shown += 1
            if count is None or shown < count:
                sleep(interval_s)
    except KeyboardInterrupt:
        pass
    return 0
