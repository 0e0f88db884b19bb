"""Every environment variable trainfeed reads, in one place: name, default, parser and meaning.

Readers, the master, the CLI and the Kubernetes objects (which set these variables in pods) all
take the names from here, so a variable is spelled once and documented once; the configuration
table of docs/usage.md lists exactly these (tests/test_settings.py checks both ways).

Values are read from the environment at each `get()`, never cached at import: a test or an
embedding program may change `os.environ` between two readers. A blank variable (`X=`) counts as
unset, except where the empty value means something (`CUDA_VISIBLE_DEVICES=` hides every GPU).
A value that does not parse raises ConfigurationError naming the variable and the value.

This module sits at the bottom of the house: it imports nothing of trainfeed but the errors and
the redaction, so every layer may import it.

Example:
    >>> from trainfeed.settings import JOB
    >>> JOB.get({"TRAINFEED_JOB": "resnet"}), JOB.get({})
    ('resnet', 'default')
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from trainfeed.errors import ConfigurationError
from trainfeed.redaction import redact_url

__all__ = [
    "AWS_ENDPOINT_URL",
    "CHECKPOINT_DIR",
    "CUDA_VISIBLE_DEVICES",
    "DATASET",
    "DECODE",
    "DECODERS",
    "GPUS",
    "JOB",
    "JOB_COMPLETION_INDEX",
    "KUBECONFIG",
    "LOCAL_WORLD_SIZE",
    "LOG_FORMAT",
    "MASTER",
    "MASTER_GIVE_UP_S",
    "MAX_IMAGE_PIXELS",
    "RANK",
    "S3_ENDPOINT",
    "SETTINGS",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "STATE",
    "STORAGE",
    "TF_CONFIG",
    "TLS_CA",
    "TLS_CERT",
    "TLS_KEY",
    "TLS_SERVER_NAME",
    "TOKEN",
    "TOKEN_FILE",
    "TRAIN_LOCAL",
    "WORKER_NAME",
    "WORLD_SIZE",
    "Setting",
    "settings_in_effect",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, the value when it is unset, how its text becomes a
    value, and what it means.

    Attributes:
        name: The variable's name.
        default: The value when the variable is unset (or blank).
        parse: Text to value; raises ValueError (with a message saying what is expected) for
            text that cannot be one.
        doc: What the variable means, one sentence.
        secret: Its value must never be shown (logs, `trainfeed doctor`): only set or unset.
        empty_is_set: `X=` is a value (passed to `parse`) rather than "unset".
    """

    name: str
    default: T
    parse: Callable[[str], T]
    doc: str
    secret: bool = False
    empty_is_set: bool = False

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's text in `environ` (default: this process's environment), or None when
        it is unset (or empty, unless `empty_is_set`)."""
        env = os.environ if environ is None else environ
        value = env.get(self.name)
        if value is None or (value == "" and not self.empty_is_set):
            return None
        return value

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The parsed value, or `default` when unset.

        Raises:
            ConfigurationError: the text does not parse; the message names the variable.
        """
        text = self.raw(environ)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as e:
            shown = "…" if self.secret else repr(redact_url(text))
            raise ConfigurationError(f"${self.name}={shown}: {e}") from None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None


# --- parsers: each raises ValueError saying what it expected ---------------------------------


def _text(value: str) -> str:
    return value


def _optional_count(value: str) -> int | None:
    """A whole number ≥ 0; blank (spaces only) means "not given"."""
    if not value.strip():
        return None
    try:
        count = int(value)
    except ValueError:
        raise ValueError("expected a whole number ≥ 0") from None
    if count < 0:
        raise ValueError("expected a whole number ≥ 0")
    return count


def _positive_count(value: str) -> int:
    """A whole number ≥ 1 (`_` between digits allowed: `89_478_485`)."""
    try:
        count = int(value)
    except ValueError:
        raise ValueError("expected a whole number ≥ 1") from None
    if count < 1:
        raise ValueError("expected a whole number ≥ 1")
    return count


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError("expected a number of seconds") from None
    if not seconds >= 0:  # also refuses NaN
        raise ValueError("expected a number of seconds ≥ 0")
    return seconds


def _flag(value: str) -> bool:
    """Any non-empty value but `0` turns it on (what `TRAIN_LOCAL=1`, `=yes`, `=true` mean)."""
    return value.strip() != "0"


def _devices(value: str) -> tuple[str, ...]:
    """CUDA's device list: comma-separated ids; `-1` (and blanks) name no device."""
    return tuple(d.strip() for d in value.split(",") if d.strip() and d.strip() != "-1")


def _decode_where(value: str) -> str:
    where = value.strip().lower() or "local"
    if where not in ("local", "remote"):
        raise ValueError("expected `local` or `remote`")
    return where


def _addresses(value: str) -> tuple[str, ...]:
    """`host:port` addresses, comma-separated."""
    addresses = tuple(a.strip() for a in value.split(",") if a.strip())
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected host:port addresses separated by commas, got "
                             f"{address!r}")
    return addresses


def _lower(value: str) -> str:
    return value.strip().lower() or "text"


# --- the settings ----------------------------------------------------------------------------

# The embedded default: a folder in the working directory, so a laptop needs no setup at all.
STORAGE: Setting[str] = Setting(
    "TRAINFEED_STORAGE", "./trainfeed-data", _text,
    "storage root (fsspec URL) for `upload`, `master` and local readers")
MASTER: Setting[str | None] = Setting(
    "TRAINFEED_MASTER", None, _text, "`host:port` of the master, for cluster readers")
JOB: Setting[str] = Setting(
    "TRAINFEED_JOB", "default", _text, "job name: readers of one job share epochs")
TRAIN_LOCAL: Setting[bool] = Setting(
    "TRAIN_LOCAL", False, _flag, "any non-empty value but `0`: read from storage, no master")
# The state file sits in the working directory, beside ./trainfeed-data.
STATE: Setting[str] = Setting(
    "TRAINFEED_STATE", "trainfeed-master.db", _text,
    "master state store: SQLite path, `sqlite:///path`, `etcd://host:port[/prefix][?ttl=S]`, "
    "`memory://`")
S3_ENDPOINT: Setting[str | None] = Setting(
    "TRAINFEED_S3_ENDPOINT", None, _text,
    "S3 endpoint of a non-AWS server (SeaweedFS, MinIO, Ceph RGW); wins over AWS_ENDPOINT_URL")
AWS_ENDPOINT_URL: Setting[str | None] = Setting(
    "AWS_ENDPOINT_URL", None, _text,
    "the AWS SDKs' own endpoint override, used for s3:// storage when TRAINFEED_S3_ENDPOINT is "
    "unset")
# Long enough to ride out a master pod being rescheduled; lower it for impatient setups.
MASTER_GIVE_UP_S: Setting[float] = Setting(
    "TRAINFEED_MASTER_GIVE_UP_S", 120.0, _seconds,
    "how long a reader retries an unreachable master, in seconds")
# Pillow's own PIL.Image.MAX_IMAGE_PIXELS (a 0.25 GiB RGBA image), which photo datasets never
# reach: one budget for every decoder, so a decompression bomb is refused from its header
# (trainfeed.decode.pixel_budget says what an image within it may cost).
MAX_IMAGE_PIXELS: Setting[int] = Setting(
    "TRAINFEED_MAX_IMAGE_PIXELS", 89_478_485, _positive_count,
    "the most pixels an image may declare: larger ones are refused from their header, before "
    "decoding (a decode error naming the file)")
GPUS: Setting[int | None] = Setting(
    "TRAINFEED_GPUS", None, _optional_count,
    "GPUs this worker declares (else CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`)")
CUDA_VISIBLE_DEVICES: Setting[tuple[str, ...] | None] = Setting(
    "CUDA_VISIBLE_DEVICES", None, _devices,
    "CUDA's visible devices; counted as this worker's GPUs when TRAINFEED_GPUS is unset",
    empty_is_set=True)
WORKER_NAME: Setting[str | None] = Setting(
    "TRAINFEED_WORKER_NAME", None, _text,
    "this worker's name for list distribution rules (else the hostname)")
DATASET: Setting[str | None] = Setting(
    "TRAINFEED_DATASET", None, _text,
    "set by `trainfeed submit` in the workers for the training script to read; trainfeed itself "
    "does not read it")
CHECKPOINT_DIR: Setting[str | None] = Setting(
    "TRAINFEED_CHECKPOINT_DIR", None, _text,
    "set by `trainfeed submit --checkpoint-pvc` in the workers: this job's folder on the "
    "checkpoint volume, where the script saves and finds its checkpoints; trainfeed itself does "
    "not read it")
TOKEN: Setting[str | None] = Setting(
    "TRAINFEED_TOKEN", None, _text, "the job's token (master and readers)", secret=True)
TOKEN_FILE: Setting[str | None] = Setting(
    "TRAINFEED_TOKEN_FILE", None, _text,
    "a file holding the job's token (a mounted Secret), when TRAINFEED_TOKEN is unset")
TLS_CA: Setting[str | None] = Setting(
    "TRAINFEED_TLS_CA", None, _text,
    "readers: CA bundle of the master's certificate; setting it turns TLS on")
TLS_CERT: Setting[str | None] = Setting(
    "TRAINFEED_TLS_CERT", None, _text, "readers: client certificate, for mutual TLS")
TLS_KEY: Setting[str | None] = Setting(
    "TRAINFEED_TLS_KEY", None, _text, "readers: the client certificate's key, for mutual TLS")
TLS_SERVER_NAME: Setting[str | None] = Setting(
    "TRAINFEED_TLS_SERVER_NAME", None, _text,
    "readers: the name to check in the master's certificate when the address is not one it "
    "holds")
DECODE: Setting[str] = Setting(
    "TRAINFEED_DECODE", "local", _decode_where,
    "`remote`: readers that decode images send partitions to the decoders of "
    "TRAINFEED_DECODERS (`trainfeed decoder`) and receive pixels")
DECODERS: Setting[tuple[str, ...]] = Setting(
    "TRAINFEED_DECODERS", (), _addresses,
    "with TRAINFEED_DECODE=remote: the decoders' `host:port` addresses, comma-separated")
LOG_FORMAT: Setting[str] = Setting(
    "TRAINFEED_LOG_FORMAT", "text", _lower,
    "`json` for one JSON object per log line (or `trainfeed --log-format json`)")
KUBECONFIG: Setting[str | None] = Setting(
    "KUBECONFIG", None, _text,
    "the Kubernetes client configuration (paths joined by ':'), else ~/.kube/config")

# Synchronous training (dist.reader(..., sync=True)): who the process is in its group.
WORLD_SIZE: Setting[int | None] = Setting(
    "WORLD_SIZE", None, _optional_count,
    "synchronous readers: processes in the training group (set by torchrun)")
RANK: Setting[int | None] = Setting(
    "RANK", None, _optional_count,
    "synchronous readers: this process's rank in the group, 0-based (set by torchrun)")
LOCAL_WORLD_SIZE: Setting[int | None] = Setting(
    "LOCAL_WORLD_SIZE", None, _optional_count,
    "training processes on this node (set by torchrun): each reader's default decode threads "
    "are this process's cores divided by it")
TF_CONFIG: Setting[str | None] = Setting(
    "TF_CONFIG", None, _text,
    "synchronous readers: TensorFlow's cluster JSON; chief and workers are ranks, in that order, "
    "when WORLD_SIZE is unset")
SLURM_NTASKS: Setting[int | None] = Setting(
    "SLURM_NTASKS", None, _optional_count,
    "synchronous readers under SLURM's srun: tasks in the job step, the world size when neither "
    "torch.distributed nor WORLD_SIZE is set")
SLURM_PROCID: Setting[int | None] = Setting(
    "SLURM_PROCID", None, _optional_count,
    "synchronous readers under SLURM's srun: this task's rank, with SLURM_NTASKS")
JOB_COMPLETION_INDEX: Setting[int | None] = Setting(
    "JOB_COMPLETION_INDEX", None, _optional_count,
    "`trainfeed upload-slice`: which slice of the upload this packer packs (set by Kubernetes "
    "in an Indexed Job's pods: `submit-upload`)")

#: Every setting by variable name, in the order of the configuration table (docs/usage.md).
SETTINGS: dict[str, Setting[Any]] = {s.name: s for s in (
    STORAGE, MASTER, JOB, TRAIN_LOCAL, STATE, S3_ENDPOINT, AWS_ENDPOINT_URL, MASTER_GIVE_UP_S,
    MAX_IMAGE_PIXELS, GPUS, CUDA_VISIBLE_DEVICES, WORKER_NAME, DATASET, CHECKPOINT_DIR, TOKEN,
    TOKEN_FILE, TLS_CA, TLS_CERT, TLS_KEY, TLS_SERVER_NAME, DECODE, DECODERS, LOG_FORMAT,
    KUBECONFIG, WORLD_SIZE,
    RANK, LOCAL_WORLD_SIZE, TF_CONFIG, SLURM_NTASKS, SLURM_PROCID, JOB_COMPLETION_INDEX)}


def settings_in_effect(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Every setting's value in effect, by variable name, safe to print.

    A secret shows as "set" or "unset", never its value; a URL shows with its password and
    tokens masked (trainfeed.redaction). Other values are shown parsed (the default when unset;
    a tuple as a list), and a value that does not parse as
    "invalid: <why>" rather than raising, so a diagnosis can show every problem at once.
    The result is JSON-serializable.

    Example:
        >>> shown = settings_in_effect({"TRAINFEED_TOKEN": "s3cret-token-of-the-job"})
        >>> shown["TRAINFEED_TOKEN"], shown["TRAINFEED_JOB"]
        ('set', 'default')
    """
    shown: dict[str, object] = {}
    for name, setting in SETTINGS.items():
        if setting.secret:
            shown[name] = "set" if setting.is_set(environ) else "unset"
            continue
        try:
            value = setting.get(environ)
        except ConfigurationError as e:
            shown[name] = f"invalid: {e}"
            continue
        if isinstance(value, str):
            value = redact_url(value)
        shown[name] = list(value) if isinstance(value, tuple) else value
    return shown
