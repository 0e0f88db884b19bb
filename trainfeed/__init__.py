"""trainfeed: an elastic master/worker data service that feeds deep-learning training."""
from trainfeed import dist
from trainfeed.errors import (
    AppendMismatchError,
    AuthenticationError,
    CheckpointError,
    ClusterError,
    ConcurrentUploadError,
    ConfigurationError,
    CorruptDatasetError,
    DatasetExistsError,
    DatasetNotFoundError,
    DecodeError,
    DeliveryOrderError,
    EtcdUnavailableError,
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
from trainfeed.upload import UploadOptions, upload

__all__ = ["AppendMismatchError", "AuthenticationError", "BatchOptions", "CheckpointError",
           "ClusterError", "ConcurrentUploadError", "ConfigurationError", "CorruptDatasetError",
           "DatasetExistsError", "DatasetNotFoundError", "DecodeError", "DecodeOptions",
           "DeliveryOrderError", "EtcdUnavailableError", "IncompleteUploadError",
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
