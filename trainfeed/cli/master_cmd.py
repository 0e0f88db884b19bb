"""`trainfeed master`: serve tasks over gRPC (token, TLS, size limit and metrics flags here)."""
from __future__ import annotations

import argparse
import logging

from trainfeed import settings
from trainfeed.cli.common import add_storage_options, storage_from, whole_number_or_none
from trainfeed.errors import ConfigurationError, InvalidNameError
from trainfeed.master.core.ledger import DEFAULT_MAX_FAILURES
from trainfeed.master.core.sessions import DEFAULT_MAX_SESSIONS
from trainfeed.master.serve.server import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_METRICS_PORT,
    MIN_MESSAGE_BYTES,
    ServerOptions,
    Serving,
    run_master,
)
from trainfeed.master.serve.service import DEFAULT_LEASE_TIMEOUT_S, MasterConfig
from trainfeed.master.stores import STATE_ENV, StateStore, open_state_store
from trainfeed.names import validate_job_name
from trainfeed.planning.partitions import DEFAULT_TARGET_PARTITIONS, MIN_PARTITION_ROWS
from trainfeed.redaction import redact_text, secrets_in
from trainfeed.security import (
    HOW_TO_MAKE_A_TOKEN,
    MIN_TOKEN_CHARS,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    ServerTLS,
    load_token,
)

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "master", help="run the master (hands out partitions over gRPC)",
        description="Serve datasets of a storage to readers: each job's epochs are split into "
                    "partitions leased to readers (TRAINFEED_MASTER=host:port on the workers).")
    add_storage_options(p)
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=50051,
                   help="port to listen on (default 50051; 0 picks a free one, printed at start)")
    p.add_argument("--state", metavar="URL",
                   help=f"job state store: a SQLite path or sqlite:///path (one master per "
                        f"file), etcd://host:port[/prefix][?ttl=SECONDS] (standby masters wait "
                        f"for the leadership), or memory:// (default ${STATE_ENV}, else "
                        f"./trainfeed-master.db)")
    p.add_argument("--lease-timeout", type=float, default=DEFAULT_LEASE_TIMEOUT_S,
                   metavar="SECONDS",
                   help=f"how long a silent worker keeps its tasks (default "
                        f"{DEFAULT_LEASE_TIMEOUT_S:g})")
    p.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES,
                   help=f"failures after which a partition is skipped for the epoch (default "
                        f"{DEFAULT_MAX_FAILURES})")
    p.add_argument("--partitions", type=int, default=DEFAULT_TARGET_PARTITIONS,
                   help=f"target partitions per dataset, ≥ 16 per expected worker (default "
                        f"{DEFAULT_TARGET_PARTITIONS}; a dataset of fewer row groups has them cut "
                        f"into slices of at least {MIN_PARTITION_ROWS} records)")
    p.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, metavar="N",
                   help=f"live reader sessions per job; a reader opening one more is refused "
                        f"with RESOURCE_EXHAUSTED (default {DEFAULT_MAX_SESSIONS})")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the parent process exits (for masters spawned by scripts)")
    security = p.add_argument_group(
        "security", f"Every call must carry the job's token (metadata 'authorization: Bearer "
                    f"TOKEN') unless the master runs with --insecure; the token comes from "
                    f"--token-file, else ${TOKEN_ENV}, else the file named by ${TOKEN_FILE_ENV} "
                    f"(never from the command line, where ps shows it). Readers send "
                    f"${TOKEN_ENV} / ${TOKEN_FILE_ENV}. The gRPC health service needs no token. "
                    f"Make one with: {HOW_TO_MAKE_A_TOKEN}")
    security.add_argument("--token-file", metavar="PATH",
                          help="file holding the token (e.g. a mounted Kubernetes Secret)")
    security.add_argument("--insecure", action="store_true",
                          help="serve without a token: anyone who can reach the port can read "
                               "and change every job (local use only)")
    security.add_argument("--tls-cert", metavar="PEM",
                          help="serve TLS with this certificate (chain); needs --tls-key. "
                               f"Readers then set ${TLS_CA_ENV} to the CA that signed it")
    security.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    security.add_argument("--tls-client-ca", metavar="PEM",
                          help="require a client certificate signed by this CA (mutual TLS; "
                               f"readers set ${TLS_CERT_ENV} and ${TLS_KEY_ENV})")
    security.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                          metavar="N",
                          help=f"largest request (and answer) accepted; a larger request is "
                               f"refused with RESOURCE_EXHAUSTED before it is parsed (default "
                               f"{DEFAULT_MAX_MESSAGE_BYTES}, at least {MIN_MESSAGE_BYTES})")
    security.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                          metavar="N",
                          help=f"gRPC connections held at once (one per reader process); one "
                               f"more is closed as soon as it is accepted (default "
                               f"{DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--metrics-port", type=_metrics_port, default=DEFAULT_METRICS_PORT,
                   metavar="PORT|none",
                   help=f"serve Prometheus metrics over HTTP at http://HOST:PORT/metrics "
                        f"(default {DEFAULT_METRICS_PORT}; 0 picks a free port, printed at "
                        f"start; 'none' exports none)")
    p.add_argument("--scale-decoders", metavar="JOB", action="append", default=[],
                   help="scale JOB's decoders' Deployment (<JOB>-decoders, made by `submit "
                        "--decoders MIN:MAX`) through the Kubernetes API, by its trainers' "
                        "input-bound share and the registered decoders' busy share; repeatable")
    p.set_defaults(run=run)


_metrics_port = whole_number_or_none("a port number")


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The listening options the flags and the environment describe; ConfigurationError for
    settings that cannot work together, saying what to set."""
    found = load_token(args.token_file)
    if args.insecure and found:
        raise ConfigurationError(f"--insecure and a token ({found[1]}) exclude each other: "
                                 f"drop --insecure to require the token, or unset it")
    if not args.insecure and not found:
        raise ConfigurationError(
            f"no token: the master's API requires one. Set ${TOKEN_ENV} (or "
            f"${TOKEN_FILE_ENV}, or --token-file PATH) to a secret shared with the readers, "
            f"made e.g. with {HOW_TO_MAKE_A_TOKEN}; or pass --insecure to serve without one "
            f"(local use only)")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigurationError("TLS needs both --tls-cert and --tls-key; only one is set")
    if args.tls_client_ca and not args.tls_cert:
        raise ConfigurationError("--tls-client-ca (mutual TLS) needs the master's own "
                                 "certificate too: set --tls-cert and --tls-key")
    token, source = found if found else (None, "")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        logger.warning("the token (%s) is only %d characters long: a short token can be "
                       "guessed; make one with %s", source, len(token), HOW_TO_MAKE_A_TOKEN)
    tls = ServerTLS(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    scaled = []
    for job in args.scale_decoders:
        try:
            scaled.append(validate_job_name(job))
        except InvalidNameError as e:
            raise ConfigurationError(f"--scale-decoders: {e}") from None
    return ServerOptions(host=args.host, port=args.port, token=token, tls=tls,
                         max_message_bytes=args.max_message_bytes,
                         metrics_port=args.metrics_port, max_connections=args.max_connections,
                         scale_decoders=tuple(scaled))


def _state_store(url: str | None) -> StateStore:
    """The state store `url` names; a URL it cannot take (an unknown scheme, credentials in
    an etcd URL, a bad option) is a ConfigurationError saying so, with the URL's secrets
    masked and no traceback (the store's ValueError may quote the URL as given)."""
    try:
        return open_state_store(url)
    except ValueError as e:
        message = redact_text(str(e), secrets_in([url or settings.STATE.get()]))
        raise ConfigurationError(f"--state: {message}") from None


def run(args: argparse.Namespace) -> int:
    options = server_options(args)  # before anything else: a bad setting fails at once
    config = MasterConfig(storage=storage_from(args), lease_timeout_s=args.lease_timeout,
                          max_failures=args.max_failures, target_partitions=args.partitions,
                          max_sessions=args.max_sessions)
    store = _state_store(args.state)
    json_logs = getattr(args, "log_format", "text") == "json"

    def ready(serving: Serving) -> None:
        metrics = (f"metrics on http://{args.host}:{serving.metrics_port}/metrics, status "
                   f"page on http://{args.host}:{serving.metrics_port}/status"
                   if serving.metrics_port is not None else "no metrics")
        line = (f"trainfeed master listening on {args.host}:{serving.port} (storage "
                f"{config.storage.url}, {options.transport}, "
                f"{'token required' if options.token else 'no token'}, {metrics})")
        if json_logs:  # one JSON object per line, this one included
            logger.info("%s", line)
        else:
            print(line, flush=True)
    run_master(config, store, options, on_ready=ready, exit_with_parent=args.exit_with_parent)
    return 0
