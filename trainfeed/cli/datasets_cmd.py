"""`trainfeed ls` and `trainfeed info NAME`: what is stored.

A manifest is any storage writer's: its text (source, times, fields, shard paths, labels) is
printed through `say`, which shows control characters visibly; `--json` is escaped by
`json.dumps` itself."""
from __future__ import annotations

import argparse

from trainfeed.cli.common import add_storage_options, say, say_cells, storage_from
from trainfeed.formats.manifest import Manifest, list_datasets, read_manifest, split_version


def register(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("ls", help="list the published datasets",
                        description="List the published datasets of a storage, with sizes.")
    add_storage_options(ls)
    ls.set_defaults(run=run_ls)
    info = sub.add_parser("info", help="show one dataset's manifest",
                          description="Show a dataset's schema, shards, counts and labels.")
    info.add_argument("name", help="dataset name; NAME@N shows version N")
    add_storage_options(info)
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")
    info.set_defaults(run=run_info)


def run_ls(args: argparse.Namespace) -> int:
    storage = storage_from(args)
    names = list_datasets(storage)
    if not names:
        say(f"no datasets in {storage.url}")
    for name in names:
        m = read_manifest(storage, name)
        say_cells(name, m.kind, f"{m.num_records} records", f"{m.num_bytes / 1e6:.1f} MB",
                  f"{len(m.shards)} shard(s)", m.created_at)
    return 0


def run_info(args: argparse.Namespace) -> int:
    name, version = split_version(args.name)
    m = read_manifest(storage_from(args), name, version)
    if args.json:
        print(m.to_json().decode())  # json.dumps escaped every control character
        return 0
    say(f"dataset   {m.name} ({m.kind} list, from {m.source}, {m.created_at})")
    say(f"version   {m.dataset_version}")
    say(f"fields    {', '.join(f'{f.name}:{f.type}' for f in m.fields)}")
    say(f"records   {m.num_records}  ({m.num_bytes / 1e6:.1f} MB payload)")
    say(f"shards    {len(m.shards)} with {m.num_row_groups} row groups")
    for s in m.shards:
        say(f"  {s.path}  {s.num_rows} rows  {len(s.row_groups)} row groups  "
            f"{s.num_bytes / 1e6:.1f} MB  sha256 {s.sha256[:16]}…")
    if m.label_histogram:
        say(f"labels    {len(m.label_histogram)} classes")
        for label, count in m.label_histogram.items():
            say_cells(f"  {label}", count)
    if m.skipped:
        say(f"skipped   {len(m.skipped)} missing file(s)")
    _print_versions(m)
    return 0


def _print_versions(m: Manifest) -> None:
    """The readable versions up to `m`'s, oldest first: each readable as NAME@N."""
    history = m.history
    say(f"versions  {len(history)} (read one with dist.reader(\"{m.name}@N\"))")
    total = 0
    for v in history:
        total += v.added_records
        say_cells(f"  {m.name}@{v.version}", v.created_at,
                  f"+{v.added_records} records from {v.source}", f"{total} in all")
