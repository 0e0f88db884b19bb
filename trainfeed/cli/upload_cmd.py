"""`trainfeed upload LIST --dataset NAME`."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from trainfeed.cli.common import add_storage_options, say, storage_from
from trainfeed.formats.layout import DEFAULT_ROW_GROUP_BYTES, DEFAULT_ROW_GROUP_ROWS
from trainfeed.ingest.options import (
    DEFAULT_RESIZE_QUALITY,
    RAW_DEFAULT_MAX_SIDE,
    default_raw_below,
)
from trainfeed.planning.partitions import DEFAULT_TARGET_PARTITIONS, MIN_PARTITION_ROWS
from trainfeed.upload import (
    DECODE_MEMORY_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_PROCESSES,
    UploadOptions,
    upload,
)


def rows_per_group(text: str) -> int:
    """--rows-per-group: a whole number ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of rows ≥ 1, got {text!r}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number ≥ `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number ≥ {minimum}, got {text!r}")
        return value
    return parse


def quality(text: str) -> int:
    """--quality: a JPEG quality, 1..100."""
    value = at_least(1)(text)
    if value > 100:
        raise argparse.ArgumentTypeError(f"expected a JPEG quality in 1..100, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "upload", help="pack a .list file into a dataset",
        description="Pack a .list file (path<TAB>label lines, or tab-separated text columns) "
                    "into Parquet shards and publish it as a dataset. Re-running the same upload "
                    "does nothing; an interrupted one resumes.")
    p.add_argument("list", help="the .list file; paths in it are relative to its folder")
    p.add_argument("--dataset", required=True, help="dataset name, e.g. flowers or public/digits")
    add_storage_options(p)
    add_upload_options(p)
    p.add_argument("--append", action="store_true",
                   help="add the list's records to the existing dataset as its next version, "
                        "without rewriting its shards (same fields; record ids continue after "
                        "its largest); readers of older versions keep reading theirs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def add_upload_options(p: argparse.ArgumentParser) -> None:
    """What an upload packs and how: the same for `upload`, `upload-slice` and
    `submit-upload` (trainfeed.cli.submit_upload_cmd)."""
    p.add_argument("--kind", choices=["file", "text"],
                   help="force the list kind (default: file if a first column among the first "
                        "100 lines names an existing file or folder, or looks like a path or a "
                        "file name; text only when none does)")
    p.add_argument("--columns", help="comma-separated field names (default: image,label for "
                                     "file lists; text0,text1,… for text lists)")
    p.add_argument("--skip-missing", action="store_true",
                   help="publish without the files that do not exist, and report them")
    p.add_argument("--check-images", action="store_true",
                   help="decode every image before publishing, each on its own (any size), "
                        f"in parallel within {DECODE_MEMORY_BYTES >> 20} MiB; undecodable files "
                        "(not images, damaged, or declaring more pixels than "
                        "$TRAINFEED_MAX_IMAGE_PIXELS) fail the upload, each named with its list "
                        "line (file lists)")
    p.add_argument("--no-comments", action="store_true",
                   help="treat lines starting with '#' as data (default: they are comments)")
    p.add_argument("--allow-outside", action="store_true",
                   help="pack files outside the list's folder (absolute paths, '..', symlinks "
                        "pointing out); refused by default")
    p.add_argument("--allow-hard-links", action="store_true",
                   help="pack files that have more than one name (hard links), whose other "
                        "names may lie outside the list's folder; refused by default, each "
                        "named with its list line (--allow-outside allows them too)")
    p.add_argument("--max-record-bytes", type=int, default=DEFAULT_MAX_RECORD_BYTES,
                   metavar="N", help=f"refuse files larger than this (default "
                                     f"{DEFAULT_MAX_RECORD_BYTES:,} bytes). Each packing "
                                     f"process holds about 3.1x its largest record (a read "
                                     f"buffer and two copies in Parquet's writer): ~3.3 GB for "
                                     f"a 1 GiB file (docs/usage.md, Large records)")
    p.add_argument("--rows-per-group", type=rows_per_group, default=DEFAULT_ROW_GROUP_ROWS,
                   metavar="N",
                   help=f"records per Parquet row group (default {DEFAULT_ROW_GROUP_ROWS}; a "
                        f"group also ends at {DEFAULT_ROW_GROUP_BYTES >> 20} MiB of payload). "
                        f"A job cuts a dataset into at least {DEFAULT_TARGET_PARTITIONS} "
                        f"partitions (runs of row groups, or slices of them of at least "
                        f"{MIN_PARTITION_ROWS} records when there are fewer row groups); "
                        f"smaller groups make finer partitions that need no slicing, larger "
                        f"ones fewer, longer sequential reads")
    p.add_argument("--jpeg-restarts", action="store_true",
                   help="rewrite JPEGs losslessly with restart markers, so that training crops "
                        "(random_resized_crop=) decode their window alone, ~1.35x faster; pixels "
                        "stay identical, stored bytes differ from the files' (docs/imagenet.md)")
    p.add_argument("--max-side", type=at_least(8), metavar="N",
                   help="re-encode images whose longer side exceeds N pixels to N (aspect kept) "
                        "as JPEGs at --quality: lossy and opt-in, recorded in the manifest "
                        "(FFCV's ImageNet recipe stores at most 256 px); works with "
                        f"--jpeg-restarts. At N ≤ {RAW_DEFAULT_MAX_SIDE} every image is stored "
                        "as raw pixels unless --no-raw (see --raw-below)")
    p.add_argument("--quality", type=quality, default=DEFAULT_RESIZE_QUALITY, metavar="Q",
                   help=f"JPEG quality of images re-encoded by --max-side (default "
                        f"{DEFAULT_RESIZE_QUALITY}, FFCV's)")
    raw = p.add_mutually_exclusive_group()
    raw.add_argument("--raw-below", type=at_least(1), metavar="PIXELS",
                     help=f"store images of at most PIXELS pixels (height x width, after "
                          f"--max-side) as raw uint8 RGB pixels instead of JPEG: 3 bytes a "
                          f"pixel, read without a decode (FFCV stores half its 256-px images "
                          f"so); recorded in the manifest, which only trainfeed releases that "
                          f"read raw pixels open (default: every image when --max-side is at "
                          f"most {RAW_DEFAULT_MAX_SIDE} and without --jpeg-restarts, a crop "
                          f"then costs 1.9-3x less CPU for ~8x the bytes; else never)")
    raw.add_argument("--no-raw", action="store_true",
                     help=f"store JPEGs even with --max-side ≤ {RAW_DEFAULT_MAX_SIDE} (storage "
                          f"or network bandwidth is the limit, not the readers' CPU)")
    p.add_argument("--processes", type=at_least(1), default=DEFAULT_PROCESSES, metavar="N",
                   help=f"packing processes (default: one per core this process may use and "
                        f"one more, to pack while another waits for the disk: "
                        f"{DEFAULT_PROCESSES} here); "
                        f"the output does not depend on it")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different dataset of the same name")


def options_from(args: argparse.Namespace) -> UploadOptions:
    """The UploadOptions of `add_upload_options`' arguments."""
    return UploadOptions(
        kind=args.kind, columns=tuple(args.columns.split(",")) if args.columns else None,
        skip_missing=args.skip_missing, overwrite=args.overwrite,
        check_images=args.check_images, comments=not args.no_comments,
        allow_outside=args.allow_outside, allow_hard_links=args.allow_hard_links,
        max_record_bytes=args.max_record_bytes,
        row_group_rows=args.rows_per_group, jpeg_restarts=args.jpeg_restarts,
        processes=args.processes, max_side=args.max_side, quality=args.quality,
        raw_below=raw_below_of(args))


def raw_below_of(args: argparse.Namespace) -> int | None:
    """--raw-below as given, else its default (`default_raw_below`); None with --no-raw (the
    two exclude each other: argparse refuses both)."""
    if args.no_raw:
        return None
    if args.raw_below is not None:
        return int(args.raw_below)
    return default_raw_below(args.max_side, args.jpeg_restarts)


def upload_arguments(args: argparse.Namespace) -> list[str]:
    """`add_upload_options`' arguments as a command line gives them (all but --processes,
    which each packer chooses): what `submit-upload` hands its packers."""
    out = [*(["--kind", args.kind] if args.kind else []),
           *(["--columns", args.columns] if args.columns else []),
           "--max-record-bytes", str(args.max_record_bytes),
           "--rows-per-group", str(args.rows_per_group), "--quality", str(args.quality),
           *(["--max-side", str(args.max_side)] if args.max_side else []),
           *(["--raw-below", str(args.raw_below)] if args.raw_below else [])]
    flags = {"--skip-missing": args.skip_missing, "--check-images": args.check_images,
             "--no-comments": args.no_comments, "--allow-outside": args.allow_outside,
             "--allow-hard-links": args.allow_hard_links,
             "--jpeg-restarts": args.jpeg_restarts, "--overwrite": args.overwrite,
             "--no-raw": args.no_raw}
    return out + [flag for flag, on in flags.items() if on]


def run(args: argparse.Namespace) -> int:
    options = options_from(args)
    if getattr(args, "append", False):
        options = dataclasses.replace(options, append=True)
    result = upload(args.list, args.dataset, storage_from(args), options,
                    progress=False if args.no_progress else None)
    if result.already_published:
        print(f"dataset {result.dataset!r} is already published from this input "
              f"({result.num_records} records at {result.url}); nothing to do")
        return 0
    for line in result.skipped:
        say(f"skipped (missing): {line}")  # a line of the list, shown visibly
    resumed = f", resumed after {result.resumed_shards} shard(s)" if result.resumed_shards else ""
    print(f"published {result.dataset!r}: {result.num_records} records, "
          f"{result.num_bytes / 1e6:.1f} MB of payload, {result.stored_bytes / 1e6:.1f} MB on "
          f"disk, in {result.num_shards} shard(s) at {result.url} "
          f"in {result.seconds:.1f} s{resumed}"
          + (f"; {len(result.skipped)} missing file(s) skipped" if result.skipped else "")
          + (f"; version {result.version}" if result.version > 1 else ""))
    return 0
