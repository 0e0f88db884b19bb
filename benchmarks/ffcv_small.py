"""FFCV's ImageNet recipe beside trainfeed, both storing images at most 256 px on the longer side.

FFCV's speed comes largely from its ingest: its ImageNet recipe (ffcv-imagenet's
write_imagenet.py) stores every image with its longer side at most 256 px (`max_resolution`),
half of them as raw pixels and half as quality-90 JPEGs (`write_mode="proportion"`,
`compress_probability=0.5`). This benchmark compares its Loader with trainfeed reading a
dataset of the same photos at the same size, in one interleaved run (issue 30, item 5).

Data: the ImageNet-like JPEGs of benchmarks/imagenet_like.py (benchmarks/make_imagenet_like.py:
~474x413 px, ~83 KB at quality 90), generated on first use. From them, untimed and cached:

- FFCV: a .beton written by `DatasetWriter` with `RGBImageField(write_mode="proportion",
  max_resolution=256, compress_probability=0.5, jpeg_quality=90)` and an `IntField` label.
- trainfeed: `trainfeed upload --max-side 256 --quality 90` (and a second dataset with
  `--jpeg-restarts` as well). Where the installed trainfeed has no `--max-side` (detected from
  `trainfeed upload --help`), this script shrinks the photos itself with the same semantics
  (libjpeg-turbo's DCT scaling to the smallest scale still at least the target, Pillow's
  bilinear resize to the longer side 256, libjpeg-turbo at q90 4:2:0; smaller images kept as
  they are) and uploads those files: the rows then say "stand-in", and switch to the real
  option as soon as it exists.

Workload: RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + random horizontal flip,
uint8, batches of 256 (benchmarks/imagenet_methods.py's `train`). FFCV runs as ffcv-imagenet's
train_imagenet.py configures it on one machine: `order=QUASI_RANDOM` (its choice when not
distributed), `os_cache=True` (`in_memory: 1` in every rn50/rn18 config), `drop_last=True`,
`num_workers` = the machine's cores, `RandomResizedCropRGBImageDecoder((224, 224))` +
`RandomHorizontalFlip()` + `ToTensor()` (and its label pipeline, `IntDecoder` + `ToTensor`);
what follows ToTensor in the recipe (ToDevice, ToTorchImage, NormalizeImage) runs on the GPU.

What is timed, as in benchmarks/imagenet_like.py (its Sampler, timed window and quiet wait):
each method runs in a process of its own, builds its pipeline untimed, skips `--warmup` batches
and 3 s, then streams `--images` more images (crossing epoch boundaries) while the harness
samples the CPU of its whole process tree and of the machine every 0.1 s. Reported per method,
medians over `--passes` interleaved passes (the order reverses every pass): images/s, the ratio
to FFCV's Loader measured in the same run, CPU ms per image, cores busy, the machine's load and
the other processes' busy cores (*foreign*); and each dataset's size on disk.

Without FFCV installed (`pip install .[ffcv-peer]` does not install it: see pyproject.toml) its
rows are skipped with a warning, and the trainfeed rows still run.

    python benchmarks/ffcv_small.py run --images-in-dataset 5000 --passes 2
    python benchmarks/ffcv_small.py run --methods ffcv trainfeed-256-rst --passes 4
    python benchmarks/ffcv_small.py summary --out RESULTS.jsonl
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from fairness import cores_asked, every_core, pass_ratios_text, side_of, verdict
from imagenet_like import measure, timed_window, wait_quiet, warm
from imagenet_methods import BATCH, OPS, SIZE, read_list, trainfeed_batches
from make_imagenet_like import LIST_NAME, ensure_dataset
from read_throughput import DEFAULT_ROOT
from stop_cleanly import exit_cleanly_on_signals

from trainfeed.decode.crops import DEFAULT_RATIO, DEFAULT_SCALE

HERE = os.path.abspath(__file__)
# FFCV's ImageNet recipe (ffcv-imagenet: write_imagenet.sh's max resolution, compress
# probability and quality; the "recommended mode").
MAX_SIDE = 256
QUALITY = 90
COMPRESS_PROBABILITY = 0.5
BASELINE = "ffcv"
# `upload --raw-below` for the raw row: every image of at most MAX_SIDE on its longer side.
RAW_BELOW = MAX_SIDE * MAX_SIDE
METHODS: dict[str, str] = {
    "ffcv": f"FFCV Loader: RandomResizedCropRGBImageDecoder(224) + RandomHorizontalFlip + "
            f"ToTensor, QUASI_RANDOM, os_cache=True, {every_core()} workers; beton of "
            f"max_resolution={MAX_SIDE}, proportion {COMPRESS_PROBABILITY:.0%} JPEG q{QUALITY}",
    "trainfeed-256": f"{OPS['trainfeed-local']['train']}; dataset of upload --max-side "
                     f"{MAX_SIDE} --quality {QUALITY}",
    "trainfeed-256-rst": f"{OPS['trainfeed-local']['train']}; dataset of upload --max-side "
                         f"{MAX_SIDE} --quality {QUALITY} --jpeg-restarts",
    "trainfeed-256-raw": f"{OPS['trainfeed-local']['train']}; dataset of upload --max-side "
                         f"{MAX_SIDE} --quality {QUALITY} --raw-below {RAW_BELOW} (every "
                         f"image as raw pixels)",
}
STANDIN_NOTE = (f"stand-in: photos shrunk to {MAX_SIDE} px q{QUALITY} by this benchmark, then a "
                f"plain upload (the installed trainfeed has no `upload --max-side`)")


# -- the datasets -------------------------------------------------------------------------------
def ffcv_missing() -> str | None:
    """Why FFCV cannot run here (not installed, or its compiled part fails to load), or None."""
    try:
        import ffcv.libffcv  # noqa: F401  (loads _libffcv, built against libturbojpeg/OpenCV)
    except ImportError as e:
        return str(e)
    return None


def trainfeed_cli(*args: str) -> list[str]:
    """The command running `trainfeed ARGS` of the trainfeed this process imports."""
    return [sys.executable, "-m", "trainfeed.cli.main", *args]


# `python -m` puts the working directory first on sys.path: safe-path mode (Python ≥ 3.11;
# ignored before) keeps it out, so that the CLI runs the trainfeed this process imports.
CLI_ENV = {**os.environ, "PYTHONSAFEPATH": "1"}


def upload_help() -> str:
    """`trainfeed upload --help` of this interpreter's trainfeed."""
    result = subprocess.run(trainfeed_cli("upload", "--help"), capture_output=True, text=True,
                            timeout=120, env=CLI_ENV)
    if result.returncode != 0:
        raise RuntimeError(f"`trainfeed upload --help` failed ({result.returncode}): "
                           f"{result.stderr.strip()[-500:]}")
    return result.stdout


def upload_has_max_side() -> bool:
    """Whether `trainfeed upload` of this interpreter's trainfeed takes --max-side."""
    return "--max-side" in upload_help()


def digest(*parts: object) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def read_json(path: str) -> dict[str, Any]:
    """The JSON object in `path`, or {} when there is no such file (nothing built yet)."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        value: dict[str, Any] = json.load(f)
    return value


def list_digest(list_path: str) -> str:
    with open(list_path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:16]


def size_on_disk(paths: Sequence[str]) -> dict[str, int]:
    """Bytes of the files (their lengths) and bytes the file system allocated for them."""
    files = [f for path in paths for f in files_of(path)]
    stats = [os.stat(f) for f in files]
    return {"files": len(files), "bytes": sum(s.st_size for s in stats),
            "allocated_bytes": sum(s.st_blocks * 512 for s in stats)}


def shrink(data: bytes, max_side: int, quality: int) -> bytes:
    """The stand-in for `upload --max-side`: a JPEG re-encoded with its longer side `max_side`
    (aspect kept, rounded), or `data` itself when it is no larger. The same steps as the
    upload's: libjpeg-turbo decodes at the smallest DCT scale still at least the target,
    Pillow resamples (bilinear, antialiased), libjpeg-turbo encodes at `quality`, 4:2:0."""
    import simplejpeg
    from PIL import Image

    width, height, _, _ = simplejpeg.decode_jpeg_header(data)
    if max(height, width) <= max_side:
        return data
    scale = max_side / max(height, width)
    target = max(1, round(height * scale)), max(1, round(width * scale))
    pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=target[0],
                                    min_width=target[1])
    if pixels.shape[:2] != target:
        image = Image.fromarray(np.ascontiguousarray(pixels))
        pixels = np.asarray(image.resize((target[1], target[0]), Image.Resampling.BILINEAR))
    out: bytes = simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=quality,
                                        colorspace="RGB", colorsubsampling="420")
    return out


def shrunk_copy(data: str, out: str) -> str:
    """OUT: the photos of DATA shrunk by `shrink`, with their list; rebuilt when DATA's list
    changed. Returns OUT's list."""
    source_list = os.path.join(data, LIST_NAME)
    key = digest(list_digest(source_list), MAX_SIDE, QUALITY)
    stamp = os.path.join(out, "standin.json")
    if read_json(stamp).get("key") == key:
        return os.path.join(out, LIST_NAME)
    print(f"stand-in: shrinking the photos to {MAX_SIDE} px at q{QUALITY} in {out} ...",
          file=sys.stderr, flush=True)
    shutil.rmtree(out, ignore_errors=True)
    with open(source_list, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    for line in lines:
        rel = line.split("\t", 1)[0]
        os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
        with open(os.path.join(data, rel), "rb") as src:
            shrunk = shrink(src.read(), MAX_SIDE, QUALITY)
        with open(os.path.join(out, rel), "wb") as dst:
            dst.write(shrunk)
    with open(os.path.join(out, LIST_NAME), "w", encoding="utf-8") as f:
        f.writelines(lines)
    with open(stamp, "w") as f:
        json.dump({"key": key, "max_side": MAX_SIDE, "quality": QUALITY}, f)
    return os.path.join(out, LIST_NAME)


def dataset_name(method: str, standin: bool) -> str:
    return ("imagenet-like-256" + ("-standin" if standin else "")
            + ("-rst" if method.endswith("-rst") else "")
            + ("-raw" if method.endswith("-raw") else ""))


def upload_trainfeed(args: argparse.Namespace, method: str, list_path: str,
                     standin: bool) -> dict[str, Any]:
    """`trainfeed upload` of the method's dataset (a no-op when already published from the same
    input); returns its name, how it was made and its size."""
    name = dataset_name(method, standin)
    cmd = trainfeed_cli("upload", list_path, "--dataset", name, "--storage", args.storage,
                        "--overwrite", "--no-progress")
    if not standin:
        cmd += ["--max-side", str(MAX_SIDE), "--quality", str(QUALITY)]
        # The JPEG rows stay JPEG where --max-side 256 stores raw pixels by default.
        if not method.endswith("-raw") and "--no-raw" in upload_help():
            cmd.append("--no-raw")
    if method.endswith("-rst"):
        cmd.append("--jpeg-restarts")
    if method.endswith("-raw"):
        if standin:
            raise RuntimeError("trainfeed-256-raw needs `upload --raw-below`, which this "
                               "trainfeed lacks")
        cmd += ["--raw-below", str(RAW_BELOW)]
    t0 = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=CLI_ENV)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): "
                           f"{result.stderr.strip()[-1000:]}")
    cached = "already published" in result.stdout
    upload_cmd = " ".join(["trainfeed upload", *cmd[cmd.index("--no-progress") + 1:]])
    what = (f"shrunk to {MAX_SIDE} px q{QUALITY} by this benchmark (stand-in), then "
            f"`{upload_cmd}`" if standin else f"`{upload_cmd}`")
    return {"method": method, "dataset": name, "path": os.path.join(args.storage, name),
            "standin": standin, "what": what,
            "command": ["trainfeed", *cmd[3:]],
            "built_s": None if cached else round(time.perf_counter() - t0, 1),
            **size_on_disk([os.path.join(args.storage, name)])}


class Photos:
    """FFCV's indexed dataset: (RGB uint8 HxWx3, label) per photo, decoded by Pillow as
    torchvision's ImageFolder does (write_imagenet.py's input). Module level: picklable."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int]):
        self.paths, self.labels = list(paths), list(labels)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image
        with Image.open(self.paths[i]) as image:
            return np.asarray(image.convert("RGB")), self.labels[i]


def write_beton(args: argparse.Namespace) -> dict[str, Any]:
    """FFCV's dataset, written with the recipe's settings; rebuilt when the photos changed."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    paths, labels = read_list(args.data)
    if len(paths) < BATCH:
        raise ValueError(f"--images-in-dataset {len(paths)}: FFCV's Loader (drop_last=True) "
                         f"needs at least one batch of {BATCH}; use ≥ {BATCH} or --methods "
                         f"without ffcv")
    beton = os.path.join(args.storage, "ffcv-256.beton")
    key = digest(list_digest(os.path.join(args.data, LIST_NAME)), MAX_SIDE,
                 COMPRESS_PROBABILITY, QUALITY)
    stamp = beton + ".json"
    built_s = None
    if read_json(stamp).get("key") != key:
        print(f"writing FFCV's dataset {beton} ...", file=sys.stderr, flush=True)
        os.makedirs(args.storage, exist_ok=True)
        t0 = time.perf_counter()
        writer = DatasetWriter(beton, {
            "image": RGBImageField(write_mode="proportion", max_resolution=MAX_SIDE,
                                   compress_probability=COMPRESS_PROBABILITY,
                                   jpeg_quality=QUALITY),
            "label": IntField()}, num_workers=every_core())
        writer.from_indexed_dataset(Photos(paths, labels), chunksize=100)
        built_s = round(time.perf_counter() - t0, 1)
        with open(stamp, "w") as f:
            json.dump({"key": key}, f)
    return {"method": "ffcv", "dataset": beton, "path": beton, "standin": False,
            "built_s": built_s,
            "what": f"DatasetWriter: RGBImageField(write_mode='proportion', max_resolution="
                    f"{MAX_SIDE}, compress_probability={COMPRESS_PROBABILITY}, jpeg_quality="
                    f"{QUALITY}), IntField()",
            **size_on_disk([beton])}


def prepare(args: argparse.Namespace
            ) -> tuple[list[dict[str, Any]], list[str], dict[str, str]]:
    """The photos, then each method's dataset; returns the datasets, the methods to run and
    the methods skipped (with the reason)."""
    list_path = ensure_dataset(args.data, args.images_in_dataset)
    datasets: list[dict[str, Any]] = [
        {"method": "(the photos)", "dataset": args.data, "path": args.data, "standin": False,
         "built_s": None, "what": "the ImageNet-like JPEGs",
         **size_on_disk([os.path.join(args.data, d) for d in sorted(os.listdir(args.data))
                         if d.startswith("class")])}]
    methods = list(args.methods)
    skipped: dict[str, str] = {}
    missing = ffcv_missing() if "ffcv" in methods else None
    if missing is not None:
        print(f"\n!!! FFCV cannot be imported ({missing}): its rows and its dataset are "
              f"SKIPPED, and no ratio to it is reported. Install it as docs/benchmarks.md "
              f"(\"256-px images: FFCV's recipe\") says (Debian's libturbojpeg0-dev and "
              f"libopencv-dev, the ffcv-peer extra, then pip install --no-deps ffcv==1.0.2).\n",
              file=sys.stderr, flush=True)
        methods.remove("ffcv")
        skipped = {"ffcv": f"skipped, FFCV cannot be imported: {missing}"}
    elif "ffcv" in methods:
        datasets.append(write_beton(args))
    standin = not upload_has_max_side()
    if standin and any(m.startswith("trainfeed") for m in methods):
        print(f"\n!!! trainfeed upload has no --max-side here: the trainfeed rows read the "
              f"STAND-IN ({STANDIN_NOTE}).\n", file=sys.stderr, flush=True)
        list_path = shrunk_copy(args.data, args.data.rstrip("/") + f"-{MAX_SIDE}-standin")
    for method in methods:
        if method.startswith("trainfeed"):
            datasets.append(upload_trainfeed(args, method, list_path, standin))
    return datasets, methods, skipped


# -- inside a method's process ------------------------------------------------------------------
def ffcv_batches(beton: str) -> Iterator[Any]:
    """FFCV's Loader as train_imagenet.py builds it on one machine (see the module docstring),
    without the GPU stages."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor

    loader = Loader(beton, batch_size=BATCH, num_workers=every_core(),
                    order=OrderOption.QUASI_RANDOM, os_cache=True, drop_last=True,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder(
                                             (SIZE, SIZE), scale=DEFAULT_SCALE,
                                             ratio=DEFAULT_RATIO),
                                         RandomHorizontalFlip(), ToTensor()],
                               "label": [IntDecoder(), ToTensor()]})
    while True:
        for images, _ in loader:
            yield images


def method_main(args: argparse.Namespace) -> int:
    if args.method == "ffcv":
        stream = ffcv_batches(args.input)
    else:
        stream = trainfeed_batches(args.input, args.storage, "train")
    print(json.dumps(timed_window(stream, args.warmup, args.images)), flush=True)
    time.sleep(0.5)  # the sampler sees the whole tree after the window's end
    os._exit(0)  # FFCV's and trainfeed's threads: no slow, noisy teardown


# -- the harness --------------------------------------------------------------------------------
def run_one(args: argparse.Namespace, dataset: dict[str, Any]) -> dict[str, Any]:
    """One method's timed window, in a process (and session) of its own, as
    imagenet_like.run_one does it."""
    quiet = wait_quiet(args.quiet_load, args.max_wait)
    method = dataset["method"]
    warm(files_of(dataset["path"]))
    cmd = [sys.executable, HERE, "_method", method, "--input", dataset["dataset"],
           "--storage", args.storage, "--warmup", str(args.warmup), "--images", str(args.images)]
    # FFCV's Loader runs a worker per core; trainfeed's local reader decodes on every core.
    row: dict[str, Any] = {"method": method, "ops": METHODS[method],
                           "standin": dataset["standin"], "cores_asked": cores_asked(
                               every_core()), **quiet}
    return {**row, **measure(cmd, args.timeout)}


def files_of(path: str) -> list[str]:
    if os.path.isdir(path):
        return [os.path.join(root, f) for root, _, names in os.walk(path) for f in names]
    return [path]


def median_rows(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if "rate" in r:
            groups.setdefault(r["method"], []).append(r)
    return {method: {"rate": statistics.median(r["rate"] for r in rs),
                     "min": min(r["rate"] for r in rs), "max": max(r["rate"] for r in rs),
                     "n": len(rs),
                     "cpu_ms": statistics.median(r["cpu_ms_per_image"] for r in rs),
                     "cores_busy": statistics.median(r["cores_busy"] for r in rs),
                     "foreign": statistics.median(r["foreign_cores"] for r in rs),
                     "load": statistics.median(r["loadavg_1m"] for r in rs),
                     "cores_asked": rs[0].get("cores_asked") or every_core(),
                     "standin": rs[0]["standin"]}
            for method, rs in groups.items()}


def pass_ratios(rows: Sequence[dict[str, Any]], method: str) -> list[tuple[float, list[Any]]]:
    """`method`'s rate over FFCV's, pass by pass (each pass measured both, back to back), each
    with both sides' loads (benchmarks/fairness.py judges whether the pass was fair)."""
    by_pass: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if "rate" in r:
            by_pass.setdefault(r["pass"], {})[r["method"]] = r
    cores = os.cpu_count() or 1
    return [(p[method]["rate"] / p[BASELINE]["rate"],
             [side_of(p[BASELINE], cores), side_of(p[method], cores)])
            for _, p in sorted(by_pass.items()) if method in p and BASELINE in p]


def render(rows: Sequence[dict[str, Any]], datasets: Sequence[dict[str, Any]],
           skipped: dict[str, str]) -> str:
    med = median_rows(rows)
    base = med.get(BASELINE, {}).get("rate")
    lines = ["", "train workload (RandomResizedCrop 224 + flip, uint8, batch 256), warm page "
                 "cache:", "",
             "| method | images/s median (min-max) | n | × FFCV, fair passes (per pass) | "
             "CPU ms/image | cores busy (asked) | load avg 1m | foreign cores |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    unfair: set[tuple[int, str]] = set()
    for method in METHODS:
        m = med.get(method)
        label = method + (" (stand-in)" if m and m["standin"] else "")
        if m is None and method in skipped:
            lines.append(f"| {method} | {skipped[method][:100]} | | | | | | |")
            continue
        if m is None:
            errors = [r.get("error", "") for r in rows if r["method"] == method]
            if errors:
                lines.append(f"| {method} | failed: {errors[0][:80]} | | | | | | |")
            continue
        per_pass = pass_ratios(rows, method) if base and method != BASELINE else []
        ratio = pass_ratios_text(per_pass)
        lines.append(f"| {label} | {m['rate']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f}) | "
                     f"{m['n']} | {ratio} | {m['cpu_ms']:.2f} | {m['cores_busy']:.2f} "
                     f"({m['cores_asked']:g}) | {m['load']:.2f} | {m['foreign']:.2f} |")
        unfair.update({(k, why) for k, (_, sides) in enumerate(per_pass)
                       if (why := verdict(sides)) is not None})
    if unfair:
        lines += ["", *(f"- pass {k}: not comparable ({why})" for k, why in sorted(unfair))]
    if any(m["standin"] for m in med.values()):
        lines += ["", f"(stand-in): {STANDIN_NOTE.split(': ', 1)[1]}."]
    photos = next((d for d in datasets if d["method"] == "(the photos)"), None)
    lines += ["", "datasets on disk:", "",
              "| read by | what | files | MB | KB per image | × the photos | built in |",
              "|---|---|---:|---:|---:|---:|---:|"]
    images = max(1, photos["files"]) if photos else 1
    for d in datasets:
        ratio = f"{d['bytes'] / photos['bytes']:.2f}x" if photos else "-"
        built = "cached" if d["built_s"] is None else f"{d['built_s']:.1f} s"
        lines.append(f"| {d['method']} | {d['what']} | {d['files']} | {d['bytes'] / 1e6:,.1f} | "
                     f"{d['bytes'] / images / 1e3:,.1f} | {ratio} | "
                     f"{'-' if d['method'] == '(the photos)' else built} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    datasets, methods, skipped = prepare(args)
    args.images = args.images or 2 * args.images_in_dataset
    header = {"benchmark": "ffcv_small",
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": [os.path.basename(sys.executable), *sys.argv],
              "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                          "loadavg_start": os.getloadavg()},
              "data": read_json(os.path.join(args.data, "summary.json")),
              "datasets": datasets, "methods_run": methods, "skipped": skipped,
              "settings": {k: v for k, v in vars(args).items() if k != "func"}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    by_method = {d["method"]: d for d in datasets}
    rows: list[dict[str, Any]] = []
    with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"header": header}) + "\n")
        for k in range(args.passes):
            for method in (methods if k % 2 == 0 else list(reversed(methods))):
                print(f"pass {k}: {method} ...", file=sys.stderr, flush=True)
                row = {"pass": k, **run_one(args, by_method[method])}
                print("   ", {key: (round(v, 2) if isinstance(v, float) else v)
                              for key, v in row.items() if key != "ops"},
                      file=sys.stderr, flush=True)
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()
        f.write(json.dumps({"footer": {"loadavg_end": os.getloadavg()}}) + "\n")
    print(render(rows, datasets, skipped))
    return 0


def summary(args: argparse.Namespace) -> int:
    """The tables of the last run in a results file."""
    rows: list[dict[str, Any]] = []
    datasets: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with open(args.out, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "header" in record:
                rows, datasets = [], record["header"]["datasets"]
                skipped = record["header"].get("skipped", {})
            elif "method" in record:
                rows.append(record)
    print(render(rows, datasets, skipped))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = p.add_subparsers(dest="command", required=True)
    root = os.path.join(DEFAULT_ROOT, "ffcv-small")
    r = sub.add_parser("run", help="generate the photos and datasets if needed, then measure")
    r.add_argument("--data", default=os.path.join(root, "data"))
    r.add_argument("--storage", default=os.path.join(root, "storage"))
    r.add_argument("--out", default=os.path.join(root, "results.jsonl"))
    r.add_argument("--images-in-dataset", type=int, default=5000)
    # Two epochs: at 256 px a method streams 3-5x faster than at full size, and one epoch's
    # window (~1.5 s) is too short beside the sampler's 0.1 s period on a loaded machine.
    r.add_argument("--images", type=int, default=0,
                   help="images per timed window (default: two epochs' worth)")
    r.add_argument("--warmup", type=int, default=3, help="batches before the window opens")
    r.add_argument("--passes", type=int, default=2)
    r.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    r.add_argument("--quiet-load", type=float, default=1.0)
    r.add_argument("--max-wait", type=float, default=60.0)
    r.add_argument("--timeout", type=float, default=600.0, help="per method run, seconds")
    r.set_defaults(func=run)
    s = sub.add_parser("summary", help="the tables of the last run in a results file")
    s.add_argument("--out", default=os.path.join(root, "results.jsonl"))
    s.set_defaults(func=summary)
    m = sub.add_parser("_method")  # internal: one method's process
    m.add_argument("method", choices=list(METHODS))
    m.add_argument("--input", required=True, help="the beton, or the trainfeed dataset's name")
    m.add_argument("--storage", required=True)
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--images", type=int, required=True)
    m.set_defaults(func=method_main)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    exit_cleanly_on_signals()  # method processes are killed by session in run_one's clean-up
    args = parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
