"""Requests for the tests that call the master without trainfeed's client (attacks, limits,
authentication): the master refuses an OpenJob of another wire protocol (trainfeed.protocol), so
theirs speak this release's."""
from __future__ import annotations

from typing import Any

from trainfeed.protocol import PROTOCOL_VERSION
from trainfeed.v1 import master_pb2 as pb


def open_request(**fields: Any) -> pb.OpenJobRequest:
    """`OpenJobRequest(**fields)` with this release's protocol version."""
    return pb.OpenJobRequest(protocol_version=PROTOCOL_VERSION, **fields)


def session_open(job: str, worker: str, secret: str, exchange: bool = True) -> pb.WatchRequest:
    """The `open` of a Session stream of session `worker` (protocol 3: every lease message
    rides one)."""
    return pb.WatchRequest(job=job, worker_id=worker, session_secret=secret, exchange=exchange)


def exchange(stub: Any, opening: pb.WatchRequest, message: pb.SessionMessage,
             metadata: Any = None, timeout: float = 30) -> pb.WatchEvent:
    """`message` (its `seq` set) on a Session stream opened with `opening` on a bare stub: its
    answer (a refused `get_tasks` is an answer with `grant_refused`). A refused stream raises
    its grpc.RpcError, as a refused call would."""
    from trainfeed.lease.client import SessionStream

    assert message.seq, "only a message with a seq is answered"
    stream = SessionStream(stub, metadata, opening, timeout)
    try:
        stream.send(message)
        for event in stream:
            if event.answers == message.seq:
                return event
        raise AssertionError(f"the Session stream ended without answering {message.seq}")
    finally:
        stream.cancel()


def call(stub: Any, name: str, request: Any, timeout: float = 30, metadata: Any = None) -> Any:
    """`stub.<name>(request)`; for "Session", `request` is (`open`, message) and the answer
    is the message's (see `exchange`)."""
    if name == "Session":
        opening, message = request
        return exchange(stub, opening, message, metadata, timeout)
    return getattr(stub, name)(request, timeout=timeout, metadata=metadata)
