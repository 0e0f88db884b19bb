"""Where an upload's CPU goes, per photo and per guarantee (issue 39, item 4).

Runs `trainfeed upload --processes 1` in this process (the packing then runs here too, see
trainfeed.ingest.pool) under cProfile with the main thread's own CPU clock, so that load from
other processes on a shared machine moves the figures as little as possible, and charges each
stage what its functions took:

- the list: parsing, a stat per file, the confinement checks (`..`, symlinks out);
- reading the photos: the read threads' CPU (the process's CPU minus the main thread's);
- the Parquet shard: encoding and writing it to the page cache, with Parquet's page CRC-32; the
  page CRC's own share is measured apart, by writing the same photos with and without it;
- the payload index: a CRC-32 (ISA-L) and a CRC-32C per value;
- the shard read back, its SHA-256 (the manifest's), and each value located in it and checked
  by its CRC-32C (the index a reader trusts);
- fsync, the index and progress files, the rename, and the manifest published last.

Imports made on first use inside the window are a row of their own (a fixed cost per process).

    python benchmarks/upload_stages.py PHOTOS.list
    python benchmarks/upload_stages.py PHOTOS.list --json stages.json
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trainfeed.cli import upload_cmd  # noqa: F401  (imported before the window)
from trainfeed.cli.main import main as cli
from trainfeed.formats.listfile import parse_list

Stats = dict[tuple[str, int, str], tuple[int, int, float, float, dict[Any, Any]]]


def matching(stats: Stats, name: str, where: str = "") -> list[Any]:
    """Profile entries of function `name` (a Python function's name, or part of a builtin's
    description) in a file whose path contains `where`."""
    return [v for k, v in stats.items()
            if (k[2] == name or (k[0] == "~" and name in k[2])) and where in k[0]]


def own(stats: Stats, name: str, where: str = "", caller: str | None = None) -> float:
    """CPU seconds spent in `name` itself (only under `caller`, when given)."""
    total = 0.0
    for _, _, tottime, _, callers in matching(stats, name, where):
        total += tottime if caller is None else sum(
            c[2] for k, c in callers.items() if k[2] == caller)
    return total


def inclusive(stats: Stats, name: str, where: str = "") -> float:
    return sum(v[3] for v in matching(stats, name, where))


def page_crc_cost(paths: Sequence[str], rows_per_group: int = 100) -> tuple[float, float]:
    """CPU seconds per photo of Parquet-encoding `paths` to /dev/null without and with page
    checksums (the shard writer's settings for binary columns: plain, uncompressed)."""
    values = []
    for path in paths:
        with open(path, "rb") as f:
            values.append(f.read())
    table = pa.table({"_id": pa.array(range(len(values)), pa.int64()),
                      "image": pa.array(values, pa.binary())})

    def write(checksum: bool) -> float:
        started = time.thread_time()
        writer = pq.ParquetWriter(os.devnull, table.schema, compression="NONE",
                                  use_dictionary=False, write_statistics=["_id"],
                                  write_page_checksum=checksum)
        for at in range(0, len(values), rows_per_group):
            writer.write_table(table.slice(at, rows_per_group), row_group_size=rows_per_group)
        writer.close()
        return (time.thread_time() - started) / len(values)

    runs = [(write(False), write(True)) for _ in range(3)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def measure(list_path: str) -> dict[str, Any]:
    photos = len(parse_list(list_path).entries)
    out = tempfile.mkdtemp(prefix="upload-stages-")
    try:
        args = ["upload", list_path, "--dataset", "stages", "--storage", out, "--no-progress",
                "--processes", "1"]
        before, main_before = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        code = cli(args)
        profile.disable()
        after, main_after = resource.getrusage(resource.RUSAGE_SELF), time.thread_time()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if code != 0:
        raise SystemExit(f"the upload failed ({code})")
    stats: Stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    process = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    main = main_after - main_before
    imports = inclusive(stats, "_find_and_load")
    stages = {
        "list: parse, stat, confinement checks": inclusive(stats, "read_inputs"),
        "read the photos (read threads)": process - main,
        "Parquet: encode + page CRC-32 + write to the page cache": own(stats, "write_table"),
        "index: CRC-32 per value (ISA-L)": own(stats, "isal_zlib.crc32"),
        "index: CRC-32C per value": own(stats, "_crc32c.value", caller="add"),
        "shard read back": own(stats, "'readinto'", caller="region"),
        "SHA-256 of the shard (manifest)": own(stats, "'update' of '_hashlib", caller="_scan"),
        "locate each value, checked by its CRC-32C": inclusive(stats, "_locate_group"),
        "fsync of the shard": own(stats, "posix.fsync"),
        "index + progress files, rename": (inclusive(stats, "_write", "ingest/pack.py")
                                           - inclusive(stats, "finish", "formats/shards.py")),
        "manifest and sources, published last": inclusive(stats, "build_manifest"),
        "imports on first use": imports,
    }
    named = sum(v for k, v in stages.items() if not k.startswith(("read the", "imports")))
    stages["the rest of the main thread (plan, row groups, labels, Python)"] = (
        main - named - imports)
    without_crc, with_crc = page_crc_cost([e.columns[0] for e in
                                           parse_list(list_path).entries[:1000]])
    per = {k: round(v * 1e3 / photos, 4) for k, v in stages.items()}
    return {"photos": photos, "load": os.getloadavg(), "cpu_ms_per_photo":
            round(process * 1e3 / photos, 4), "stages_ms_per_photo": per,
            "parquet_page_crc_ms_per_photo": round((with_crc - without_crc) * 1e3, 4)}


def render(result: dict[str, Any]) -> str:
    lines = ["| stage | CPU ms per photo |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in result["stages_ms_per_photo"].items()]
    lines.append(f"| **all (process CPU)** | **{result['cpu_ms_per_photo']:.3f}** |")
    lines.append(f"| of the Parquet row: page CRC-32 (written to /dev/null with and without) "
                 f"| {result['parquet_page_crc_ms_per_photo']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("list", help="a file list of photos (benchmarks/make_imagenet_like.py)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    result = measure(os.path.abspath(args.list))
    print(f"{result['photos']} photos, load {result['load'][0]:.1f}")
    print(render(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
