"""trainfeed: an elastic master/worker data service that feeds deep-learning training."""
import importlib
from typing import TYPE_CHECKING, Any

from trainfeed.errors import (
    AppendMismatchError,
    AuthenticationError,
    CallCancelled,
    CheckpointError,
    ClusterError,
    ConcurrentUploadError,
    ConfigurationError,
    CorruptDatasetError,
    DatasetExistsError,
    DatasetNotFoundError,
    DecodeError,
    DecoderRefusedError,
    DecodersUnavailableError,
    DeliveryOrderError,
    EtcdUnavailableError,
    HardLinkedFilesError,
    IncompleteUploadError,
    InvalidNameError,
    InvalidQueryError,
    JobError,
    LeadershipError,
    ListFileError,
    LostRecordsError,
    MasterUnavailableError,
    MissingFilesError,
    OutsidePathsError,
    OversizeRecordsError,
    PartitionReadError,
    PixelBudgetError,
    PreprocessError,
    ProtocolVersionError,
    RankTakenError,
    SqlError,
    StateStoreError,
    StorageAccessError,
    SupersededError,
    SyncGroupBrokenError,
    SyncShortfallError,
    TrainfeedError,
    UndecodableImagesError,
    UnknownColumnError,
    UnknownLabelError,
)

# `upload` is imported here, not lazily: it is also the name of the submodule trainfeed.upload,
# which Python binds on the package when anything imports it, so that a lazy `upload` would be
# the module, not the function, after `import trainfeed.upload`.
from trainfeed.upload import UploadOptions, upload

# The reader loads on first use (PEP 562): `trainfeed upload`, the master and the other commands
# do not pay for its imports (gRPC, OpenCV, the lease client).
_LAZY = {
    "dist": "trainfeed.dist",
    "batch": "trainfeed.reader.batch",
    "BatchOptions": "trainfeed.reader.options",
    "DecodeOptions": "trainfeed.reader.options",
    "LabelOptions": "trainfeed.reader.options",
    "PipelineOptions": "trainfeed.reader.options",
    "SamplingOptions": "trainfeed.reader.options",
    "TransformOptions": "trainfeed.reader.options",
    "Reader": "trainfeed.reader.reader",
    "LocalSource": "trainfeed.reader.sources",
    "MasterSource": "trainfeed.reader.sources",
    "SyncOptions": "trainfeed.reader.world",
}

if TYPE_CHECKING:
    from trainfeed import dist
    from trainfeed.reader.batch import batch
    from trainfeed.reader.options import (
        BatchOptions,
        DecodeOptions,
        LabelOptions,
        PipelineOptions,
        SamplingOptions,
        TransformOptions,
    )
    from trainfeed.reader.reader import Reader
    from trainfeed.reader.sources import LocalSource, MasterSource
    from trainfeed.reader.world import SyncOptions


def __getattr__(name: str) -> Any:
    """Imports a lazily exported name on first use and keeps it in the package."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainfeed' has no attribute {name!r}")
    value = importlib.import_module(module)
    if name != "dist":
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """What is loaded (`__version__`, imported submodules) plus every lazily exported name."""
    return sorted(set(globals()) | set(__all__))


__all__ = ["AppendMismatchError", "AuthenticationError", "BatchOptions", "CallCancelled",
           "CheckpointError",
           "ClusterError", "ConcurrentUploadError", "ConfigurationError", "CorruptDatasetError",
           "DatasetExistsError", "DatasetNotFoundError", "DecodeError", "DecodeOptions",
           "DecoderRefusedError", "DecodersUnavailableError",
           "DeliveryOrderError", "EtcdUnavailableError", "HardLinkedFilesError",
           "IncompleteUploadError",
           "InvalidNameError", "InvalidQueryError",
           "JobError", "LabelOptions", "LeadershipError", "ListFileError", "LocalSource",
           "LostRecordsError", "MasterSource", "MasterUnavailableError", "MissingFilesError",
           "OutsidePathsError", "OversizeRecordsError", "PartitionReadError", "PipelineOptions",
           "PixelBudgetError", "PreprocessError", "ProtocolVersionError", "RankTakenError",
           "Reader", "SamplingOptions",
           "SqlError", "StateStoreError", "StorageAccessError", "SupersededError",
           "SyncGroupBrokenError", "SyncOptions", "SyncShortfallError", "TrainfeedError",
           "TransformOptions", "UndecodableImagesError", "UnknownColumnError",
           "UnknownLabelError", "UploadOptions", "batch", "dist", "upload"]
__version__ = "0.1.0"
