"""Every public exception lives in `trainfeed.errors`, is exported from `trainfeed`, derives from
`TrainfeedError` and says when it is raised (issue 27 §3): a caller finds them all in one place
and catches all of ours with one `except`.

The check walks every module of the package, so an exception class added anywhere else later is
caught here, not in a review."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import trainfeed
from trainfeed import errors

# Exceptions that never leave trainfeed, each with why it stays where it is. A class defined in a
# private module or with a private name (leading `_`) is skipped without being listed.
INTERNAL = {
    "trainfeed.decode.remote.shared_pixels.SharedPixelsUnavailable":
        "a decoder that cannot open the trainer's memfd answers `no-shared-pixels` "
        "(trainfeed.decoder.service); the trainer asks it again over the network, never raises it",
    "trainfeed.master.core.decoders.DecoderRefused":
        "a decoder registration the master refuses; the decoders' stream ends with its text as "
        "INVALID_ARGUMENT (trainfeed.master.serve.decoder_streams); callers see the status",
    "trainfeed.master.core.decoders.DecodersFull":
        "the decoders' list is full; the stream ends with RESOURCE_EXHAUSTED "
        "(trainfeed.master.serve.decoder_streams); callers see the status",
    "trainfeed.master.core.admission.Refusal":
        "the master's admission control turns it into a gRPC status; callers never see it",
    "trainfeed.master.core.jobs.CallError":
        "a refusal of the master's coordinator that the gRPC shell turns into a status code "
        "(trainfeed.master.serve.service.STATUS_CODES); callers see the status, never the class",
    "trainfeed.master.core.jobs.InvalidArgument":
        "a refusal of the master's coordinator that the gRPC shell turns into a status code "
        "(trainfeed.master.serve.service.STATUS_CODES); callers see the status, never the class",
    "trainfeed.master.core.jobs.NotFound":
        "a refusal of the master's coordinator that the gRPC shell turns into a status code "
        "(trainfeed.master.serve.service.STATUS_CODES); callers see the status, never the class",
    "trainfeed.master.core.jobs.FailedPrecondition":
        "a refusal of the master's coordinator that the gRPC shell turns into a status code "
        "(trainfeed.master.serve.service.STATUS_CODES); callers see the status, never the class",
    "trainfeed.master.core.jobs.PermissionDenied":
        "a refusal of the master's coordinator that the gRPC shell turns into a status code "
        "(trainfeed.master.serve.service.STATUS_CODES); callers see the status, never the class",
    "trainfeed.master.core.jobs.ResourceExhausted":
        "a refusal of the master's coordinator that the gRPC shell turns into a status code "
        "(trainfeed.master.serve.service.STATUS_CODES); callers see the status, never the class",
    "trainfeed.io.prefetch.Stopped":
        "signals a prefetch thread to stop; caught inside trainfeed.io.prefetch",
}


def _public_modules() -> list[str]:
    """Every module of trainfeed but the generated protocol (`trainfeed.v1`) and private ones."""
    names = ["trainfeed"]
    for info in pkgutil.walk_packages(trainfeed.__path__, "trainfeed."):
        parts = info.name.split(".")
        if info.name.startswith("trainfeed.v1") or any(p.startswith("_") for p in parts):
            continue
        names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined (not merely imported) in a public trainfeed module."""
    found: dict[str, type[BaseException]] = {}
    for module_name in _public_modules():
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module_name and not name.startswith("_")):
                found[f"{module_name}.{name}"] = obj
    return found


PUBLIC = {path: cls for path, cls in _exception_classes().items() if path not in INTERNAL}


def test_the_walk_finds_the_exceptions() -> None:
    # The walk itself can fail (a skipped package, an import that hides a class): it must see
    # the root and the internal ones listed above, or the checks below would pass on nothing.
    assert "trainfeed.errors.TrainfeedError" in PUBLIC
    assert set(INTERNAL) <= set(_exception_classes()), "an INTERNAL entry no longer exists"
    assert len(PUBLIC) >= 30


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_each_public_exception_is_in_errors_exported_and_documented(path: str) -> None:
    cls = PUBLIC[path]
    assert cls.__module__ == "trainfeed.errors", (
        f"{path} is defined outside trainfeed.errors: move it there (re-export it from its old "
        f"module), or list it in INTERNAL with the reason callers never see it")
    assert getattr(trainfeed, cls.__name__, None) is cls, f"trainfeed does not export {path}"
    assert cls.__name__ in trainfeed.__all__, f"{cls.__name__} is missing from trainfeed.__all__"
    assert issubclass(cls, errors.TrainfeedError), f"{path} does not derive from TrainfeedError"
    assert cls.__doc__ and cls.__doc__.strip(), f"{path} has no docstring saying when it is raised"


def test_trainfeed_all_is_sorted() -> None:
    assert trainfeed.__all__ == sorted(trainfeed.__all__)


def test_old_import_paths_are_the_same_classes() -> None:
    # The modules that used to define them re-export them: old imports keep working, and an
    # `except` on either name catches the same class.
    from trainfeed.decode.pixel_budget import PixelBudgetError
    from trainfeed.decode.pixels import DecodeError
    from trainfeed.master.stores.etcd import EtcdUnavailableError
    from trainfeed.preprocess.encoding import PreprocessError
    from trainfeed.reader.labels import UnknownLabelError
    from trainfeed.sql.errors import InvalidQueryError, SqlError, UnknownColumnError
    assert (EtcdUnavailableError, PreprocessError, UnknownLabelError, InvalidQueryError, SqlError,
            UnknownColumnError, DecodeError, PixelBudgetError) == (
        errors.EtcdUnavailableError, errors.PreprocessError, errors.UnknownLabelError,
        errors.InvalidQueryError, errors.SqlError, errors.UnknownColumnError, errors.DecodeError,
        errors.PixelBudgetError)
