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
