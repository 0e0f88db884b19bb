"""trainfeed.settings: every environment variable in one table, the configuration table of
docs/usage.md listing exactly those, values parsed with clear errors, and secrets never shown."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainfeed import settings
from trainfeed.cluster.objects import job_objects
from trainfeed.cluster.spec import JobSpec
from trainfeed.errors import ConfigurationError
from trainfeed.lease.resources import count_gpus
from trainfeed.security import ClientSecurity, load_token
from trainfeed.settings import SETTINGS, settings_in_effect

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
TOKEN = "k7Qx-3vN_pL9sT2wR8yB4mC6dF1gH5jZ0aE"


def readme_variables() -> list[str]:
    """The variables named in the first column of docs/usage.md's configuration table."""
    text = USAGE.read_text(encoding="utf-8")
    section = text.split("### Configuration", 1)[1]
    names: list[str] = []
    for line in section.splitlines()[1:]:
        if line.startswith("### "):
            break
        if line.startswith("| `"):
            names += re.findall(r"`([A-Z][A-Z0-9_]*)`", line.split("|")[1])
    return names


def test_the_readme_table_lists_exactly_the_settings() -> None:
    listed = readme_variables()
    assert len(listed) == len(set(listed)), "a variable is listed twice"
    assert "TRAINFEED_TOKEN_FILE" in listed and "TRAIN_LOCAL" in listed  # the parser works
    assert set(listed) - set(SETTINGS) == set(), "in docs/usage.md but not in trainfeed.settings"
    assert set(SETTINGS) - set(listed) == set(), "in trainfeed.settings but not in docs/usage.md"


def test_every_setting_is_documented_and_named_once() -> None:
    for name, setting in SETTINGS.items():
        assert setting.name == name and setting.doc
    assert len({id(s) for s in SETTINGS.values()}) == len(SETTINGS)


def test_every_variable_the_kubernetes_objects_set_is_a_setting() -> None:
    spec = JobSpec(name="resnet", image="i", workers=2, dataset="flowers", command=("x",),
                   gpus_per_worker=1, storage_pvc="p", s3_endpoint="http://s3:8333")
    names = set()
    for obj in job_objects(spec, TOKEN):
        template = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in template.get("containers", []):
            names |= {e["name"] for e in container.get("env", [])}
    assert names and names <= set(SETTINGS), names - set(SETTINGS)
    assert "TRAIN_LOCAL" not in names  # a cluster job always reads through its master


def test_unset_and_blank_give_the_default() -> None:
    assert settings.STORAGE.get({}) == "./trainfeed-data"
    assert settings.STORAGE.get({"TRAINFEED_STORAGE": ""}) == "./trainfeed-data"
    assert settings.JOB.get({"TRAINFEED_JOB": "resnet"}) == "resnet"
    assert settings.MASTER_GIVE_UP_S.get({}) == 120.0
    assert settings.MASTER_GIVE_UP_S.get({"TRAINFEED_MASTER_GIVE_UP_S": "2.5"}) == 2.5
    assert settings.MASTER.get({}) is None


def test_train_local_is_any_value_but_zero() -> None:
    for value, expected in [("", False), ("0", False), (" 0 ", False), ("1", True),
                            ("yes", True), ("false", True)]:
        assert settings.TRAIN_LOCAL.get({"TRAIN_LOCAL": value}) is expected, value
    assert settings.TRAIN_LOCAL.get({}) is False


def test_an_empty_cuda_visible_devices_hides_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINFEED_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert count_gpus() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0, 3,-1")
    assert count_gpus() == 2
    monkeypatch.setenv("TRAINFEED_GPUS", "  ")  # blank: not declared, CUDA's list counts
    assert count_gpus() == 2


def test_a_bad_value_names_the_variable_and_the_value() -> None:
    with pytest.raises(ConfigurationError, match=r"\$TRAINFEED_GPUS='many': expected a whole"):
        settings.GPUS.get({"TRAINFEED_GPUS": "many"})
    with pytest.raises(ConfigurationError, match=r"\$TRAINFEED_GPUS='-2'"):
        settings.GPUS.get({"TRAINFEED_GPUS": "-2"})
    with pytest.raises(ConfigurationError, match=r"\$TRAINFEED_MASTER_GIVE_UP_S='soon'"):
        settings.MASTER_GIVE_UP_S.get({"TRAINFEED_MASTER_GIVE_UP_S": "soon"})
    with pytest.raises(ValueError):  # ConfigurationError is a ValueError, as int() raised
        settings.GPUS.get({"TRAINFEED_GPUS": "1.5"})


def test_the_readers_security_comes_from_the_settings() -> None:
    env = {"TRAINFEED_TOKEN": TOKEN, "TRAINFEED_TLS_CA": "/ca.pem",
           "TRAINFEED_TLS_SERVER_NAME": "master.test", "TRAINFEED_TLS_CERT": ""}
    security = ClientSecurity.from_env(env)
    assert security == ClientSecurity(TOKEN, "/ca.pem", None, None, "master.test")
    assert load_token(None, {"TRAINFEED_TOKEN": ""}) is None


def test_settings_in_effect_shows_values_and_never_a_secret() -> None:
    env = {"TRAINFEED_TOKEN": TOKEN, "TRAINFEED_MASTER": "m:50051", "TRAINFEED_GPUS": "x",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    shown = settings_in_effect(env)
    assert set(shown) == set(SETTINGS)
    assert shown["TRAINFEED_TOKEN"] == "set"
    assert settings_in_effect({})["TRAINFEED_TOKEN"] == "unset"
    assert shown["TRAINFEED_MASTER"] == "m:50051" and shown["TRAINFEED_JOB"] == "default"
    assert shown["CUDA_VISIBLE_DEVICES"] == ["0", "1"]
    assert str(shown["TRAINFEED_GPUS"]).startswith("invalid: $TRAINFEED_GPUS='x'")
    text = json.dumps(shown)  # JSON-serializable, as `trainfeed doctor` prints it
    assert TOKEN not in text


def test_a_secret_that_does_not_parse_is_not_quoted_in_the_error() -> None:
    def refuse(value: str) -> str:
        raise ValueError("expected something else")

    secret = settings.Setting("TRAINFEED_TEST_SECRET", None, refuse, "a test", secret=True)
    with pytest.raises(ConfigurationError) as caught:
        secret.get({"TRAINFEED_TEST_SECRET": TOKEN})
    assert TOKEN not in str(caught.value) and "TRAINFEED_TEST_SECRET" in str(caught.value)
