"""A local reader imports no gRPC (issue 36): `Load` lives in trainfeed.io.load, the meter in
trainfeed.reader.meter, and the distributed backend (the lease session, the gRPC client) in
trainfeed.reader.distributed, imported only for a MasterSource. Each check runs in a fresh
interpreter, since this test process has long imported grpc through other tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Builds a reader from the environment (TRAIN_LOCAL) or an explicit LocalSource, reads one
# pass, and prints what it read and which of the master's or the lease's modules were loaded.
READ_ONE_PASS = """
import json, sys
from trainfeed import LocalSource, dist
explicit = sys.argv[1] == "explicit"
reader = dist.reader("flowers", source=LocalSource(storage=sys.argv[2]) if explicit else None)
records = sum(1 for _ in reader())
reader.stats()  # the meter: trainfeed.reader.meter
reader.close()
print(json.dumps({"records": records, "grpc": sorted(m for m in sys.modules
                                                      if m == "grpc" or m.startswith("grpc.")),
                  "lease": sorted(m for m in sys.modules if m.startswith("trainfeed.lease"))}))
"""


@pytest.mark.parametrize("how", ["train_local", "explicit"])
def test_a_local_reader_imports_no_grpc(storage: str, how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAIN_LOCAL": "1",
           "TRAINFEED_STORAGE": storage}
    env.pop("TRAINFEED_MASTER", None)
    result = subprocess.run([sys.executable, "-c", READ_ONE_PASS, how, storage], env=env,
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["records"] == 100
    assert seen["grpc"] == [], f"a local reader loaded {seen['grpc'][:5]}"
    assert seen["lease"] == [], f"a local reader loaded {seen['lease']}"
