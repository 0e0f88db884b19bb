"""A decode request from the network is checked field by field before a decoder acts on it
(trainfeed.decode.remote.wire): malformed, mistyped or out-of-bounds requests are refused,
naming what is wrong; a request as a trainer makes it comes back unchanged."""
from __future__ import annotations

import json
from typing import Any

import pytest

from trainfeed.decode.remote.wire import (
    MAX_REQUEST_BYTES,
    DecodeRequest,
    DecoderRefusedError,
    parse_control,
)

GOOD: dict[str, Any] = {
    "dataset": "flowers", "version": 1, "epoch": 0, "partition": 3, "shard": "data/a/s.parquet",
    "row_group_start": 0, "row_group_stop": 1, "num_records": 10, "row_start": 0, "skip": 2,
    "stop": 0, "shuffle_seed": 7, "seed": 7, "mode": "train", "fields": ["image", "label"],
    "image_fields": ["image"], "decode": {"enabled": True, "image_size": [224, 224]},
    "max_pixels": 1000, "chunk": 32}


def encoded(**changes: Any) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def test_a_request_round_trips() -> None:
    request = DecodeRequest.parse(encoded())
    assert DecodeRequest.parse(request.encode()) == request
    assert request.records == 8 and request.image_bytes() == 224 * 224 * 3
    placed = DecodeRequest.parse(encoded(shared_offset=4096 * 3 + 12))
    assert DecodeRequest.parse(placed.encode()) == placed and placed.shared_offset == 12300
    # (Left out when 0: the request as a trainer before shared_offset sent it.)
    assert "shared_offset" not in json.loads(request.encode())


@pytest.mark.parametrize(("data", "message"), [
    (b"{not json", "malformed decode request"),
    (b"[1, 2]", "expected the keys"),
    (encoded(extra=1), "expected the keys"),
    (encoded(epoch=True), "epoch must be a whole number"),
    (encoded(skip=-1), "skip must be a whole number"),
    (encoded(seed=1.5), "seed must be a whole number"),
    (encoded(version="1"), "version must be a whole number ≥ 0 or null"),
    (encoded(shuffle_seed=-3), "shuffle_seed must be"),
    (encoded(dataset=""), "dataset must be a non-empty string"),
    (encoded(fields=["image", 3]), "fields must be a list"),
    (encoded(decode=[1]), "decode must be an object"),
    (encoded(decode={"enabled": True}), "remote decode needs image_size"),
    (encoded(chunk=0), "outside the bound"),
    (encoded(shared_offset=-1), "shared_offset must be a whole number"),
    (encoded(shared_offset="4096"), "shared_offset must be a whole number"),
    (b" " * (MAX_REQUEST_BYTES + 1), f"over the {MAX_REQUEST_BYTES}-byte bound"),
])
def test_a_bad_request_is_refused_naming_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(DecoderRefusedError, match=message):
        DecodeRequest.parse(data)


@pytest.mark.parametrize("data", [b"nope", b'{"credit": -1}', b'{"credit": 1, "end": 2}',
                                  b'{"credit": true}', b'"credit"'])
def test_a_bad_control_message_is_refused(data: bytes) -> None:
    with pytest.raises(DecoderRefusedError, match="malformed control message"):
        parse_control(data)


def test_control_messages_parse() -> None:
    assert parse_control(b'{"credit": 4}') == {"credit": 4}
    assert parse_control(None) == {}


def test_pixels_of_another_size_from_a_decoder_are_refused() -> None:
    import pyarrow as pa

    from trainfeed.decode.remote.client import received_pixels
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(12), 2,
                                                  [None, pa.py_buffer(bytes(24))])
    assert received_pixels(column, (2, 2, 3)).images.shape == (2, 2, 2, 3)
    with pytest.raises(DecoderRefusedError, match="images of 12 bytes"):
        received_pixels(column, (2, 2, 1))
