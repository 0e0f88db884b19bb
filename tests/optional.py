"""Optional frameworks in tests: skipped locally where missing, a failure under CI=true, where
every test must run (as for the real services in conftest.py)."""
from __future__ import annotations

import importlib
import os
from typing import Any

import pytest


def require(module: str) -> Any:
    """The imported module, or a skip (a failure under CI=true) when it cannot be imported."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module)
