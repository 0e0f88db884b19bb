"""What this installation is: the report a user pastes into a bug report (`trainfeed doctor`).

Speed and behaviour depend on things a user cannot see from their script: which library decodes
JPEGs (simplejpeg, once undeclared, made a fresh install 4-6x slower than every published
figure), which extras are installed and whether they satisfy what trainfeed declares, and which
storage, master and state settings the environment selects. Nothing here imports an ML framework
(versions come from package metadata) and no secret is ever printed: a token shows as set or
unset.
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from packaging.requirements import Requirement

from trainfeed import __version__, settings
from trainfeed.decode.pixels import decoders
from trainfeed.formats.crc import CRC32C_IN_HARDWARE

DISTRIBUTION = "trainfeed"
# The packages whose versions decide speed or wire compatibility, core first, then the extras'.
PACKAGES = ("numpy", "pyarrow", "grpcio", "protobuf", "fsspec", "pillow", "simplejpeg",
            "opencv-python-headless", "crc32c", "tqdm", "prometheus-client", "s3fs",
            "psycopg", "tensorflow", "tensorflow-cpu", "keras", "torch", "torchdata",
            "kubernetes", "scikit-learn")
# Credentials read by libraries (s3fs, botocore), not by trainfeed: shown as set/unset only.
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# Distributions that provide the same modules under another name (a CPU-only machine installs
# tensorflow-cpu for the `tf` extra's tensorflow, as the README says).
ALTERNATIVES = {"tensorflow": ("tensorflow-cpu",)}


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def extras_status() -> dict[str, dict[str, Any]]:
    """Each extra of the trainfeed distribution: installed (every requirement satisfied) or not,
    and what is missing or at a version outside what trainfeed declares."""
    meta = metadata.metadata(DISTRIBUTION)
    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    status: dict[str, dict[str, Any]] = {}
    for extra in meta.get_all("Provides-Extra") or []:
        problems = []
        for req in requirements:
            if req.marker is None or not req.marker.evaluate({"extra": extra}):
                continue
            have = next((v for v in map(installed_version,
                                        (req.name, *ALTERNATIVES.get(req.name, ())))
                         if v is not None), None)
            if have is None:
                problems.append(f"{req.name} not installed")
            elif req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{req.name} {have} does not satisfy {req.specifier}")
        status[extra] = {"installed": not problems, "problems": problems}
    return status


def settings_in_effect(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """trainfeed's settings in effect (trainfeed.settings: secrets as set/unset, URLs without
    passwords), the storage credentials' presence, and the mode they select."""
    env = os.environ if environ is None else environ
    shown = settings.settings_in_effect(env)
    for name in CREDENTIALS:
        shown[name] = "set" if env.get(name) else "unset"
    master = shown[settings.MASTER.name] or f"(${settings.MASTER.name} unset)"
    shown["mode (resolved)"] = ("local: readers read storage, no master"
                                if settings.TRAIN_LOCAL.get(env) else
                                f"cluster: readers ask the master at {master}")
    return shown


def payload_checksums() -> str:
    """Which checksum readers verify per record read by range, and how it is computed: on the
    CPU's own instruction (SSE 4.2, ARMv8), or, on a CPU without one, by crc32c's table, ~5x
    slower (trainfeed.formats.crc)."""
    if CRC32C_IN_HARDWARE:
        return "CRC-32C per record (crc32c: the CPU's own instruction, without the GIL)"
    return ("CRC-32C per record (crc32c: software tables, ~5x slower; this CPU has no CRC-32C "
            "instruction)")


def report(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything `trainfeed doctor` prints, as one JSON-able dict."""
    return {
        "trainfeed": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}, "
                    f"{os.cpu_count()} CPUs",
        "virtualenv": sys.prefix if sys.prefix != sys.base_prefix else None,
        "packages": {p: installed_version(p) for p in PACKAGES},
        "decoders": decoders(),
        "checksums": payload_checksums(),
        "extras": extras_status(),
        "settings": settings_in_effect(environ),
    }


def render(info: dict[str, Any]) -> str:
    """The report as aligned text, one fact per line."""
    lines = [f"trainfeed {info['trainfeed']}",
             f"python     {info['python']}",
             f"platform   {info['platform']}",
             f"venv       {info['virtualenv'] or '(none: system or user site-packages)'}",
             "", "packages"]
    lines += [f"  {name:<18} {version or '-'}" for name, version in info["packages"].items()]
    lines += ["", "decoders"]
    lines += [f"  {fmt:<10} {how}" for fmt, how in info["decoders"].items()]
    lines += ["", f"checksums  {info['checksums']}"]
    lines += ["", "extras"]
    for extra, st in info["extras"].items():
        lines.append(f"  {extra:<10} {'yes' if st['installed'] else 'no'}"
                     + (f"  ({'; '.join(st['problems'])})" if st["problems"] else ""))
    lines += ["", "settings"]
    lines += [f"  {name:<28} {value if value is not None else '-'}"
              for name, value in info["settings"].items()]
    return "\n".join(lines)
