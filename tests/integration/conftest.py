"""Fixtures shared by the tests that run a master over a small uploaded dataset."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainfeed.upload import UploadOptions, upload


@pytest.fixture
def storage(image_list: Path, storage_dir: str) -> str:
    """A storage holding "flowers": the 100 records of `image_list` in row groups of 10, so a
    master plans 10 partitions of 10 records."""
    upload(str(image_list), "flowers", storage_dir, UploadOptions(row_group_rows=10),
           progress=False)
    return storage_dir
