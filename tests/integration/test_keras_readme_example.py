"""The README's Keras loop runs without Keras's "`shuffle=True` was passed" warning.

Keras's `fit(shuffle=True)` default applies to arrays; for a dataset it warns on every call,
which users of the README's one-fit-per-epoch loop saw every epoch. The README passes
`shuffle=False` (trainfeed shuffles); this checks that it silences the warning, and that the
warning is what the default gives (so the check can fail).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from optional import require
from sample_data import make_image_list

from trainfeed import BatchOptions, DecodeOptions, LabelOptions, LocalSource, PipelineOptions, dist
from trainfeed.upload import upload

pytestmark = pytest.mark.integration
SHUFFLE_WARNING = "`shuffle=True` was passed, but will be ignored"


def fit_warnings(tmp_path: Path, **fit_kwargs: object) -> list[str]:
    require("tensorflow")
    import keras

    storage = str(tmp_path / "storage")
    if not (tmp_path / "storage").exists():
        upload(str(make_image_list(tmp_path / "source", 24)), "flowers", storage,
               progress=False)
    reader = dist.reader("flowers", source=LocalSource(storage=storage),
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(16, 16),
                                                                       normalizing_const=255.0),
                                                  labels=LabelOptions(one_hot=True),
                                                  batch=BatchOptions(size=8)))
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "categorical_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            model.fit(reader.as_tf_dataset(), initial_epoch=epoch, epochs=epoch + 1,
                      verbose=0, **fit_kwargs)
    reader.close()
    return [str(w.message) for w in caught]


def test_readme_fit_loop_does_not_warn_about_shuffle(tmp_path: Path) -> None:
    assert not [m for m in fit_warnings(tmp_path, shuffle=False) if SHUFFLE_WARNING in m]
    assert [m for m in fit_warnings(tmp_path) if SHUFFLE_WARNING in m]  # Keras's default warns
