"""What a trainer asks a decoder for, and the bounds every request must keep (both sides).

Transport: Arrow Flight `DoExchange` (pyarrow.flight). The request is the descriptor's command,
JSON of `DecodeRequest`; the trainer grants credit (`{"credit": n}`, metadata-only messages) and
the decoder sends at most that many chunks ahead; each chunk is a record batch of the partition's
records in delivery order: `_id`, the small fields as stored, and each image field as
`fixed_size_binary(H*W*C)` uint8 pixels (null: a record that failed to decode under "skip").
The last chunk carries `{"end": records}` as its metadata (a decoder before 2026-11-29 sent it
as a metadata-only message after the last chunk; a trainer reads either). A decoder on the
trainer's host writes the pixels into the memfd the request's `shared_pixels` names instead
(from byte `shared_offset` on), and each image field of a chunk is then one boolean per record,
true where it decoded (trainfeed.decode.remote.shared_pixels). The trainer grants only the
credit a call still needs (a call of one chunk: one grant).

Flight was chosen by measurement (benchmarks/remote_decode.py --transport, 2026-11-29, a shared
2-core machine at load 18-21): receiving 64-image chunks of 224x224x3 on one core cost the
trainer 0.11-0.16 ms of CPU per image over Flight and 0.17-0.21 ms over gRPC streaming of raw
bytes, in four runs (Python's gRPC copies each message into a bytes object; Flight hands Arrow
the received buffers).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from trainfeed.errors import DecoderRefusedError  # (re-exported: its old home)

__all__ = ["DRAINING", "DecodeRequest", "DecoderRefusedError", "MAX_CHUNK_BYTES",
           "MAX_CHUNK_RECORDS", "MAX_CREDIT", "MAX_CALLS_PER_CLIENT", "MAX_IMAGE_BYTES",
           "MAX_RECORDS", "MAX_REQUEST_BYTES", "chunk_records"]

# Flight's extra_info of a call refused by a decoder that is stopping (SIGTERM: it lets its calls
# in flight finish, trainfeed.decoder.drain): the trainer asks another decoder at once, and does
# not count the refusal as that decoder's failure.
DRAINING = b"draining"

# The bounds of one request (the decoder refuses a request outside them, naming the bound):
# records one request may ask for (a partition is at most ~1 GB of shards; 2^20 records of a
# few hundred bytes each is the largest the planner makes),
MAX_RECORDS = 1 << 20
# the bytes of one decoded image (4096x4096 RGB: a bound far above any training crop),
MAX_IMAGE_BYTES = 4096 * 4096 * 3
# records and bytes per chunk (the unit of credit; 32 images of 224x224x3 is 4.8 MB: under the
# 64 MB a chunk may hold, so that gRPC's message limit is never what refuses it),
MAX_CHUNK_RECORDS = 256
MAX_CHUNK_BYTES = 64 << 20
# chunks a trainer may have granted and not yet received (the decoder's send-ahead: at most
# MAX_CREDIT * MAX_CHUNK_BYTES = 512 MB per call is queued, in practice 8 * 4.8 MB),
MAX_CREDIT = 8
# calls in flight per client connection (a trainer sends at most one per decoder per segment),
MAX_CALLS_PER_CLIENT = 4
# and the request's JSON itself.
MAX_REQUEST_BYTES = 16 << 10
# Images per chunk: enough that per-message costs vanish (measured: 64 vs 32 within noise),
# few enough that a chunk decodes in tens of milliseconds on one decoder.
CHUNK_IMAGE_BYTES = 8 << 20
# Keys a request may leave out (older trainers).
OPTIONAL = {"shared_pixels", "shared_offset"}


def chunk_records(image_bytes: int) -> int:
    """Records per chunk for images of `image_bytes` each: ~CHUNK_IMAGE_BYTES, within bounds."""
    return max(1, min(MAX_CHUNK_RECORDS, CHUNK_IMAGE_BYTES // max(1, image_bytes)))


@dataclass(frozen=True)
class DecodeRequest:
    """Records [skip, stop or num_records) of partition `partition` of `epoch`, in the delivery
    order the trainer's pass uses (shuffled by `shuffle_seed` when set), decoded with `decode`
    (DecodeOptions' fields) in `mode`, crops seeded by (`seed`, epoch, record id).

    Everything needed to read the partition travels in the request, so a decoder keeps no state
    between calls and any decoder can serve the rest of a segment another one left.
    """

    dataset: str
    version: int | None
    epoch: int
    partition: int
    shard: str
    row_group_start: int
    row_group_stop: int
    num_records: int
    row_start: int
    skip: int
    stop: int
    shuffle_seed: int | None
    seed: int
    mode: str
    fields: tuple[str, ...]
    image_fields: tuple[str, ...]
    decode: dict[str, Any]
    max_pixels: int
    chunk: int
    # A decoder on the trainer's host writes the pixels here (trainfeed.decode.remote.shared_pixels:
    # "<pid>/<fd>/<name>" of a memfd); None: they travel in the chunks.
    shared_pixels: str | None = None
    # Where in that memfd this request's pixels start (the trainer puts consecutive calls'
    # pixels one after another in one memfd).
    shared_offset: int = 0

    @property
    def records(self) -> int:
        """Records this request delivers."""
        return max(0, (self.stop or self.num_records) - self.skip)

    def image_bytes(self) -> int:
        """Bytes of one decoded image (the decode options' image_size and channels)."""
        size = self.decode.get("image_size") or (0, 0)
        return int(size[0]) * int(size[1]) * int(self.decode.get("channels", 3))

    def encode(self) -> bytes:
        # (Fields by name, not dataclasses.asdict: it deep-copies the decode options on every
        # call. shared_offset 0 is left out, as a trainer before it sent its requests.)
        raw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if not self.shared_offset:
            del raw["shared_offset"]
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> DecodeRequest:
        """The request in `data`, checked against the bounds; raises DecoderRefusedError
        naming what is wrong."""
        if len(data) > MAX_REQUEST_BYTES:
            raise DecoderRefusedError(f"request of {len(data)} bytes is over the "
                                      f"{MAX_REQUEST_BYTES}-byte bound")
        try:
            raw = json.loads(data)
            names = {f.name for f in dataclasses.fields(cls)}
            if not isinstance(raw, dict) or not names - OPTIONAL <= set(raw) <= names:
                raise TypeError(f"expected the keys {sorted(names)}")
            raw["fields"] = tuple(raw["fields"])
            raw["image_fields"] = tuple(raw["image_fields"])
            request = cls(**raw)
        except (ValueError, TypeError, KeyError) as e:
            raise DecoderRefusedError(f"malformed decode request: {e}") from None
        request.check()
        return request

    def check(self) -> None:
        """Raises DecoderRefusedError unless the request keeps the bounds (types included:
        a request comes from the network)."""
        self._check_types()
        self._check_bounds()

    def _check_types(self) -> None:
        ints = {"epoch": self.epoch, "partition": self.partition,
                "row_group_start": self.row_group_start, "row_group_stop": self.row_group_stop,
                "num_records": self.num_records, "row_start": self.row_start,
                "skip": self.skip, "stop": self.stop, "seed": self.seed, "chunk": self.chunk,
                "max_pixels": self.max_pixels, "shared_offset": self.shared_offset}
        for name, value in ints.items():
            if type(value) is not int or value < 0:
                raise DecoderRefusedError(f"{name} must be a whole number ≥ 0, got {value!r}")
        for name, text in (("dataset", self.dataset), ("shard", self.shard),
                           ("mode", self.mode)):
            _check_text(name, text)
        for name, optional in (("version", self.version), ("shuffle_seed", self.shuffle_seed)):
            _check_optional_int(name, optional)
        for name, names in (("fields", self.fields), ("image_fields", self.image_fields)):
            _check_names(name, names)
        if not isinstance(self.decode, dict):
            raise DecoderRefusedError("decode must be an object of DecodeOptions' fields")
        if self.shared_pixels is not None:
            _check_text("shared_pixels", self.shared_pixels)

    def _check_bounds(self) -> None:
        if self.records > MAX_RECORDS or self.num_records > MAX_RECORDS:
            raise DecoderRefusedError(
                f"request for {max(self.records, self.num_records)} records is over the bound "
                f"of {MAX_RECORDS} records per request: ask for the partition in segments")
        if not 1 <= self.chunk <= MAX_CHUNK_RECORDS:
            raise DecoderRefusedError(f"chunk of {self.chunk} records is outside the bound "
                                      f"[1, {MAX_CHUNK_RECORDS}]")
        image = self.image_bytes()
        if not 0 < image <= MAX_IMAGE_BYTES:
            raise DecoderRefusedError(
                f"decoded images of {image} bytes are outside the bound (0, {MAX_IMAGE_BYTES}]:"
                f" remote decode needs image_size, at most 4096x4096")
        if image * self.chunk * max(1, len(self.image_fields)) > MAX_CHUNK_BYTES:
            raise DecoderRefusedError(
                f"chunks of {self.chunk} records of {image}-byte images are over the "
                f"{MAX_CHUNK_BYTES}-byte bound per chunk")


def _check_text(name: str, text: object) -> None:
    if not isinstance(text, str) or not text or len(text) > 1024:
        raise DecoderRefusedError(f"{name} must be a non-empty string of at most 1024 "
                                  f"characters")


def _check_optional_int(name: str, value: object) -> None:
    if value is not None and (type(value) is not int or value < 0):
        raise DecoderRefusedError(f"{name} must be a whole number ≥ 0 or null, got "
                                  f"{str(value)[:100]!r}")


def _check_names(name: str, names: tuple[str, ...]) -> None:
    if len(names) > 1024 or not all(isinstance(n, str) and n for n in names):
        raise DecoderRefusedError(f"{name} must be a list of at most 1024 field names")


def credit_message(n: int) -> bytes:
    """The trainer's grant of `n` more chunks."""
    return json.dumps({"credit": n}).encode()


def end_message(records: int) -> bytes:
    """The decoder's last message: how many records it sent."""
    return json.dumps({"end": records}).encode()


def parse_control(data: bytes | None) -> dict[str, int]:
    """A credit or end message (an empty dict for none), each value a whole number ≥ 0."""
    if not data:
        return {}
    try:
        raw = json.loads(data)
    except ValueError:
        raise DecoderRefusedError("malformed control message") from None
    if (not isinstance(raw, dict) or len(raw) != 1
            or not all(type(v) is int and v >= 0 for v in raw.values())):
        raise DecoderRefusedError(f"malformed control message: {str(raw)[:100]}")
    return raw
