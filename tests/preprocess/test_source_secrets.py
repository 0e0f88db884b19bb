"""A source given as a URL with credentials (`http://user:password@host/t.parquet`, read through
fsspec) leaves them out of the packed dataset's summary, which every reader of the dataset
reads, and out of the error when it cannot be read. Before, the summary's `source_table` held
the URL as given."""
from __future__ import annotations

import functools
import http.server
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainfeed.preprocess import PreprocessError, training_preprocessor

PASSWORD = "SECRETPW-z41"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served over HTTP on loopback, and its URL with (unchecked) credentials."""
    root = tmp_path / "served"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://reader:{PASSWORD}@127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_source_url_keeps_its_credentials_out_of_the_dataset_and_errors(
        http_root: tuple[Path, str], tmp_path: Path) -> None:
    root, base = http_root
    pq.write_table(pa.table({"x": [[1.0, 2.0]] * 10, "y": list("ababababab")}),
                   root / "t.parquet")
    storage = tmp_path / "storage"
    summary = training_preprocessor(f"{base}/t.parquet", "packed", "y", "x",
                                    storage=str(storage))
    assert summary["source_table"] == f"{base.replace(':' + PASSWORD, '')}/t.parquet"
    for path in storage.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    with pytest.raises(PreprocessError) as caught:
        training_preprocessor(f"{base}/missing.parquet", "other", "y", "x",
                              storage=str(storage))
    said = "".join(traceback.format_exception(caught.value))
    assert "cannot read the source http://reader:***@127.0.0.1" in said
    assert PASSWORD not in said
