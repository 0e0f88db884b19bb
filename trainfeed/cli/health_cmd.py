"""`trainfeed health`: ask a master's gRPC health service whether it serves; for exec probes.

Kubernetes' native gRPC probe cannot verify TLS, so a master serving TLS is probed with
`trainfeed health` in an exec probe instead; this honours the same `$TRAINFEED_TLS_*` settings as
the readers. Exits 0 when the master answers SERVING, 1 otherwise (with the reason on stderr).
"""
from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trainfeed import settings
from trainfeed.lease.client import MASTER_ENV, unreachable_hint
from trainfeed.security import TLS_CA_ENV, TLS_SERVER_NAME_ENV, ClientSecurity
from trainfeed.terminal_text import visible

# Where a probe inside the master's own pod finds it (`trainfeed master`'s default port).
DEFAULT_ADDRESS = "127.0.0.1:50051"
# Kubernetes' default probe timeout is 1 s; a probe's own timeoutSeconds should exceed this.
DEFAULT_TIMEOUT_S = 5.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "health", help="check that a master serves (exit 0 if SERVING): for exec probes",
        description=f"Call the master's gRPC health service and exit 0 if it answers SERVING, "
                    f"1 otherwise. Uses TLS when ${TLS_CA_ENV} is set (with the other "
                    f"TRAINFEED_TLS_* settings, e.g. ${TLS_SERVER_NAME_ENV}); needs no token.")
    p.add_argument("--master", metavar="HOST:PORT",
                   help=f"the master (default ${MASTER_ENV}, else {DEFAULT_ADDRESS})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"give up after this long (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--service", default="",
                   help="the health service name to check (default '': the whole server; "
                        "'trainfeed.v1.Master' for the master's API)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    address = args.master or settings.MASTER.get() or DEFAULT_ADDRESS
    security = ClientSecurity.from_env()
    with security.open_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=args.service),
                               timeout=args.timeout)
        except grpc.RpcError as e:
            code, details = e.code(), e.details()  # type: ignore[attr-defined]
            # The details are the server's text: shown visibly (terminal_text).
            # A TLS hint only where the peer answered and the handshake failed: a refused
            # connection means no master there, TLS or not.
            hint = unreachable_hint(details, security) \
                if code is grpc.StatusCode.UNAVAILABLE else ""
            print(visible(f"trainfeed health: master {address}: {code.name}: {details}{hint}"),
                  file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"trainfeed health: master {address}: {status}", file=sys.stderr)
        return 1
    print(status)
    return 0
