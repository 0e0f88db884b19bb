"""What the tests that run readers with `trainfeed decoder` processes share (remote decode,
issue 37): the token their decoders start with. The `remote` fixture is in conftest.py."""
from __future__ import annotations

DECODER_TOKEN = "decoder-test-token-0123456789"
