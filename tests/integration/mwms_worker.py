"""One worker of a `tf.distribute.MultiWorkerMirroredStrategy` job, run as a separate process by
tests/integration/test_keras_sync.py: TF_CONFIG (set by the test, on loopback) names the cluster
and this task, and `dist.reader(..., sync=True)` takes its world size and rank from it.

It trains a small Keras model for `--epochs` epochs on the reader's batches through
`as_tf_dataset` (each worker's batches are its replica's: `distribute_datasets_from_function`,
no auto-sharding), in a custom loop (Keras 3's `fit` takes no per-replica dataset), and writes
to `--out` one JSON object: the steps run per epoch, the ids of every batch the reader handed over
per pass, and the loss history.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

from trainfeed import BatchOptions, DecodeOptions, PipelineOptions, SyncOptions, dist


class Recorded:
    """The reader, noting the ids of each batch it hands to TensorFlow, per pass."""

    def __init__(self, reader: Any):
        self.reader = reader
        self.name = reader.name
        self.steps_per_epoch = reader.steps_per_epoch
        self.passes: list[list[int]] = []

    def output_spec(self) -> Any:
        return self.reader.output_spec()

    def __call__(self) -> Iterator[dict[str, Any]]:
        self.passes.append([])
        for batch in self.reader():
            self.passes[-1] += batch["_id"].tolist()
            yield batch


class Steps(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.per_epoch: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.per_epoch[-1] += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    reader = dist.reader(args.dataset,
                         pipeline=PipelineOptions(decode=DecodeOptions(True, image_size=(8, 8),
                                                                       normalizing_const=255.0),
                                                  batch=BatchOptions(size=args.batch)),
                         sync=SyncOptions())
    recorded = Recorded(reader)
    classes = len(reader.class_values)

    def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
        from trainfeed.reader.adapters import as_tf_dataset
        return as_tf_dataset(recorded, inputs="image", targets="label")

    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                                  keras.layers.Dense(classes, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    data = strategy.distribute_datasets_from_function(per_worker)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        reduction="sum_over_batch_size")

    @tf.function
    def train_step(batch: Any) -> Any:
        def replica_step(images: Any, labels: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
                scaled = loss / strategy.num_replicas_in_sync
            grads = tape.gradient(scaled, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    # Keras 3's fit() takes no per-replica datasets, and would re-split each worker's batches
    # among all replicas: a custom loop over the reader's batches, the model a Keras model.
    steps = Steps()
    losses: list[float] = []
    for _ in range(args.epochs):
        steps.on_epoch_begin(0)
        total = 0.0
        for batch in data:  # one pass of the reader: exactly steps_per_epoch batches
            total += float(train_step(batch))
            steps.on_train_batch_end(0)
        losses.append(total / max(1, steps.per_epoch[-1]))
    history = type("History", (), {"history": {"loss": losses}})()
    with open(args.out, "w") as f:
        json.dump({"steps": steps.per_epoch, "passes": recorded.passes,
                   "steps_per_epoch": reader.steps_per_epoch,
                   "loss": history.history["loss"]}, f)
    reader.close()


if __name__ == "__main__":
    sys.exit(main())
