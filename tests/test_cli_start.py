"""What starting trainfeed costs (issue 30 §2): a fixed cost of every command, paid again by every
upload whatever its size. `import trainfeed` loads no pyarrow, numpy, fsspec, tqdm, pandas, nor
the reader (the upload's packer loads when `upload` is called); a plain upload imports no tqdm
when it shows no bar; and an upload's process asks numpy's OpenBLAS for one thread (its threads
spun ~0.1 CPU-s at numpy's import: 7 % of a 3,000-photo upload's CPU), unless the caller set
$OPENBLAS_NUM_THREADS. Each check runs in a fresh interpreter, where imports are not yet paid."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from upload_samples import photo_list

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pyarrow", "pyarrow.dataset", "pandas", "fsspec", "tqdm", "grpc",
         "trainfeed.reader", "trainfeed.ingest.run", "trainfeed.formats.shards")


def run_python(code: str, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs `code` in a fresh interpreter of this repository; the words of its last line."""
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                            timeout=120, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return (result.stdout.splitlines() or [""])[-1].split()


def test_import_trainfeed_loads_none_of_the_heavy_modules() -> None:
    loaded = run_python(f"import sys, trainfeed\n"
                        f"print(*[m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded == []


def test_the_upload_module_exports_its_names_and_upload_is_the_function() -> None:
    """`trainfeed.upload` stays light; its other names load on first use, as the objects."""
    out = run_python(
        "import sys, trainfeed, trainfeed.upload\n"
        "module = sys.modules['trainfeed.upload']\n"
        "from trainfeed import upload, UploadOptions\n"
        "assert trainfeed.upload is upload and upload is module.upload, trainfeed.upload\n"
        "assert 'numpy' not in sys.modules\n"
        "from trainfeed.upload import UploadResult, LOCK_NAME, check_images, field_specs\n"
        "from trainfeed.upload import _read_ahead_windows\n"
        "from trainfeed.ingest.run import UploadResult as Result\n"
        "assert UploadResult is Result and isinstance(LOCK_NAME, str)\n"
        "assert set(module.__all__) <= set(dir(module))\n"
        "for name in module.__all__:\n"
        "    getattr(module, name)\n"
        "try:\n"
        "    module.nothing\n"
        "except AttributeError as e:\n"
        "    print('refused', 'nothing' in str(e))\n")
    assert out == ["refused", "True"]


UPLOAD = """
import os, sys
from trainfeed.cli.main import main
status = main(["upload", sys.argv[1], "--dataset", "photos", "--storage", sys.argv[2],
               "--no-progress", "--processes", "1"])
def name(task):
    with open(f"/proc/self/task/{task}/comm") as f:
        return f.read()
# Threads not named (OpenBLAS's are not; pyarrow's jemalloc_bg_thd is) besides the main one.
threads = sum(name(t) == name(os.getpid()) for t in os.listdir("/proc/self/task"))
print(status, os.environ.get("OPENBLAS_NUM_THREADS"), threads, "tqdm" in sys.modules)
"""


def test_a_plain_upload_runs_on_one_thread_after_it_and_imports_no_progress_bar(
        tmp_path: Path) -> None:
    """After a one-process upload only the main thread is left of the unnamed ones: no
    OpenBLAS thread (one per core but the first, started at numpy's import), the read threads
    ended (pyarrow's allocator keeps a thread, named)."""
    listing = photo_list(tmp_path / "photos", 8)
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = run_python(UPLOAD, str(listing), str(tmp_path / "storage"), env=env)
    assert out == ["0", "1", "1", "False"]


def test_the_callers_openblas_threads_are_kept(tmp_path: Path) -> None:
    listing = photo_list(tmp_path / "photos", 4)
    out = run_python(UPLOAD, str(listing), str(tmp_path / "storage"),
                     env={**os.environ, "OPENBLAS_NUM_THREADS": "3"})
    assert out[:2] == ["0", "3"]


HELP = """
import contextlib, io, sys
from trainfeed.cli.main import COMMAND_HELP, main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["--help"])
    except SystemExit as e:
        assert e.code == 0, e.code
text = " ".join(out.getvalue().split())
missing = [name for name, line in COMMAND_HELP.items()
           if f"{name} {' '.join(line.split())}" not in text]
print(*[m for m in sys.modules if m.endswith("_cmd") or m in ("numpy", "pyarrow")], "|", *missing)
"""


def test_trainfeed_help_lists_every_command_without_importing_their_modules() -> None:
    """`trainfeed --help` imported every command's module to list them (0.69 CPU-s)."""
    assert run_python(HELP, env={**os.environ, "COLUMNS": "400"}) == ["|"]


def test_the_listed_help_is_what_each_command_registers() -> None:
    """COMMAND_HELP (what `trainfeed --help` lists) cannot drift from the commands' own help."""
    from trainfeed.cli.main import COMMAND_HELP, COMMAND_MODULES, build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert isinstance(sub, argparse._SubParsersAction)
    registered = {action.dest: action.help for action in sub._choices_actions}
    assert list(COMMAND_HELP) == list(COMMAND_MODULES)
    assert COMMAND_HELP == registered
    listed = next(a for a in build_parser(listing=True)._actions if a.dest == "command")
    assert isinstance(listed, argparse._SubParsersAction)
    assert {a.dest: a.help for a in listed._choices_actions} == registered
