"""Where tokens and TLS settings come from, and the settings refused before anything connects."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainfeed.errors import ConfigurationError
from trainfeed.master.serve.server import ServerOptions
from trainfeed.security import ClientSecurity, bearer_metadata, load_token

TOKEN = "k7Qx-3vN_pL9sT2wR8yB4mC6dF1gH5jZ0aE"


def test_token_sources_in_order_flag_then_variable_then_file(tmp_path: Path) -> None:
    flag_file, env_file = tmp_path / "flag", tmp_path / "env"
    flag_file.write_text("from-flag-file-0123456789\n")
    env_file.write_text("  from-env-file-0123456789 \n")
    env = {"TRAINFEED_TOKEN": TOKEN, "TRAINFEED_TOKEN_FILE": str(env_file)}
    assert load_token(str(flag_file), env) == ("from-flag-file-0123456789",
                                               f"--token-file {flag_file}")
    assert load_token(None, env) == (TOKEN, "$TRAINFEED_TOKEN")
    assert load_token(None, {"TRAINFEED_TOKEN_FILE": str(env_file)}) == (
        "from-env-file-0123456789", f"$TRAINFEED_TOKEN_FILE={env_file}")
    assert load_token(None, {"TRAINFEED_TOKEN": TOKEN + "\n"}) == (TOKEN, "$TRAINFEED_TOKEN")
    assert load_token(None, {"TRAINFEED_TOKEN": ""}) is None
    assert load_token(None, {}) is None


@pytest.mark.parametrize("bad", ["two words", "tab\there", "ünïcode", "\n"])
def test_tokens_that_cannot_travel_as_metadata_are_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"\$TRAINFEED_TOKEN: the token (must|is)"):
        load_token(None, {"TRAINFEED_TOKEN": bad})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigurationError, match="the token is empty"):
        load_token(str(empty), {})
    with pytest.raises(ConfigurationError, match="cannot read '/nonexistent'"):
        load_token("/nonexistent", {})


def test_client_settings_from_the_environment() -> None:
    env = {"TRAINFEED_TOKEN": TOKEN, "TRAINFEED_TLS_CA": "/ca.pem",
           "TRAINFEED_TLS_CERT": "/c.pem", "TRAINFEED_TLS_KEY": "/k.pem",
           "TRAINFEED_TLS_SERVER_NAME": "master.test"}
    security = ClientSecurity.from_env(env)
    assert security == ClientSecurity(TOKEN, "/ca.pem", "/c.pem", "/k.pem", "master.test")
    assert security.tls and security.metadata == bearer_metadata(TOKEN)
    assert security.metadata == (("authorization", f"Bearer {TOKEN}"),)
    assert ClientSecurity.from_env(env, token="other-token-0123456789").token == \
        "other-token-0123456789"
    plain = ClientSecurity.from_env({})
    assert not plain.tls and plain.metadata == ()


def test_client_tls_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="needs both"):
        ClientSecurity(ca_file="/ca.pem", cert_file="/c.pem")
    with pytest.raises(ConfigurationError, match=r"set \$TRAINFEED_TLS_CA"):
        ClientSecurity(cert_file="/c.pem", key_file="/k.pem")
    with pytest.raises(ConfigurationError, match=r"set \$TRAINFEED_TLS_CA"):
        ClientSecurity(server_name="master.test")
    with pytest.raises(ConfigurationError, match=r"\$TRAINFEED_TLS_CA: cannot read"):
        ClientSecurity(ca_file="/nonexistent/ca.pem").open_channel("127.0.0.1:1")


def test_server_options_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="max message bytes must be ≥ 65536"):
        ServerOptions(max_message_bytes=1000)
    with pytest.raises(ConfigurationError, match="metrics port must be in 0..65535"):
        ServerOptions(metrics_port=70000)
    with pytest.raises(ConfigurationError, match="without spaces"):
        ServerOptions(token="a b")
    assert ServerOptions(metrics_port=None, token=TOKEN).transport == "plaintext"
