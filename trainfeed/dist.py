"""`trainfeed.dist`: the distributed reader API (`dist.reader("dataset")`)."""
from trainfeed.reader.factory import reader, train_local

__all__ = ["reader", "train_local"]
