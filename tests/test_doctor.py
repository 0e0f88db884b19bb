"""`trainfeed doctor` and the decoder it reports: the default install takes the JPEG fast path."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from trainfeed.decode.pixels import ImageDecoder, decoders
from trainfeed.doctor import extras_status, report, settings_in_effect


def encoded(fmt: str, mode: str = "RGB", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (24, 32, 4 if mode == "CMYK" else 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels[..., :3]).convert(mode).save(buf, fmt)
    return buf.getvalue()


def test_the_default_install_decodes_jpeg_through_libjpeg_turbo() -> None:
    """simplejpeg is a core dependency: JPEGs are decoded by it, not by Pillow (4x slower)."""
    import simplejpeg  # the install must have it (CI runs in a fresh venv of declared deps)

    decoder = ImageDecoder(threads=2)
    try:
        blobs = [encoded("JPEG", seed=i) for i in range(40)]
        batch = decoder.decode(blobs, [f"record {i}" for i in range(40)])
        assert batch.images.shape == (40, 24, 32, 3)
        assert decoder.backend_counts == {"simplejpeg": 40}
        assert np.array_equal(batch.images[7], simplejpeg.decode_jpeg(blobs[7]))
        assert "simplejpeg" in decoders()["jpeg"] and "libjpeg-turbo" in decoders()["jpeg"]
    finally:
        decoder.close()


def test_other_formats_fall_back_to_pillow() -> None:
    decoder = ImageDecoder(threads=1)
    batch = decoder.decode([encoded("PNG"), encoded("BMP")], ["png", "bmp"])
    assert batch.images.shape == (2, 24, 32, 3)
    assert decoder.backend_counts == {"pillow": 2}


def test_doctor_reports_versions_decoders_extras_and_settings() -> None:
    info = report({"TRAINFEED_STORAGE": "s3://bucket/data", "TRAINFEED_MASTER": "m:50051",
                   "TRAINFEED_TOKEN": "hunter2-secret", "AWS_SECRET_ACCESS_KEY": "k3y"})
    assert info["packages"]["simplejpeg"] and info["packages"]["pyarrow"]
    assert "simplejpeg" in info["decoders"]["jpeg"]
    # CI's CPU has the CRC-32C instruction: readers check records with it.
    assert info["checksums"].startswith("CRC-32C per record (crc32c: the CPU's own instruction")
    assert info["packages"]["crc32c"]
    assert info["extras"]["test"]["installed"], info["extras"]["test"]
    settings = info["settings"]
    assert settings["TRAINFEED_STORAGE"] == "s3://bucket/data"
    assert "m:50051" in settings["mode (resolved)"]
    assert settings["TRAINFEED_TOKEN"] == "set" and settings["AWS_SECRET_ACCESS_KEY"] == "set"
    assert "hunter2-secret" not in json.dumps(info) and "k3y" not in json.dumps(info)


def test_doctor_resolves_defaults_and_local_mode() -> None:
    settings = settings_in_effect({"TRAIN_LOCAL": "1"})
    assert settings["TRAINFEED_STORAGE"] == "./trainfeed-data"
    assert settings["TRAINFEED_STATE"] == "trainfeed-master.db"
    assert settings["mode (resolved)"].startswith("local")
    assert settings["TRAINFEED_TOKEN"] == "unset"


def test_an_extra_with_a_missing_package_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `sql` extra needs psycopg (the test extra installs it); with psycopg's metadata
    hidden, the extra says what is missing."""
    import trainfeed.doctor as doctor

    assert extras_status()["sql"] == {"installed": True, "problems": []}
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version",
                        lambda name: None if name == "psycopg" else real(name))
    status = extras_status()
    assert status["sql"] == {"installed": False, "problems": ["psycopg not installed"]}
    assert status["s3"]["installed"]


@pytest.mark.slow
def test_doctor_command_prints_the_report_without_secrets() -> None:
    env = {"PATH": "", "TRAINFEED_TOKEN": "do-not-print-me", "TRAIN_LOCAL": "1"}
    for extra in ([], ["--json"]):
        result = subprocess.run([sys.executable, "-m", "trainfeed.cli.main", "doctor", *extra],
                                capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        assert "do-not-print-me" not in result.stdout
        assert "simplejpeg" in result.stdout
    assert json.loads(result.stdout)["settings"]["TRAINFEED_TOKEN"] == "set"
