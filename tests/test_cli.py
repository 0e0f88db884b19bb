from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainfeed.cli.main import build_parser, main

COMMANDS = ["upload", "master", "ls", "info", "publish-builtin", "demo", "preprocess",
            "sql", "health", "submit", "scale", "status", "delete", "doctor", "token",
            "submit-upload", "upload-slice", "upload-commit", "decoder"]


@pytest.mark.slow
def test_every_command_has_help() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert isinstance(sub.choices, dict) and sorted(sub.choices) == sorted(COMMANDS)
    for command in COMMANDS:
        result = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", command, "--help"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert f"usage: trainfeed {command}" in result.stdout
    for step in ("train", "validate"):
        result = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "preprocess", step,
                                 "--help"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and f"trainfeed preprocess {step}" in result.stdout


def test_a_command_parser_has_only_its_module_and_its_command_table_is_right() -> None:
    """`build_parser(argv)` imports only the module of the command named (COMMAND_MODULES),
    which must be the module that registers it."""
    for command in COMMANDS:
        sub = next(a for a in build_parser([command])._actions if a.dest == "command")
        assert isinstance(sub.choices, dict) and command in sub.choices, command


UPLOAD_IMPORTS = """
import sys
from trainfeed.cli.main import build_parser
build_parser(["upload", "train.list", "--dataset", "flowers"])
print(" ".join(m for m in ("grpc", "kubernetes", "cv2", "trainfeed.dist",
                           "trainfeed.master.serve.server") if m in sys.modules))
"""


def test_the_upload_command_does_not_import_the_master_the_cluster_or_the_reader() -> None:
    """Start-up is a fixed cost of every upload (0.6 CPU-s when every command's imports were
    paid, as much as copying 3,000 photos): `trainfeed upload` loads what it uses."""
    result = subprocess.run([sys.executable, "-c", UPLOAD_IMPORTS], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == []


PACKAGE_NAMES = """
import trainfeed.dist, trainfeed.upload  # submodules named like two exports of the package
import trainfeed
from trainfeed import LocalSource, Reader, batch, dist, upload
assert callable(upload) and callable(batch) and callable(dist.reader), (upload, batch)
assert set(trainfeed.__all__) | {'__version__'} <= set(dir(trainfeed))
for name in trainfeed.__all__:
    getattr(trainfeed, name)
print("ok")
"""


def test_the_package_exports_every_name_of_its_all_as_the_object_not_a_module() -> None:
    """The lazy exports (PEP 562) resolve, and `upload` is the function even after something
    imported the submodule trainfeed.upload (CI: a lazy `upload` was the module there)."""
    result = subprocess.run([sys.executable, "-c", PACKAGE_NAMES], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok"]


def test_upload_ls_info(image_list: Path, storage_dir: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["upload", str(image_list), "--dataset", "flowers", "--storage", storage_dir,
                 "--no-progress"]) == 0
    assert "published 'flowers': 100 records" in capsys.readouterr().out
    assert main(["upload", str(image_list), "--dataset", "flowers", "--storage", storage_dir,
                 "--no-progress"]) == 0
    assert "already published" in capsys.readouterr().out
    assert main(["ls", "--storage", storage_dir]) == 0
    assert capsys.readouterr().out.startswith("flowers\tfile\t100 records")
    assert main(["info", "flowers", "--storage", storage_dir]) == 0
    out = capsys.readouterr().out
    assert "fields    image:binary, label:string" in out and "  cat\t34" in out


def test_errors_exit_2_with_file_and_line(image_list: Path, storage_dir: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    image_list.write_text("images/00000.jpg\n")
    assert main(["upload", str(image_list), "--dataset", "x", "--storage", storage_dir,
                 "--kind", "file"]) == 2
    err = capsys.readouterr().err
    assert f"trainfeed upload: error: {image_list}:1: expected 2 tab-separated columns" in err
    assert main(["info", "nope", "--storage", storage_dir]) == 2
    assert "no dataset 'nope'" in capsys.readouterr().err


def test_storage_defaults_to_env_then_local_folder(image_list: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAINFEED_STORAGE", raising=False)
    assert main(["upload", str(image_list), "--dataset", "a", "--no-progress"]) == 0
    assert (tmp_path / "trainfeed-data" / "a" / "manifest.json").exists()
    monkeypatch.setenv("TRAINFEED_STORAGE", str(tmp_path / "elsewhere"))
    assert main(["upload", str(image_list), "--dataset", "b", "--no-progress"]) == 0
    assert (tmp_path / "elsewhere" / "b" / "manifest.json").exists()


@pytest.mark.slow
def test_demo_runs_end_to_end_on_the_embedded_default(tmp_path: Path) -> None:
    for expected_epoch in (0, 1):  # the master's SQLite state carries the job across runs
        result = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "demo", "--images",
                                 "300"], cwd=tmp_path, capture_output=True, text=True,
                                timeout=300, env={**os.environ, "TRAINFEED_STORAGE": ""})
        assert result.returncode == 0, result.stdout + result.stderr
        assert (f"together: 300 of 300 records of epoch {expected_epoch}, each once: yes"
                in result.stdout), result.stdout
        # Issue 38 papercut 8: no input-bound share for readers that feed no trainer (it was
        # "waited for data 100% of the time"), no per-reader rate (each reader's was its share
        # of the epoch again, 50-fold apart), and the split explained.
        assert "waited for data" not in result.stdout, result.stdout
        assert "input-bound: none shown; these readers feed no trainer" in result.stdout
        readers = [line for line in result.stdout.splitlines() if line.startswith("reader ")]
        assert len(readers) == 2 and not any("records/s" in line for line in readers), readers
        assert re.search(r"^reader 0 .*: \d+ records \(\d+% of those read\)", result.stdout,
                         re.M), result.stdout
        assert "the split: the master leases partitions to whichever reader asks" in result.stdout
    # The last line is a command to paste (before: prose naming TRAIN_LOCAL=1), and it runs.
    lines = result.stdout.strip().splitlines()
    assert lines[-2].startswith("next: ")
    after = subprocess.run(lines[-1].strip(), shell=True, cwd="/", capture_output=True,
                           text=True, timeout=300,
                           env={k: v for k, v in os.environ.items()
                                if not k.startswith("TRAINFEED_") and k != "TRAIN_LOCAL"})
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "300 records read"
    assert (tmp_path / "trainfeed-data" / "demo-images" / "manifest.json").exists()
    assert (tmp_path / "trainfeed-master.db").exists()


def test_upload_rows_per_group_sets_the_row_groups_and_so_the_partitions(
        image_list: Path, storage_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainfeed.formats.manifest import read_manifest
    from trainfeed.planning.partitions import plan_partitions
    from trainfeed.storage import open_storage

    assert main(["upload", str(image_list), "--dataset", "flowers", "--storage", storage_dir,
                 "--rows-per-group", "10", "--no-progress"]) == 0
    manifest = read_manifest(open_storage(storage_dir), "flowers")
    assert [g.num_rows for s in manifest.shards for g in s.row_groups] == [10] * 10
    # 10 row groups of 10 records cannot be cut into slices of 8 or more: one partition each.
    assert len(plan_partitions(manifest)) == 10
    assert main(["upload", str(image_list), "--dataset", "big", "--storage", storage_dir,
                 "--rows-per-group", "100", "--no-progress"]) == 0
    big = read_manifest(open_storage(storage_dir), "big")
    assert [g.num_rows for s in big.shards for g in s.row_groups] == [100]
    assert len(plan_partitions(big)) == 12  # one row group sliced: 100 // 8


@pytest.mark.parametrize("value", ["0", "-3", "ten"])
def test_upload_rows_per_group_below_one_is_refused(
        value: str, image_list: Path, storage_dir: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["upload", str(image_list), "--dataset", "x", "--storage", storage_dir,
              "--rows-per-group", value])
    assert exit_.value.code == 2
    assert (f"argument --rows-per-group: expected a whole number of rows ≥ 1, got {value!r}"
            in capsys.readouterr().err)
    assert not (Path(storage_dir) / "x").exists()


@pytest.mark.parametrize("command", [["info", "flowers"], ["ls"], ["info", "flowers", "--json"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(
        command: list[str], image_list: Path, storage_dir: str, tmp_path: Path) -> None:
    """`trainfeed info DS | head -1`: before, a BrokenPipeError traceback. `head` has its line
    (the `echo`) and has exited before Python has even started, so every run meets the closed
    pipe, as a long listing would once `head` had read enough."""
    assert main(["upload", str(image_list), "--dataset", "flowers", "--storage", storage_dir,
                 "--no-progress"]) == 0
    cli = " ".join([sys.executable, "-m", "trainfeed.cli.main", *command, "--storage",
                    storage_dir])
    result = subprocess.run(
        ["bash", "-c", f"{{ echo first; sleep 0.5; {cli} 2>{tmp_path}/err; }} | head -1; "
                       f"echo \"${{PIPESTATUS[0]}}\""],
        capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines() == ["first", "141"], result
    assert (tmp_path / "err").read_text() == ""


def test_health_with_nothing_listening_gives_no_tls_hint(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38 papercut 4: a refused connection means no master there, TLS or not; the TLS
    hint is for a peer that answered and failed the handshake (tests/integration/
    test_master_auth.py shows that case still gets it)."""
    from integration.services import free_port
    for name in ("TRAINFEED_TLS_CA", "TRAINFEED_MASTER"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()  # nothing listens there
    assert main(["health", "--master", f"127.0.0.1:{port}", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err, err
    assert "TLS" not in err, err
