"""What a decode call costs in Arrow Flight itself, apart from trainfeed (issue 37).

Remote decode makes one DoExchange call per partition, and a call costs the trainer CPU whatever
its size (docs/benchmarks.md, "the trainer's CPU per image and per partition"). This measures
that cost at its floor, on loopback, with a server that does no work: the process CPU (client
and server together, one process) per call

- of a fresh DoExchange carrying one request, one credit, one small chunk and the close, the
  shape of a trainfeed decode call of one chunk, and
- of one more request and reply on a DoExchange stream kept open,

so that the gain of keeping streams open is known before anyone builds it.

    python benchmarks/flight_call_cost.py --calls 2000
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from trainfeed.decode.remote.client import _finish as finish

SCHEMA = pa.schema([("_id", pa.int64())])
CHUNK = pa.RecordBatch.from_arrays([pa.array(range(23), pa.int64())], schema=SCHEMA)
END = b'{"end": 23}'


class NullDecoder(flight.FlightServerBase):  # type: ignore[misc]
    """Answers each request with one 23-row chunk and its end message, and nothing else."""

    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor,
                    reader: flight.MetadataRecordBatchReader,
                    writer: flight.MetadataRecordBatchWriter) -> None:
        kept_open = json.loads(descriptor.command).get("kept_open", False)
        writer.begin(SCHEMA)
        try:
            while True:
                reader.read_chunk()  # a credit (one call) or a request (a stream kept open)
                writer.write_with_metadata(CHUNK, END)
                if not kept_open:
                    break
            while True:
                reader.read_chunk()  # until the client closes its side
        except StopIteration:
            return


def per_call(client: flight.FlightClient, options: flight.FlightCallOptions) -> None:
    writer, reader = client.do_exchange(
        flight.FlightDescriptor.for_command(b'{"partition": 1}'), options)
    writer.write_metadata(b'{"credit": 1}')
    reader.read_chunk()
    finish(writer, reader)  # (trainfeed's own end of a call: its side closed, the status read)
    writer.close()


def cpu_ms_per_call(call: Callable[[], None], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - started) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each, alternated")
    args = parser.parse_args()
    server = NullDecoder("grpc://127.0.0.1:0")
    threading.Thread(target=server.serve, daemon=True).start()
    client = flight.FlightClient(f"grpc://127.0.0.1:{server.port}")
    options = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer x")], timeout=60)
    writer, reader = client.do_exchange(
        flight.FlightDescriptor.for_command(b'{"kept_open": true}'), options)

    def on_open_stream() -> None:
        writer.write_metadata(b'{"partition": 1}')
        reader.read_chunk()

    print(f"load average {os.getloadavg()[0]:.2f}; CPU ms per call (client and server):")
    for _ in range(args.rounds):
        print(f"  a DoExchange call of one chunk: "
              f"{cpu_ms_per_call(lambda: per_call(client, options), args.calls):.3f}")
        print(f"  one more request on a stream kept open: "
              f"{cpu_ms_per_call(on_open_stream, args.calls):.3f}")
    writer.done_writing()
    client.close()
    server.shutdown()


if __name__ == "__main__":
    main()
