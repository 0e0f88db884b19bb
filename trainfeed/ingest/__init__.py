"""Ingest: turning a `.list` file into a published dataset, on one machine or as a cluster job.

One concern per module, in the order an upload runs: `options` (what to do), `inputs` (the
list's files checked before anything is written), `plan` (which records go to which shard: a
pure function of the files' sizes, so any process count packs the same shards), `pack` (one
shard: read, transform, encode, write, record progress), `pool` (shards packed by several
processes), `transform` (--jpeg-restarts, --max-side), `check` (--check-images), `progress`,
`lock`, `publish` (the manifest, last). `run` strings them together (`trainfeed.upload`, the
entry point, loads it when called); `slices` runs the same packing as the indexes of a
Kubernetes Indexed Job.
`board` keeps each packer's live progress on the storage, and `board_summary` sums it into the
uploads `trainfeed status --uploads` and the master's status page show.
"""
