"""Types of the compiled region decoder (trainfeed/decode/_jpeg_region.c)."""
import mmap

import numpy as np

LIBJPEG_TURBO_VERSION_NUMBER: int
MARGIN: int
MAX_SCANS: int

class PixelBudgetError(ValueError): ...

Buffer = bytes | bytearray | memoryview | mmap.mmap

def decode_region(data: Buffer, out: np.ndarray | bytearray | memoryview, left: int, top: int,
                  width: int, height: int, scale: int, channels: int, fast_dct: bool,
                  max_pixels: int | None = 0) -> tuple[int, int]: ...
def add_restarts(data: Buffer, target: int, max_pixels: int | None = 0) -> bytes: ...
def image_size(data: Buffer | np.ndarray) -> tuple[int, int] | None: ...
def restart_interval(data: Buffer) -> int: ...
def sub_image(data: Buffer, x0: int, y0: int, x1: int,
              y1: int) -> tuple[bytes, int, int] | None: ...
