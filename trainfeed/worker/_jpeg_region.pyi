"""Types of the compiled region decoder (trainfeed/worker/_jpeg_region.c)."""
import numpy as np

LIBJPEG_TURBO_VERSION_NUMBER: int
MARGIN: int

def decode_region(data: bytes | bytearray | memoryview, out: np.ndarray | bytearray | memoryview,
                  left: int, top: int, width: int, height: int, scale: int, channels: int,
                  fast_dct: bool) -> tuple[int, int]: ...
