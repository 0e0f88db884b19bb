"""`trainfeed decoder`'s flags and token (issue 37): each bad value is refused before the decoder
serves anything, exit status 2, with the flag and what to do in the message."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainfeed.cli.main import main

CASES = {
    "listen-without-port": (["--listen", "nohost"], "test-token-0123456789abcdef",
                            "--listen 'nohost': expected HOST:PORT"),
    "listen-port-not-a-number": (["--listen", "h:http"], "test-token-0123456789abcdef",
                                 "expected HOST:PORT"),
    "threads-zero": (["--threads", "0"], "test-token-0123456789abcdef",
                     "--threads 0: expected a number ≥ 1"),
    "drain-below-zero": (["--drain-s", "-1"], "test-token-0123456789abcdef",
                         "--drain-s -1: expected seconds in [0, 3600]"),
    "drain-not-a-number": (["--drain-s", "nan"], "test-token-0123456789abcdef",
                           "--drain-s nan: expected seconds in [0, 3600]"),
    "no-token": ([], None, "no token: a decoder requires one"),
    "insecure-and-a-token": (["--insecure"], "test-token-0123456789abcdef",
                             "--insecure and a token"),
    "advertise-not-an-address": (["--master", "127.0.0.1:1", "--advertise", "http://x"],
                                 "test-token-0123456789abcdef",
                                 "--advertise 'http://x': decoder address"),
    "master-not-an-address": (["--master", "nohost"], "test-token-0123456789abcdef",
                              "--master 'nohost': expected HOST:PORT"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_flag_or_token_is_refused_before_serving(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    flags, token, expected = CASES[case]
    monkeypatch.delenv("TRAINFEED_TOKEN_FILE", raising=False)
    if token is None:
        monkeypatch.delenv("TRAINFEED_TOKEN", raising=False)
    else:
        monkeypatch.setenv("TRAINFEED_TOKEN", token)
    assert main(["decoder", "--storage", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert "listening" not in err
