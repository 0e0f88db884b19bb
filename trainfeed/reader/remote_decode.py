"""Selecting remote decode for a reader: `TRAINFEED_DECODE=remote` and `TRAINFEED_DECODERS`.

A reader that decodes images and runs with `TRAINFEED_DECODE=remote` gets a DecoderPool
(trainfeed.decode.remote.client) at creation, and its pipeline reads each partition through it
(`Pipeline.loader`): the decoders read and decode, the trainer keeps leasing, positions, the
batcher, the shuffle buffer, transforms and augmentation. Readers that do not decode images
read as before. Options a decoder cannot run are refused here, at creation, naming the option.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trainfeed import settings
from trainfeed.decode.pixel_budget import max_image_pixels
from trainfeed.decode.remote.wire import chunk_records
from trainfeed.errors import ConfigurationError
from trainfeed.formats.manifest import Manifest
from trainfeed.reader.options import PipelineOptions

if TYPE_CHECKING:  # the client loads Arrow Flight and gRPC: only readers that decode remotely
    from trainfeed.decode.remote.client import DecoderPool, RequestTemplate

logger = logging.getLogger(__name__)

__all__ = ["decoder_pool", "remote_refusal", "request_template"]


def remote_refusal(options: PipelineOptions) -> str | None:
    """Why a decoder cannot run these options (naming the option), or None."""
    if options.decode.image_size is None:
        return ("image_size=None: remote decode sends images of one size; set "
                "image_size=(height, width), or unset TRAINFEED_DECODE to decode locally")
    if options.resamples:
        return (f"resample={options.sampling.resample!r}: resampling chooses records by label "
                f"before their payloads are read, on the trainer, which remote decode does not "
                f"do yet; drop resample (class_weights= weights the loss instead) or unset "
                f"TRAINFEED_DECODE")
    return None


def decoder_pool(options: PipelineOptions, environ: Mapping[str, str] | None = None,
                 master_lists: bool = False) -> DecoderPool | None:
    """The decoders a reader with `options` sends its partitions to, or None to decode
    locally; raises ConfigurationError for options or settings remote decode cannot run.
    `master_lists`: the reader has a master, which tells it the registered decoders (the pool
    starts empty, and the session keeps it to the master's list) unless TRAINFEED_DECODERS
    names them."""
    if settings.DECODE.get(environ) != "remote" or not options.decode.enabled:
        return None
    problem = remote_refusal(options)
    if problem is not None:
        raise ConfigurationError(f"{settings.DECODE.name}=remote: {problem}")
    addresses = settings.DECODERS.get(environ)
    if not addresses and not master_lists:
        raise ConfigurationError(f"{settings.DECODE.name}=remote without a master needs the "
                                 f"decoders' addresses: set {settings.DECODERS.name}="
                                 f"host:port[,...] (with a master, the decoders registered "
                                 f"with it are used)")
    from trainfeed.decode.remote.client import DecoderPool
    from trainfeed.security import load_token

    found = load_token(environ=environ)
    return DecoderPool(addresses, found[0] if found else None, listed=not addresses)


def request_template(options: PipelineOptions, manifest: Manifest, seed: int,
                     image_fields: tuple[str, ...]) -> RequestTemplate:
    """What each of a pipeline's requests carries besides its task."""
    decode = options.decode
    assert decode.image_size is not None  # remote_refusal
    fields = dataclasses.asdict(decode)
    # Trainer-side only: its own threads; the normalizing division runs on the trainer.
    fields.update(threads=None, normalizing_const=None)
    image_bytes = decode.image_size[0] * decode.image_size[1] * decode.channels
    from trainfeed.decode.remote.client import RequestTemplate

    return RequestTemplate(
        dataset=manifest.name, version=manifest.dataset_version,
        shuffle_seed=seed if options.shuffles else None, seed=seed, mode=options.mode,
        fields=tuple(manifest.field_names), image_fields=image_fields, decode=fields,
        max_pixels=max_image_pixels(),
        chunk=chunk_records(image_bytes * max(1, len(image_fields))))
