"""A shard's progress record: written after the shard, so that its presence proves the shard
complete. An interrupted upload (or a re-run index of a cluster job) skips every shard that has
one, in any order: shards are planned before they are packed (trainfeed.ingest.plan)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from trainfeed.formats.manifest import RowGroupInfo, ShardInfo
from trainfeed.ingest.plan import ShardPlan
from trainfeed.storage import Storage


@dataclass
class ShardProgress:
    """What a finished shard contributes to the manifest."""

    shard: ShardInfo
    next_entry: int  # index into the upload's entries of the first row not in this shard
    labels: dict[str, int] = field(default_factory=dict)
    payload_bytes: int = 0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardProgress:
        raw = json.loads(data)
        s = raw["shard"]
        shard = ShardInfo(**{**s, "row_groups": tuple(RowGroupInfo(**g) for g in s["row_groups"])})
        return cls(shard, raw["next_entry"], raw["labels"], raw["payload_bytes"])


def progress_path(data_dir: str, index: int) -> str:
    return f"{data_dir}/_progress/shard-{index:05d}.json"


def finished(folder: Storage, data_dir: str, plan: ShardPlan) -> ShardProgress | None:
    """The progress of shard `plan` if an earlier run finished it as planned, else None (not
    written, or written by a run that cut differently: it is packed again)."""
    path = progress_path(data_dir, plan.index)
    try:
        done = ShardProgress.from_json(folder.read_bytes(path))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a damaged record proves nothing: the shard is written again
    if done.next_entry != plan.stop or done.shard.num_rows != len(plan):
        return None
    return done
