"""The builtin `public/digits` dataset: published offline from scikit-learn, readable by name."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from trainfeed import LocalSource, dist
from trainfeed.builtin import publish_builtin
from trainfeed.cli.main import main
from trainfeed.formats.manifest import read_manifest
from trainfeed.storage import open_storage

DIGITS = "public/digits"
NUM_DIGITS = 1797  # scikit-learn's load_digits(): the UCI test set of handwritten digits


@pytest.fixture(scope="module")
def builtin_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage folder with the builtin datasets published once (it takes a few seconds)."""
    root = tmp_path_factory.mktemp("storage")
    [result] = publish_builtin(open_storage(str(root)), progress=False)
    assert result.dataset == DIGITS
    assert not result.already_published
    assert result.num_records == NUM_DIGITS
    return root


def test_digits_read_as_8x8_grayscale_images(builtin_storage: Path) -> None:
    labels: Counter[str] = Counter()
    ids = []
    with dist.reader(DIGITS, source=LocalSource(storage=str(builtin_storage))) as reader:
        assert reader.field_names == ("image", "label")
        for batch in reader.column_batches(256):
            ids.extend(batch["_id"].tolist())
            for data, label in zip(batch["image"], batch["label"]):
                image = Image.open(io.BytesIO(data))
                image.load()  # decodes the whole file, not only the header
                assert (image.format, image.mode, image.size) == ("PNG", "L", (8, 8))
                labels[label] += 1

    assert sorted(ids) == list(range(NUM_DIGITS))
    assert sorted(labels) == [str(d) for d in range(10)]
    manifest = read_manifest(open_storage(str(builtin_storage)), DIGITS)
    assert sum(manifest.label_histogram.values()) == NUM_DIGITS
    assert manifest.label_histogram == dict(labels)


def test_publishing_twice_is_a_no_op(builtin_storage: Path) -> None:
    manifest = (builtin_storage / DIGITS / "manifest.json").read_bytes()

    [again] = publish_builtin(open_storage(str(builtin_storage)), progress=False)

    assert again.already_published
    assert (builtin_storage / DIGITS / "manifest.json").read_bytes() == manifest


def test_ls_lists_digits(builtin_storage: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "--storage", str(builtin_storage)]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == [DIGITS]
    assert f"{NUM_DIGITS} records" in lines[0]
