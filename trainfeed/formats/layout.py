"""A shard's default layout: the sizes of its row groups and of itself.

Apart from trainfeed.formats.shards (which encodes shards), so that what only needs the numbers
(an upload's options, the CLI's help) does not import pyarrow and numpy for them: `import
trainfeed` stays light (issue 30 §2).
"""
from __future__ import annotations

__all__ = ["DEFAULT_ROW_GROUP_BYTES", "DEFAULT_ROW_GROUP_ROWS", "DEFAULT_SHARD_BYTES",
           "DEFAULT_SHARD_ROW_GROUPS"]

# 256 rows gives ~80 row groups for 20k small images (≥ 16 partitions for each of 4 workers) while
# one row group of 64x64 JPEGs (~650 KB) is still one large sequential read.
DEFAULT_ROW_GROUP_ROWS = 256
# Caps a row group of large files (full-size photos): reading one must not take ages or memory.
DEFAULT_ROW_GROUP_BYTES = 8 << 20
# Shards are the unit of upload resume and of checksumming; 64 MiB keeps both cheap.
DEFAULT_SHARD_BYTES = 64 << 20
DEFAULT_SHARD_ROW_GROUPS = 64
