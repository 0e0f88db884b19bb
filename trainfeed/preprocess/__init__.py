"""MADlib-style preprocessors: tables of arrays packed into ready mini-batches.

    from trainfeed.preprocess import training_preprocessor, validation_preprocessor

`training_preprocessor(source, output, dependent, independent, ...)` writes a packed dataset
(each record a buffer of many instances) and returns MADlib's summary; `dist.reader(output)`
then yields one dict of arrays per buffer. See trainfeed.preprocess.packed.
"""
from trainfeed.preprocess.encoding import PreprocessError
from trainfeed.preprocess.packed import (
    packed_summary,
    training_preprocessor,
    validation_preprocessor,
)

__all__ = ["PreprocessError", "packed_summary", "training_preprocessor",
           "validation_preprocessor"]
