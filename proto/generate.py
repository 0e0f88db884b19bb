#!/usr/bin/env python3
"""Regenerate (or, with --check, verify) the Python gRPC code under trainfeed/v1/ from proto/.

The generated modules are committed so that `pip install trainfeed` needs no protoc; CI runs this
with --check (through tests/test_proto_sync.py) so that they never drift from the .proto sources.
The generated code is stamped with the protobuf version of grpcio-tools; pyproject pins
grpcio-tools in the test extra and requires a protobuf runtime at least that new.
"""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GENERATED = ("master_pb2.py", "master_pb2.pyi", "master_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    """Runs protoc on every .proto under proto/, writing trainfeed/v1/*.py below out_dir."""
    from grpc_tools import protoc  # test/dev dependency only

    sources = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", *sources]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {sources}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="fail if the committed code differs from freshly generated code")
    args = parser.parse_args()
    if not args.check:
        generate(ROOT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [name for name in GENERATED
                 if not filecmp.cmp(Path(tmp, "trainfeed/v1", name),
                                    ROOT / "trainfeed/v1" / name, shallow=False)]
    if stale:
        print(f"stale generated code in trainfeed/v1/: {stale}; run python proto/generate.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
