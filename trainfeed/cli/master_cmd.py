"""`trainfeed master`: serve tasks over gRPC."""
from __future__ import annotations

import argparse
import sys

from trainfeed.cli.common import add_storage_options, storage_from
from trainfeed.master.ledger import DEFAULT_MAX_FAILURES
from trainfeed.master.partition import DEFAULT_TARGET_PARTITIONS
from trainfeed.master.server import run_master
from trainfeed.master.service import DEFAULT_LEASE_TIMEOUT_S, MasterConfig
from trainfeed.master.state_store import STATE_ENV, open_state_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "master", help="run the master (hands out partitions over gRPC)",
        description="Serve datasets of a storage to readers: each job's epochs are split into "
                    "partitions leased to readers (TRAINFEED_MASTER=host:port on the workers).")
    add_storage_options(p)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=50051,
                   help="port to listen on (default 50051; 0 picks a free one, printed at start)")
    p.add_argument("--state", metavar="URL",
                   help=f"job state store: a SQLite path or sqlite:///path (one master per "
                        f"file), etcd://host:port[/prefix][?ttl=SECONDS] (standby masters wait "
                        f"for the leadership), or memory:// (default ${STATE_ENV}, else "
                        f"./trainfeed-master.db)")
    p.add_argument("--lease-timeout", type=float, default=DEFAULT_LEASE_TIMEOUT_S,
                   metavar="SECONDS",
                   help=f"how long a silent worker keeps its tasks (default "
                        f"{DEFAULT_LEASE_TIMEOUT_S:g})")
    p.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES,
                   help=f"failures after which a partition is skipped for the epoch (default "
                        f"{DEFAULT_MAX_FAILURES})")
    p.add_argument("--partitions", type=int, default=DEFAULT_TARGET_PARTITIONS,
                   help=f"target partitions per dataset, ≥ 16 per expected worker (default "
                        f"{DEFAULT_TARGET_PARTITIONS}; capped by the dataset's row groups)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the parent process exits (for masters spawned by scripts)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = MasterConfig(storage=storage_from(args), lease_timeout_s=args.lease_timeout,
                          max_failures=args.max_failures, target_partitions=args.partitions)
    store = open_state_store(args.state)

    def ready(port: int) -> None:
        print(f"trainfeed master listening on {args.host}:{port} (storage {config.storage.url})",
              flush=True)
        sys.stdout.flush()
    run_master(config, store, args.host, args.port, on_ready=ready,
               exit_with_parent=args.exit_with_parent)
    return 0
