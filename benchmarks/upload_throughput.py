"""Upload throughput against `cp -r` + `sync` of the same files, in one run (issue 30 §2).

Data: ImageNet-like JPEGs (benchmarks/make_imagenet_like.py: natural-photo crops, ~474x413 px,
~83 KB at quality 90), generated on first use. Each pass, interleaved, runs every method in a
process of its own, from a warm page cache (the files are read once before each run), writing
to a fresh folder, and ends with `sync`, so that every method pays for getting its bytes to
disk. The copies stay until the run ends (`--root` needs room for all of them): deleting 10,000
files before the next run made ext4 search its inode tables for each file the next `cp` created
(`recently_deleted`, `ext4_find_dest_de` in `perf`), and `cp` took 2.9, then 7.7, then 11.6 s in
successive passes, all of it system CPU; the upload, writing a dozen files, paid none of that.

- `cp`: `cp -r` of the image folder, then `sync` (the baseline);
- `upload`: `trainfeed upload` with its default processes (one per core and one more), then `sync`;
- `upload-1p`: the same with `--processes 1` (what one process does);
- `upload-cores`: the same with one process per core (the default before 2026-11-30, which now
  adds one process to pack while another waits for the disk);
- `restarts`: `trainfeed upload --jpeg-restarts`;
- `restarts-1p`: the same with `--processes 1`;
- `resized`: `trainfeed upload --max-side 256 --jpeg-restarts` (FFCV's ImageNet ingest size);
- `cli-start`: `trainfeed upload --help`: the interpreter and the CLI's imports, the fixed cost
  every upload pays whatever its data (so that a ratio on few files can be read).

Every trainfeed method runs the trainfeed of the checkout this script is in (its folder first on
PYTHONPATH, and the working directory). `--compare PATH` also runs each trainfeed method with
the checkout at PATH (another branch, `git archive main | tar -x -C PATH`), reported as
`METHOD@NAME` (NAME: PATH's folder name), next to the same method of this one in every pass
(after it in even passes, before it in odd ones): the two trees meet the same load.

Reported per method, medians over `--passes`: seconds, images/s, MB/s of input, the ratio to
`cp` of the same pass (wall), the CPU seconds of the method's processes (children's rusage),
their ratio to `cp`'s CPU seconds in the same pass, CPU milliseconds per image, images per
CPU-second (what a core does: the figure that load on a shared machine moves least) and images/s
per core of the machine; and user-space CPU milliseconds per image (`user ms/image`: the kernel's
share of the CPU, copying pages into the page cache, moved 5x between passes of the same `cp` on
a shared virtual machine, user space far less). The machine's load average before each run is
recorded. Each method's busy cores (of those it asked for: 1 for `cp` and `--processes 1`, else
the machine's) and the foreign load over its run (sync excluded) are printed; a ratio to `cp`
counts only the passes where both sides were fair (benchmarks/fairness.py), else it reads "not
comparable (why)".

    python benchmarks/upload_throughput.py --images 3000 --passes 3
    python benchmarks/upload_throughput.py --methods cp upload --images 10000
    python benchmarks/upload_throughput.py --methods cp upload --compare /tmp/main-tree
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from fairness import (
    PassMeter,
    cores_asked,
    every_core,
    fair_median,
    pass_ratios_text,
    pass_records,
    side_of,
)
from make_imagenet_like import ensure_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)  # the checkout whose trainfeed the methods run
DEFAULT_ROOT = os.path.join(tempfile.gettempdir(), "trainfeed-bench", "upload")
METHODS: dict[str, list[str] | None] = {
    "cp": None,
    "upload": [],
    "upload-1p": ["--processes", "1"],
    "upload-cores": ["--processes", str(every_core())],
    "restarts": ["--jpeg-restarts"],
    "restarts-1p": ["--jpeg-restarts", "--processes", "1"],
    "resized": ["--max-side", "256", "--jpeg-restarts"],
    "cli-start": ["--help"],
}


def cores_of(method: str) -> float:
    """The cores a method is set up to use (benchmarks/fairness.py's verdict): `cp` and the
    one-process uploads one, the others a process per core."""
    single = method in ("cp", "cli-start") or method.endswith("-1p")
    return cores_asked(1 if single else every_core())


def command(method: str, list_path: str, out: str) -> list[str]:
    """The command a method runs (its `sync` follows it)."""
    if method == "cp":
        return ["cp", "-r", os.path.dirname(list_path), out]
    if method == "cli-start":
        return [sys.executable, "-m", "trainfeed.cli.main", "upload", "--help"]
    return [sys.executable, "-m", "trainfeed.cli.main", "upload", list_path, "--dataset",
            "bench", "--storage", out, "--no-progress", *(METHODS[method] or [])]


def files_of(folder: str) -> list[str]:
    return [os.path.join(parent, name) for parent, _, names in os.walk(folder) for name in names]


def warm(folder: str) -> int:
    """Reads every file of `folder` (page cache); returns their bytes."""
    total = 0
    for path in files_of(folder):
        with open(path, "rb") as f:
            total += len(f.read())
    return total


def cool(folder: str) -> int:
    """Drops `folder`'s files from the page cache (clean pages only: call after `sync`) by
    posix_fadvise(DONTNEED), which needs no privilege, where `echo 3 >
    /proc/sys/vm/drop_caches` is refused (a container); returns their bytes."""
    total = 0
    for path in files_of(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            total += os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return total


def cached_share(folder: str) -> float:
    """The share of `folder`'s bytes in the page cache: each file read with RWF_NOWAIT, which
    returns what is cached (from the start) and never waits on the disk, nor reads ahead."""
    cached = total = 0
    for path in files_of(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            total += size
            buffer = bytearray(size)
            try:
                cached += os.preadv(fd, [buffer], 0, os.RWF_NOWAIT)
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    return cached / total if total else 1.0


def tree_env(tree: str) -> dict[str, str]:
    """The environment that makes `python -m trainfeed...` import the trainfeed of `tree`."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": tree + (os.pathsep + path if path else "")}


def run_one(method: str, list_path: str, scratch: str, tree: str = REPO,
            label: str | None = None, cache: str = "warm") -> dict[str, Any]:
    """One run of `method`, its source `cache`: "warm" (every file read first) or "cold"
    (every file dropped from the page cache first, see `cool`)."""
    label = label or method
    # A folder no earlier run used, kept until the run ends (the module docstring: ext4).
    out = tempfile.mkdtemp(prefix=f"out-{label.replace('@', '-')}-", dir=scratch)
    os.rmdir(out)  # `cp -r SOURCE OUT` makes OUT itself
    subprocess.run(["sync"], check=True)
    source = os.path.dirname(list_path)
    source_bytes = warm(source) if cache == "warm" else cool(source)
    cached = cached_share(source)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # The fairness window is the method's own run (sync, waiting on the disk, keeps no core
    # busy and would make every side look starved).
    with PassMeter(cores_of(method)) as meter:
        run = subprocess.run(command(method, list_path, out), capture_output=True, text=True,
                             cwd=tree, env=tree_env(tree))
    synced = time.perf_counter()
    subprocess.run(["sync"], check=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"{method} failed ({run.returncode}): {run.stderr[-2000:]}")
    stored = sum(os.path.getsize(os.path.join(p, n)) for p, _, names in os.walk(out)
                 for n in names)
    user = after.ru_utime - before.ru_utime
    cpu = user + (after.ru_stime - before.ru_stime)
    return {"method": label, "tree": tree, "seconds": seconds,
            "sync_seconds": started + seconds - synced, "cpu_seconds": cpu,
            "user_seconds": user, "load_before": load,
            **{k: v for k, v in meter.load(label).as_dict().items() if k != "side"},
            "source_bytes": source_bytes, "stored_bytes": stored, "cache": cache,
            "source_cached": round(cached, 3)}


def summarize(rows: Sequence[dict[str, Any]], images: int) -> list[dict[str, Any]]:
    cores = os.cpu_count() or 1
    cp_by_pass = {r["pass"]: r for r in rows if r["method"] == "cp"}
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        seconds = statistics.median(r["seconds"] for r in mine)
        cpu = statistics.median(r["cpu_seconds"] for r in mine)
        # Each pass's ratio with both sides' loads: printed only from fair passes; `cp` is
        # its own baseline (1.0).
        pairs = [(r, cp_by_pass[r["pass"]]) for r in mine
                 if r["pass"] in cp_by_pass and method != "cp" and "cores_busy" in r]
        sides = [[side_of(cp, 1), side_of(r, cores_of(method.split("@")[0]))]
                 for r, cp in pairs]
        ratios = [(r["seconds"] / cp["seconds"], s) for (r, cp), s in zip(pairs, sides)]
        cpu_ratios = [(r["cpu_seconds"] / cp["cpu_seconds"], s)
                      for (r, cp), s in zip(pairs, sides) if cp["cpu_seconds"]]
        fair, cpu_fair = fair_median(ratios), fair_median(cpu_ratios)
        own = method == "cp"
        out.append({
            "method": method, "seconds": round(seconds, 2),
            "images_per_s": round(images / seconds),
            "mb_per_s": round(mine[0]["source_bytes"] / seconds / 1e6, 1),
            "vs_cp": 1.0 if own else round(fair, 2) if fair is not None else None,
            "vs_cp_text": "1.0" if own else pass_ratios_text(ratios) if ratios else "",
            "vs_cp_passes": pass_records(ratios),
            "cores_busy": round(statistics.median(r["cores_busy"] for r in mine), 2),
            "cores_asked": mine[0]["cores_asked"],
            "foreign_cores": round(statistics.median(r["foreign_cores"] for r in mine), 2),
            "sync_seconds": round(statistics.median(r["sync_seconds"] for r in mine), 2),
            "cpu_seconds": round(cpu, 2),
            "user_seconds": round(statistics.median(r["user_seconds"] for r in mine), 2),
            "cpu_vs_cp": 1.0 if own else round(cpu_fair, 2) if cpu_fair is not None else None,
            "cpu_vs_cp_text": ("1.0" if own else pass_ratios_text(cpu_ratios) if cpu_ratios
                               else ""),
            "cpu_ms_per_image": round(cpu / images * 1000, 3),
            "images_per_cpu_s": round(images / cpu) if cpu else None,
            "images_per_s_per_core": round(images / seconds / cores),
            "user_ms_per_image": round(statistics.median(r["user_seconds"] for r in mine)
                                       / images * 1000, 3),
            "stored_mb": round(statistics.median(r["stored_bytes"] for r in mine) / 1e6, 1),
            "load_before": round(statistics.median(r["load_before"] for r in mine), 2)})
    return out


def render(summary: Sequence[dict[str, Any]]) -> str:
    head = ("| method | s | images/s | MB/s in | × cp+sync, fair passes | sync s | CPU s | "
            "CPU × cp, fair passes | CPU ms/image | images/CPU-s | images/s/core | "
            "user ms/image | stored MB | load | cores busy (asked) | foreign cores |")
    lines = [head, "|---|" + "---:|" * 15]
    for s in summary:
        lines.append(f"| {s['method']} | {s['seconds']} | {s['images_per_s']} | "
                     f"{s['mb_per_s']} | {s['vs_cp_text']} | "
                     f"{s['sync_seconds']} | "
                     f"{s['cpu_seconds']} | "
                     f"{s['cpu_vs_cp_text']} | "
                     f"{s['cpu_ms_per_image']} | {s['images_per_cpu_s']} | "
                     f"{s['images_per_s_per_core']} | {s['user_ms_per_image']} | "
                     f"{s['stored_mb']} | {s['load_before']} | "
                     f"{s['cores_busy']} ({s['cores_asked']:g}) | {s['foreign_cores']} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=3000, help="ImageNet-like photos (default 3000)")
    p.add_argument("--passes", type=int, default=3, help="interleaved passes (default 3)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--root", default=DEFAULT_ROOT,
                   help="folder for the photos and the copies (default: %(default)s)")
    p.add_argument("--json", help="write the rows and summary here")
    p.add_argument("--cache", choices=("warm", "cold", "both"), default="warm",
                   help="the source's page cache before each run: warm (read first), cold "
                        "(dropped by posix_fadvise DONTNEED), or both, each pass running every "
                        "method warm then cold (default warm)")
    p.add_argument("--compare", metavar="PATH",
                   help="also run each trainfeed method with the checkout at PATH, interleaved "
                        "(reported as METHOD@NAME)")
    return p.parse_args(argv)


def runs(methods: Sequence[str], compare: str | None,
         number: int = 0) -> list[tuple[str, str, str]]:
    """(method, checkout, label) of pass `number`, in order: each trainfeed method of this
    checkout and the same of `compare`'s, which goes first in odd passes (a run right after
    `cp` met the page cache `cp` left: neither tree always does). `cp` is the same program for
    both: once."""
    out: list[tuple[str, str, str]] = []
    for method in methods:
        pair = [(method, REPO, method)]
        if compare is not None and method != "cp":
            tree = os.path.abspath(compare)
            pair.append((method, tree, f"{method}@{os.path.basename(tree.rstrip(os.sep))}"))
        out.extend(reversed(pair) if number % 2 else pair)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.root, exist_ok=True)
    list_path = ensure_dataset(os.path.join(args.root, f"photos-{args.images}"), args.images)
    scratch = tempfile.mkdtemp(prefix="runs-", dir=args.root)
    caches = ("warm", "cold") if args.cache == "both" else (args.cache,)
    rows = []
    try:
        for number in range(args.passes):
            for cache in caches:
                for method, tree, label in runs(args.methods, args.compare, number):
                    row = run_one(method, list_path, scratch, tree, label, cache)
                    row["pass"] = number
                    rows.append(row)
                    print(f"pass {number} {label} ({cache}, {row['source_cached']:.0%} of the "
                          f"source cached): {row['seconds']:.2f} s "
                          f"(sync {row['sync_seconds']:.2f} s) "
                          f"(CPU {row['cpu_seconds']:.2f} s, load {row['load_before']:.1f})",
                          file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = []
    for cache in caches:
        mine = summarize([r for r in rows if r["cache"] == cache], args.images)
        summary.extend({**s, "cache": cache} for s in mine)
        print(f"\nsource {cache} in the page cache before each run:\n{render(mine)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                                   "python": platform.python_version()},
                       "images": args.images, "passes": args.passes, "rows": rows,
                       "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
