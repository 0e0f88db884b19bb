"""Issue 26 §11: the README's quick start runs as written. Its `train.py` is taken from the
README verbatim and run under a real torchrun with 2 gloo ranks on the CPU: once against a real
master process, once with TRAIN_LOCAL=1. Each rank must finish its 3 epochs with the same number
of steps as the other (sync=True), and a finite loss."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from integration.services import free_port
from optional import require

from trainfeed.demo import make_images
from trainfeed.master.serve.process import MasterProcess
from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV
from trainfeed.upload import upload

pytestmark = pytest.mark.integration
README = Path(__file__).resolve().parents[2] / "README.md"
EPOCHS = 3


def quickstart_script() -> str:
    """The first Python block of the README's "Quick start" section."""
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's quick start has no python block"
    return match.group(1)


@pytest.fixture
def demo_storage(tmp_path: Path) -> str:
    listing = make_images(str(tmp_path / "source"), 300)
    storage = str(tmp_path / "trainfeed-data")
    upload(listing, "demo-images", storage, progress=False)
    return storage


# torch's own exit abort, not ours: DistributedDataParallel keeps its gloo process group (and
# the group's threads) alive after destroy_process_group (pytorch/pytorch#109478), and now and
# then, only under heavy load, a gloo thread touches the interpreter while it finalizes. The
# rank has then finished: every epoch printed, barrier and destroy_process_group passed. Seen
# twice in CI's full suite, never in ~120 runs alone under load (2026-11-26).
TORCH_EXIT_ABORT = "terminate called without an active exception"


def torch_exit_abort(proc: subprocess.CompletedProcess[str]) -> bool:
    """True if torchrun failed only because a rank that had trained to the end aborted at exit."""
    return (proc.returncode != 0 and TORCH_EXIT_ABORT in proc.stderr
            and "(SIGABRT)" in proc.stderr and trained(proc.stdout))


def run_torchrun(script: Path, env: dict[str, str]) -> str:
    """Runs the script on 2 ranks; runs it once more only after torch's exit abort (above), so
    that every other failure, and that abort twice in a row, still fails the test."""
    base = {k: v for k, v in os.environ.items() if k not in (
        "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TRAIN_LOCAL",
        TOKEN_ENV, TOKEN_FILE_ENV)}
    for attempt in (1, 2):
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", str(free_port()), str(script)],
            env={**base, **env}, capture_output=True, text=True, timeout=180)
        if not (attempt == 1 and torch_exit_abort(proc)):
            break
        print("torch's gloo exit abort after a finished run; running it once more:\n"
              + proc.stderr[-1500:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def trained(stdout: str) -> bool:
    lines = re.findall(r"rank (\d) epoch (\d+): loss ([-\d.naninf]+)", stdout)
    return {(int(rank), int(epoch)) for rank, epoch, _ in lines} == {
        (r, e) for r in (0, 1) for e in range(EPOCHS)}


def assert_trained(stdout: str) -> None:
    lines = re.findall(r"rank (\d) epoch (\d+): loss ([-\d.naninf]+)", stdout)
    seen = {(int(rank), int(epoch)) for rank, epoch, _ in lines}
    assert seen == {(r, e) for r in (0, 1) for e in range(EPOCHS)}, stdout
    assert all(math.isfinite(float(loss)) for _, _, loss in lines), stdout


def test_quickstart_trains_through_a_master(demo_storage: str, tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "train.py"
    script.write_text(quickstart_script())
    token = "quickstart-token-" + "x" * 24
    with MasterProcess(demo_storage, token=token, metrics_port=None) as master:
        out = run_torchrun(script, {"TRAINFEED_MASTER": master.address, TOKEN_ENV: token,
                                    "TRAINFEED_JOB": "quickstart"})
    assert_trained(out)


def test_quickstart_trains_with_train_local(demo_storage: str, tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "train.py"
    script.write_text(quickstart_script())
    out = run_torchrun(script, {"TRAIN_LOCAL": "1", "TRAINFEED_STORAGE": demo_storage})
    assert_trained(out)


def test_only_torchs_exit_abort_after_a_finished_run_is_run_again() -> None:
    """The retry is narrow: the abort's signature after every rank's every epoch, nothing else."""
    finished = "".join(f"rank {r} epoch {e}: loss 1.5\n" for r in (0, 1) for e in range(EPOCHS))
    abort = f"{TORCH_EXIT_ABORT}\n... exitcode  : -6 (pid: 1) (SIGABRT)\n"
    run = lambda code, out, err: subprocess.CompletedProcess([], code, out, err)  # noqa: E731
    assert torch_exit_abort(run(1, finished, abort))
    assert not torch_exit_abort(run(0, finished, abort))
    assert not torch_exit_abort(run(1, finished.replace("rank 1 epoch 2", "x"), abort))
    assert not torch_exit_abort(run(1, finished, "Traceback ... ValueError\n(SIGABRT)"))
    assert not torch_exit_abort(run(1, finished, f"{TORCH_EXIT_ABORT}\n(SIGSEGV)"))


def quickstart_shell() -> list[str]:
    """The commands of the first shell block of the README's "Quick start" section."""
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "README's quick start has no bash block"
    return [line for line in match.group(1).splitlines() if line.strip()]


def test_the_quick_start_installs_pytorchs_cpu_build_first() -> None:
    """Issue 38 papercut 1: `pip install -e '.[torch]'` alone takes PyPI's CUDA build (a 5.8 GB
    venv) on a laptop; the quick start installs the CPU build from PyTorch's index first, which
    then satisfies the extra. The first screen keeps its two set-up commands."""
    commands = quickstart_shell()
    cpu = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
    assert commands[0].startswith(cpu + " && pip install -e '.[torch]'"), commands[0]
    first_screen = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert len(first_screen.strip().splitlines()) == 2, first_screen
