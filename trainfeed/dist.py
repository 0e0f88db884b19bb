"""`trainfeed.dist`: the distributed reader API (`dist.reader("dataset")`)."""
from trainfeed.reader.factory import reader, train_local
from trainfeed.reader.sources import LocalSource, MasterSource
from trainfeed.reader.world import SyncOptions

__all__ = ["LocalSource", "MasterSource", "SyncOptions", "reader", "train_local"]
