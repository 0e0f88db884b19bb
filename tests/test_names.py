from __future__ import annotations

import pytest

from trainfeed.errors import InvalidNameError
from trainfeed.names import validate_dataset_name, validate_job_name


@pytest.mark.parametrize("name", ["flowers", "public/digits", "a.b_c-1", "X" * 128])
def test_valid_dataset_names(name: str) -> None:
    assert validate_dataset_name(name) == name


@pytest.mark.parametrize("name", [
    "", "..", "../etc", "a/../b", "/abs", "a/b/c", ".hidden", "a\\b", "a b", "a/", "x" * 129,
    "s3://bucket", "a\x00b", "public/..",
])
def test_path_tricks_are_rejected(name: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid dataset name"):
        validate_dataset_name(name)


def test_job_names_are_one_segment() -> None:
    assert validate_job_name("resnet-50.run1") == "resnet-50.run1"
    with pytest.raises(InvalidNameError, match="invalid job name"):
        validate_job_name("a/b")
