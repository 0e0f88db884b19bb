"""JSON over one kept-alive HTTP/1.1 connection to etcd's gRPC gateway (`/v3/...`).

Why not `requests` (through etcd3gw): the journal writer posts one etcd txn per tick, and each
post went through requests' session, adapter, urllib3's pool and its is-the-connection-dropped
poll: 0.68 ms of CPU per txn against 0.24 ms for `http.client` on the same kept-alive connection
(/v3/kv/txn of 1 KB on loopback, measured 2026-11-26 on the 2-core project machine). In the
master that CPU is taken under the GIL from the event loop that serves the readers, and every
extra blocking step is one more wait for the GIL behind it.

Contract: one instance per thread (the store's writer, the lease keeper); not thread-safe. A
post on a kept-alive connection that the server closed meanwhile is sent again once on a fresh
connection, which is safe for every request the etcd store makes (puts of fixed keys, guarded
txns, lease grants and refreshes). `close()` is idempotent.
"""
from __future__ import annotations

import http.client
import json
from typing import Any

from trainfeed.errors import EtcdUnavailableError, TrainfeedError

__all__ = ["EtcdGateway"]

_HEADERS = {"Content-Type": "application/json", "Connection": "keep-alive"}
# Errors of a kept-alive connection that the server (or a proxy) closed while it was idle.
_STALE = (http.client.RemoteDisconnected, http.client.CannotSendRequest, BrokenPipeError,
          ConnectionResetError, ConnectionAbortedError)


class EtcdGateway:
    """Posts JSON to `http://host:port/v3<path>` and returns the decoded answer.

    Raises EtcdUnavailableError (cannot connect, timed out) or TrainfeedError (etcd answered
    with an error), each naming `what` (the state URL) and the address.
    """

    def __init__(self, host: str, port: int, timeout_s: float, what: str):
        self.host, self.port, self.timeout_s, self.what = host, port, timeout_s, what
        self.base_url = f"http://{host}:{port}/v3"
        self._conn: http.client.HTTPConnection | None = None

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(payload, separators=(",", ":")).encode()
        try:
            status, data = self._send(path, body)
        except TimeoutError:
            self.close()
            raise self._unavailable(path, f"no answer within {self.timeout_s:g} s") from None
        except OSError as e:  # refused, unreachable, reset twice
            self.close()
            raise self._unavailable(path, e.strerror or type(e).__name__) from None
        except http.client.HTTPException as e:
            self.close()
            raise self._unavailable(path, f"{type(e).__name__}: {e}") from None
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = {"error": data[:200].decode(errors="replace")}
        if status != 200 or not isinstance(answer, dict):
            message = (answer.get("message") or answer.get("error")
                       if isinstance(answer, dict) else None) or f"HTTP {status}"
            raise TrainfeedError(f"etcd for state {self.what} refused {path}: {message}")
        result: dict[str, Any] = answer
        return result

    def _send(self, path: str, body: bytes) -> tuple[int, bytes]:
        reused = self._conn is not None
        try:
            return self._exchange(path, body)
        except _STALE:
            self.close()
            if not reused:
                raise
        return self._exchange(path, body)  # once more on a fresh connection

    def _exchange(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        self._conn.request("POST", f"/v3{path}", body, _HEADERS)
        response = self._conn.getresponse()
        data = response.read()
        if response.will_close:
            self.close()
        return response.status, data

    def _unavailable(self, path: str, reason: str) -> EtcdUnavailableError:
        return EtcdUnavailableError(
            f"cannot reach etcd for state {self.what} at {self.base_url} ({path}): {reason}; "
            f"is etcd running and the address right?")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
