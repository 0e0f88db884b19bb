"""How the master's gRPC API is secured, for both ends: the job's token and the TLS material.

One place reads these settings, so that the master (`trainfeed master`), the readers
(`MasterClient`) and the probe (`trainfeed health`) agree on the names and the rules:

- the token is a shared secret sent as gRPC metadata `authorization: Bearer <token>` (checked by
  trainfeed.master.serve.auth); it comes from `$TRAINFEED_TOKEN`, or from the file named by
  `$TRAINFEED_TOKEN_FILE` (how a Kubernetes Secret is mounted), never from a command line, where
  `ps` would show it;
- TLS is the master's certificate (and, for mutual TLS, the clients'), PEM files named by flags
  on the master and by `$TRAINFEED_TLS_*` on clients.

Nothing here talks to the network: it reads files and builds gRPC credentials.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from trainfeed import settings
from trainfeed.errors import ConfigurationError

TOKEN_ENV = settings.TOKEN.name
TOKEN_FILE_ENV = settings.TOKEN_FILE.name
TLS_CA_ENV = settings.TLS_CA.name
TLS_CERT_ENV = settings.TLS_CERT.name
TLS_KEY_ENV = settings.TLS_KEY.name
TLS_SERVER_NAME_ENV = settings.TLS_SERVER_NAME.name
# gRPC metadata keys are lower case; the value is an RFC 6750 bearer credential.
AUTH_METADATA_KEY = "authorization"
BEARER_SCHEME = "Bearer"
# Shorter tokens can be guessed; secrets.token_urlsafe(32) gives 43 characters.
MIN_TOKEN_CHARS = 16
HOW_TO_MAKE_A_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"


# A job token (`job_token`): `tfjob:<job>:<hex HMAC>`; job names cannot hold ':'
# (trainfeed.names), so it splits unambiguously.
JOB_TOKEN_PREFIX = "tfjob:"
_JOB_TOKEN_LABEL = b"trainfeed job token\0"


def job_token(master_token: str, job: str) -> str:
    """The token that opens `job` only on a master started with `master_token`: an HMAC of the
    job name, so the master checks it with nothing stored (trainfeed.master.serve.auth)."""
    mac = hmac.new(master_token.encode(), _JOB_TOKEN_LABEL + job.encode(), hashlib.sha256)
    return f"{JOB_TOKEN_PREFIX}{job}:{mac.hexdigest()}"


def read_setting_file(path: str, setting: str) -> bytes:
    """The bytes of the file a setting names; a ConfigurationError naming both if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigurationError(f"{setting}: cannot read {path!r}: {e.strerror or e}") from None


def check_token(token: str, source: str) -> str:
    """Returns `token` if it can travel as gRPC metadata (printable ASCII, no whitespace, not
    empty), else raises ConfigurationError naming where it came from."""
    if not token:
        raise ConfigurationError(f"{source}: the token is empty; set it to a secret shared by "
                                 f"the master and its readers, e.g. from {HOW_TO_MAKE_A_TOKEN}")
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ConfigurationError(f"{source}: the token must be printable ASCII without spaces "
                                 f"(it travels as an HTTP/2 header)")
    return token


def load_token(token_file: str | None = None,
               environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The token and where it came from, or None if none is set.

    Looks at, in order: `token_file` (the master's --token-file), `$TRAINFEED_TOKEN`, the file
    named by `$TRAINFEED_TOKEN_FILE`. Surrounding whitespace is not part of the token (a
    Secret made with `echo` ends in a newline).
    """
    token = settings.TOKEN.get(environ)
    if token_file:
        source = f"--token-file {token_file}"
    elif token is not None:
        source = f"${TOKEN_ENV}"
        return check_token(token.strip(), source), source
    elif (token_file := settings.TOKEN_FILE.get(environ)) is not None:
        source = f"${TOKEN_FILE_ENV}={token_file}"
    else:
        return None
    text = read_setting_file(token_file, source).decode("utf-8", "replace").strip()
    return check_token(text, source), source


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries `token` (works on plaintext and TLS channels alike)."""
    return ((AUTH_METADATA_KEY, f"{BEARER_SCHEME} {token}"),)


@dataclass(frozen=True)
class ServerTLS:
    """The master's TLS files (PEM). With `client_ca_file`, every client must present a
    certificate signed by it (mutual TLS); without, any client may connect (then the token is
    what authenticates it)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        """Reads the files now: a missing or unreadable one fails at start, naming its flag."""
        cert = read_setting_file(self.cert_file, "--tls-cert")
        key = read_setting_file(self.key_file, "--tls-key")
        client_ca = (read_setting_file(self.client_ca_file, "--tls-client-ca")
                     if self.client_ca_file else None)
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca,
                                           require_client_auth=client_ca is not None)


@dataclass(frozen=True)
class ClientSecurity:
    """What a client of the master presents: a token (or none, for an --insecure master) and,
    when `ca_file` is set, TLS (verifying the master against that CA bundle), with a client
    certificate for mutual TLS. `server_name` overrides the name checked against the master's
    certificate (when it is reached by an address its certificate does not name)."""

    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token, "the client's token")
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigurationError(f"a client certificate needs both ${TLS_CERT_ENV} and "
                                     f"${TLS_KEY_ENV}; only one is set")
        if (self.cert_file or self.server_name) and not self.ca_file:
            raise ConfigurationError(f"${TLS_CERT_ENV} / ${TLS_SERVER_NAME_ENV} apply to TLS "
                                     f"channels: set ${TLS_CA_ENV} to the CA bundle that "
                                     f"signed the master's certificate as well")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 token: str | None = None) -> ClientSecurity:
        """Settings from `$TRAINFEED_TOKEN[_FILE]` and `$TRAINFEED_TLS_*`; `token`, if given,
        replaces the environment's."""
        if token is None:
            found = load_token(environ=environ)
            token = found[0] if found else None
        return cls(token=token, ca_file=settings.TLS_CA.get(environ),
                   cert_file=settings.TLS_CERT.get(environ),
                   key_file=settings.TLS_KEY.get(environ),
                   server_name=settings.TLS_SERVER_NAME.get(environ))

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata to send with every call: the token's, or nothing."""
        return bearer_metadata(self.token) if self.token else ()

    def open_channel(self, address: str,
                     options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
        """A blocking channel to `address`: TLS when a CA is set, else plaintext."""
        if not self.tls:
            return grpc.insecure_channel(address, options=list(options))
        assert self.ca_file is not None
        ca = read_setting_file(self.ca_file, f"${TLS_CA_ENV}")
        cert = read_setting_file(self.cert_file, f"${TLS_CERT_ENV}") if self.cert_file else None
        key = read_setting_file(self.key_file, f"${TLS_KEY_ENV}") if self.key_file else None
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                                   certificate_chain=cert)
        extra: list[tuple[str, object]] = list(options)
        if self.server_name:
            extra.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(address, credentials, options=extra)
