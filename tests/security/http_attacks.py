"""The HTTP attacks of issue 35 on a master's metrics port, as plain sockets (no client library
would send a negative length or hold a body back): used by tests/security/test_http_doors.py and
benchmarks/attack_http.py. Every socket has a timeout; nothing here waits without one."""
from __future__ import annotations

import re
import socket
import time
import urllib.request
from collections.abc import Callable

MIB = 1 << 20
CHUNK = b"x" * (64 * 1024)
# A socket that gets no answer within this long counts as not answered (the master's idle
# timeout is 10 s: every wait here is longer, so that a busy machine does not fail a test).
WAIT_S = 60.0


def status_of(data: bytes) -> int | None:
    """The status code of a raw HTTP answer, None if it is not one."""
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", data)
    return int(match.group(1)) if match else None


def request(port: int, raw: bytes, timeout_s: float = WAIT_S) -> bytes:
    """Sends `raw`, returns what comes back until the master closes or `timeout_s` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(raw)
        return read_all(sock, timeout_s)


def read_all(sock: socket.socket, timeout_s: float = WAIT_S, limit: int = 4 * MIB) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout_s
    while len(got) < limit and time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except (TimeoutError, ConnectionError):
            break
        if not data:
            break
        got += data
    return got


def login_head(length: int | str | None, chunked: bool = False, extra: str = "") -> bytes:
    """The head of `POST /login` announcing `length` (None: no Content-Length)."""
    lines = ["POST /login HTTP/1.1", "Host: 127.0.0.1",
             "Content-Type: application/x-www-form-urlencoded"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def send_big_body(port: int, size: int, chunked: bool = False,
                  stop: Callable[[], bool] = lambda: False) -> tuple[int, int | None]:
    """POSTs a `size`-byte body to /login as fast as the master takes it (with its length
    announced, or chunked); returns (bytes the master took, the status it answered or None)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.settimeout(5)
        try:
            sock.sendall(login_head(None if chunked else size, chunked))
            while sent < size and not stop():
                piece = CHUNK[:size - sent]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (TimeoutError, ConnectionError):
            pass  # the master stopped reading (its answer is below) or closed
        return sent, status_of(read_all(sock, 10))


def hold(port: int, count: int, head: bytes = b"") -> list[socket.socket]:
    """`count` connections that sent `head` (nothing if empty) and then nothing more."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        if head:
            sock.sendall(head)
        sockets.append(sock)
    return sockets


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the master closes `sock` within `timeout_s` (any answer it sends first is read)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


def scrape(port: int, timeout_s: float = WAIT_S) -> bytes:
    """GET /metrics; raises if the master does not answer 200 within `timeout_s`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
        assert r.status == 200
        return bytes(r.read())


def proc_status(pid: int, field: str) -> int:
    """A number of /proc/PID/status (`VmRSS` in bytes, `Threads` as a count)."""
    with open(f"/proc/{pid}/status") as f:
        match = re.search(rf"^{field}:\s+(\d+)", f.read(), re.M)
    assert match, field
    return int(match.group(1)) * (1024 if field.startswith("Vm") else 1)
