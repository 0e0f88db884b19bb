"""`trainfeed preprocess train|validate`: pack a table of arrays into MADlib-style buffers."""
from __future__ import annotations

import argparse
import json
from typing import Any

from trainfeed.cli.common import add_storage_options, storage_from
from trainfeed.preprocess import training_preprocessor, validation_preprocessor
from trainfeed.preprocess.arguments import split_names


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preprocess", help="pack arrays into mini-batch buffers (MADlib training_preprocessor_dl)",
        description="Write a packed dataset: each record a buffer of many instances, the "
                    "independent arrays stacked and normalized, the dependent ones one-hot, "
                    "sized evenly for the workers that will read it. Prints the summary.")
    steps = p.add_subparsers(dest="step", metavar="STEP", required=True)
    train = steps.add_parser("train", help="pack a training set (shuffled)",
                             description="Pack a training set; rows are shuffled.")
    _common(train)
    train.add_argument("--buffer-size", type=int, help="rows per buffer (default: from the row "
                                                        "count, array size and workers)")
    train.add_argument("--normalizing-const", type=float, default=1.0,
                       help="divide the independent arrays by this (e.g. 255; > 0)")
    train.add_argument("--num-classes", type=int, nargs="+", metavar="N",
                       help="pad the one-hot width to this many classes (one value, or one "
                            "per dependent variable)")
    _distribution(train)
    train.add_argument("--seed", type=int, default=0, help="seed of the row shuffle")
    train.set_defaults(run=run_train)
    val = steps.add_parser("validate", help="pack a validation set like a training output",
                           description="Pack a validation set with the class values and "
                                       "normalizing constant of a packed training set.")
    _common(val)
    val.add_argument("--training", required=True, metavar="DATASET",
                     help="the packed training dataset whose classes to reuse")
    val.add_argument("--buffer-size", type=int, help="rows per buffer")
    _distribution(val)
    val.set_defaults(run=run_validate)


def _distribution(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-workers", type=int,
                   help="workers that will read the output (MADlib's segments; default: the "
                        "number of workers named by --distribution-rules, else 1, or for "
                        "validate the training output's)")
    p.add_argument("--distribution-rules", default="all",
                   help="all (all_segments), gpu (gpu_segments), or a comma-separated list "
                        "of worker names")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a Parquet or CSV file (path or fsspec URL); CSV cells may "
                                  "hold JSON arrays")
    p.add_argument("output", help="name of the packed dataset to write")
    p.add_argument("--dependent", required=True, nargs="+", metavar="COLUMN",
                   help="dependent variable(s): class labels or one-hot arrays (also as "
                        "MADlib's comma-separated list)")
    p.add_argument("--independent", required=True, nargs="+", metavar="COLUMN",
                   help="independent variable(s): numeric arrays (also comma-separated)")
    add_storage_options(p)


def _print(summary: dict[str, Any]) -> int:
    print(json.dumps(summary, indent=1))
    return 0


def _columns(given: list[str]) -> list[str]:
    """Columns given as separate arguments and/or MADlib's comma-separated lists."""
    return [name for item in given for name in split_names(item, "column", "preprocess")]


def run_train(args: argparse.Namespace) -> int:
    num_classes = args.num_classes
    return _print(training_preprocessor(
        args.source, args.output, _columns(args.dependent), _columns(args.independent),
        buffer_size=args.buffer_size, normalizing_const=args.normalizing_const,
        num_classes=num_classes[0] if num_classes and len(num_classes) == 1 else num_classes,
        distribution_rules=args.distribution_rules, num_workers=args.num_workers,
        storage=storage_from(args), seed=args.seed))


def run_validate(args: argparse.Namespace) -> int:
    return _print(validation_preprocessor(
        args.source, args.output, _columns(args.dependent), _columns(args.independent),
        training_preprocessor_table=args.training, buffer_size=args.buffer_size,
        distribution_rules=args.distribution_rules, num_workers=args.num_workers,
        storage=storage_from(args)))
