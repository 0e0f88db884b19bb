"""A Keras training script run as a separate process by tests/integration/test_keras_fit.py.

It trains a tiny conv net for one epoch with `model.fit(as_tf_dataset(reader))`, the reader being
`dist.reader(...)` with decoding, normalization and one-hot labels, in the cluster that the
environment names (TRAINFEED_MASTER, TRAINFEED_JOB), and writes to `--out` one JSON object: the
epoch it trained in, the ids and label classes of every batch TensorFlow took from the reader,
the number of training steps Keras ran, and the final loss.

A start barrier keeps one worker from finishing the epoch before the other has started (TF's
import and Keras's first trace take seconds, minutes on a loaded machine): the worker touches
`--ready` once its first training step is done, then waits for `--go` to appear. A worker with a
batch of epoch 0 in hand holds a lease of it, so epoch 0 cannot complete without it. (A barrier
before `fit` was not enough: beside stress-ng in CI one worker trained the whole epoch before the
other's first step, which then trained epoch 1, and every record came twice.)
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf
from start_barrier import wait_for_go

from trainfeed import (
    BatchOptions,
    DecodeOptions,
    LabelOptions,
    LocalSource,
    MasterSource,
    PipelineOptions,
    dist,
)
from trainfeed.reader.adapters import as_tf_dataset


class Recorded:
    """The reader, noting the ids and label classes of each batch it hands to TensorFlow."""

    def __init__(self, reader: Any):
        self.reader = reader
        self.name = reader.name
        self.ids: list[list[int]] = []
        self.classes: list[list[int]] = []

    def output_spec(self) -> Any:
        return self.reader.output_spec()

    def __call__(self) -> Iterator[dict[str, Any]]:
        for batch in self.reader():
            self.ids.append(batch["_id"].tolist())
            self.classes.append(batch["label"].argmax(axis=1).tolist())
            yield batch


def tiny_conv_net(num_classes: int) -> Any:
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ready", required=True, type=Path)
    parser.add_argument("--go", required=True, type=Path)
    parser.add_argument("--delay", type=float, default=0.0, help="extra seconds per step")
    args = parser.parse_args()
    # Two trainers and a master share the machine: one thread each for TF's kernels.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    # 2 partitions loaded ahead: a reader leases little ahead, so both readers share the epoch.
    source = (LocalSource(prefetch_partitions=2) if dist.train_local()
              else MasterSource(prefetch_partitions=2))
    reader = Recorded(dist.reader(args.dataset, source=source, pipeline=PipelineOptions(
        decode=DecodeOptions(True, image_size=(32, 32), normalizing_const=255.0),
        labels=LabelOptions(one_hot=True), batch=BatchOptions(size=16))))
    dataset = as_tf_dataset(reader)  # joins the job: output_spec() needs the manifest
    _, label_spec = dataset.element_spec
    model = tiny_conv_net(label_spec.shape[-1])
    steps: list[int] = []

    def step_done(batch: int, logs: Any) -> None:
        steps.append(batch)
        if len(steps) == 1:
            wait_for_go(args.ready, args.go)
        time.sleep(args.delay)

    pace = keras.callbacks.LambdaCallback(on_train_batch_end=step_done)

    history = model.fit(dataset, epochs=1, verbose=0, shuffle=False, callbacks=[pace])
    result = {"epoch": reader.reader.epoch, "ids": reader.ids, "classes": reader.classes,
              "steps": len(steps),
              "loss": history.history["loss"][-1]}
    Path(args.out).write_text(json.dumps(result))
    reader.reader.close()


if __name__ == "__main__":
    main()
