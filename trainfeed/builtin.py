"""Preset public datasets that ship inside PyPI packages, so a new user has real data offline.

`trainfeed publish-builtin` writes them under the storage's `public/` namespace, where every job
can read them by name (`dist.reader("public/digits")`), as the original design keeps MNIST-like
sets on the shared volume.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

from trainfeed.errors import InvalidNameError, TrainfeedError
from trainfeed.names import PUBLIC_NAMESPACE
from trainfeed.storage import Storage
from trainfeed.upload import UploadOptions, UploadResult, upload


def _write_digits(folder: str) -> str:
    """scikit-learn's handwritten digits (1,797 8x8 images, UCI) as PNG files and a .list."""
    try:
        import numpy as np
        from PIL import Image
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise TrainfeedError(f"the digits dataset needs scikit-learn and Pillow ({e}); "
                             f"install them with: pip install 'trainfeed[datasets]'") from None
    digits = load_digits()
    list_path = os.path.join(folder, "digits.list")
    with open(list_path, "w") as listing:
        for i, (pixels, label) in enumerate(zip(digits.images, digits.target)):
            # Pixel values are 0..16; scale to the full 8-bit range of a grayscale PNG.
            image = Image.fromarray((pixels * (255 / 16)).round().astype(np.uint8), mode="L")
            name = f"digit-{i:04d}.png"
            image.save(os.path.join(folder, name), optimize=True)
            listing.write(f"{name}\t{int(label)}\n")
    return list_path


BUILTIN: dict[str, Callable[[str], str]] = {"digits": _write_digits}


def publish_builtin(storage: Storage, names: list[str] | None = None,
                    progress: bool | None = None) -> list[UploadResult]:
    """Writes the named builtin datasets (default: all) to `public/NAME`; idempotent."""
    results = []
    for name in names or sorted(BUILTIN):
        if name not in BUILTIN:
            raise InvalidNameError(f"unknown builtin dataset {name!r}; "
                                   f"expected one of {sorted(BUILTIN)}")
        with tempfile.TemporaryDirectory(prefix=f"trainfeed-{name}-") as folder:
            list_path = BUILTIN[name](folder)
            # Files are freshly written (new mtimes) each time; fingerprint on content instead so
            # that publishing twice is a no-op.
            results.append(upload(list_path, f"{PUBLIC_NAMESPACE}/{name}", storage,
                                  UploadOptions(overwrite=True, fingerprint_mtimes=False),
                                  progress=progress))
    return results
