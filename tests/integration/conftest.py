"""Fixtures shared by the tests that run a master over a small uploaded dataset, and the
switch to remote decode (`remote`) for the tests that run readers with `trainfeed decoder`s."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from integration.decoding import DECODER_TOKEN

from trainfeed.upload import UploadOptions, upload


@pytest.fixture
def storage(image_list: Path, storage_dir: str) -> str:
    """A storage holding "flowers": the 100 records of `image_list` in row groups of 10, so a
    master plans 10 partitions of 10 records."""
    upload(str(image_list), "flowers", storage_dir, UploadOptions(row_group_rows=10),
           progress=False)
    return storage_dir


@pytest.fixture
def remote(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Sets TRAINFEED_DECODE=remote with the given decoders (and the token) for new readers."""
    def use(*addresses: str, token: str | None = DECODER_TOKEN) -> None:
        monkeypatch.setenv("TRAINFEED_DECODE", "remote")
        monkeypatch.setenv("TRAINFEED_DECODERS", ",".join(addresses))
        monkeypatch.delenv("TRAINFEED_TOKEN_FILE", raising=False)
        if token is None:
            monkeypatch.delenv("TRAINFEED_TOKEN", raising=False)
        else:
            monkeypatch.setenv("TRAINFEED_TOKEN", token)
    return use
