"""Pixels: encoded images to uint8 batches (decode, crops, jitter, resize, the region decoder,
the pixel and memory budgets). `image.decode_into` is the one per-image entry."""
