"""`trainfeed sql`: publish a SQL query's results as a dataset read in hash buckets."""
from __future__ import annotations

import argparse

from trainfeed.cli.common import add_storage_options, storage_from
from trainfeed.planning.partitions import DEFAULT_TARGET_PARTITIONS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sql", help="publish a SQL query as a dataset (PostgreSQL or SQLite)",
        description="Register QUERY on database URL as dataset NAME: the master leases hash "
                    "buckets of its rows and each worker runs its bucket's query itself. The "
                    "row count, columns and sampled statistics are taken now; passwords stay "
                    "out of the dataset (workers use PGPASSWORD or ~/.pgpass).")
    p.add_argument("name", help="dataset name")
    p.add_argument("--query", required=True, help="a single SELECT statement")
    p.add_argument("--db", required=True, metavar="URL",
                   help="postgresql://user@host:port/db, or sqlite:///path.db")
    p.add_argument("--key", nargs="+", default=[], metavar="COLUMN",
                   help="columns hashed into buckets (default: the whole row)")
    p.add_argument("--partitions", type=int, default=DEFAULT_TARGET_PARTITIONS,
                   help=f"hash buckets, many more than workers (default "
                        f"{DEFAULT_TARGET_PARTITIONS})")
    add_storage_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainfeed.sql import register_sql_dataset, sql  # drivers are an optional extra

    manifest = register_sql_dataset(args.name, sql(args.query, args.db, args.key),
                                    storage_from(args), args.partitions)
    print(f"published {manifest.name!r}: {manifest.num_records} rows in "
          f"{manifest.extra['sql']['num_partitions']} buckets, columns "
          f"{', '.join(manifest.field_names)}")
    return 0
