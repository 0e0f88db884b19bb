"""trainfeed: an elastic master/worker data service that feeds deep-learning training."""
from trainfeed import dist
from trainfeed.errors import TrainfeedError
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
from trainfeed.upload import UploadOptions, upload

__all__ = ["BatchOptions", "DecodeOptions", "LabelOptions", "PipelineOptions", "Reader",
           "SamplingOptions", "TrainfeedError", "TransformOptions", "UploadOptions", "batch",
           "dist", "upload"]
__version__ = "0.1.0"
