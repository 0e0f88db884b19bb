"""`upload --check-images`: every image decoded before anything is written, as a reader would."""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from trainfeed.cores import usable_cores
from trainfeed.errors import ListFileError, UndecodableImagesError
from trainfeed.formats.listfile import ListEntry, ParsedList
from trainfeed.ingest.options import DECODE_MEMORY_BYTES, HEADER_BYTES


def check_images(parsed: ParsedList, entries: tuple[ListEntry, ...], threads: int,
                 sizes: list[int] | None = None, max_pixels: int | None = None) -> None:
    """Decodes every file of a file list, each on its own, as a reader would (any size: no
    batch to stack them in); raises UndecodableImagesError listing every failure with its line.

    Decodes run in parallel on up to `threads` threads (at most one per core) and together
    hold at most DECODE_MEMORY_BYTES, or one image's needs alone when larger: each reserves its
    file's size plus what its header announces (trainfeed.decode.pixel_budget.decode_bytes)
    before it reads the whole file. An image over the pixel budget (`max_pixels`, default
    $TRAINFEED_MAX_IMAGE_PIXELS) is listed without being decoded.
    """
    # Pillow and simplejpeg only when asked.
    from trainfeed.decode.memory_budget import MemoryBudget
    from trainfeed.decode.pixel_budget import DECODE_FAILURES, decode_bytes, failure_reason
    from trainfeed.decode.pixels import ImageDecoder

    decoder = ImageDecoder(threads=1, errors="raise", max_pixels=max_pixels)
    memory = MemoryBudget(DECODE_MEMORY_BYTES, "upload --check-images")
    file_sizes = sizes if sizes is not None else [0] * len(entries)

    def check(index: int) -> tuple[int, str, str] | None:
        entry, path = entries[index], entries[index].columns[0]
        where = f"{parsed.path}:{entry.line}"
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
            with memory.reserve(file_sizes[index] + decode_bytes(head, decoder.max_pixels),
                                f"{where}: {path}"):
                with open(path, "rb") as f:
                    data = f.read()
                try:
                    decoder.decode_one(data)
                except DECODE_FAILURES as e:
                    return entry.line, path, failure_reason(e)
        except OSError as e:
            raise ListFileError(f"{where}: cannot read {path}: {e.strerror or e}") from e
        return None

    workers = max(1, min(threads, usable_cores()))
    bad: list[tuple[int, str, str]] = []
    pending: deque[Future[tuple[int, str, str] | None]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="trainfeed-check") as pool:
        try:
            for index in range(len(entries)):
                pending.append(pool.submit(check, index))
                if len(pending) >= 4 * workers:  # a bounded queue, not a future per file
                    _collect(pending.popleft(), bad)
            while pending:
                _collect(pending.popleft(), bad)
        finally:  # on an error, the files not started yet are not read
            for future in pending:
                future.cancel()
            decoder.close()
    if bad:
        raise UndecodableImagesError(parsed.path, bad)


def _collect(future: Future[tuple[int, str, str] | None],
             bad: list[tuple[int, str, str]]) -> None:
    failure = future.result()
    if failure is not None:
        bad.append(failure)
