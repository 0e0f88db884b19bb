"""`trainfeed decoder`: a stateless decode worker for trainers that decode remotely (issue 37)."""
from __future__ import annotations

import argparse
import logging
import os
import socket

from trainfeed import settings
from trainfeed.cli.common import add_storage_options, storage_from
from trainfeed.decoder.drain import DRAIN_S, Drain
from trainfeed.errors import ConfigurationError
from trainfeed.security import (
    HOW_TO_MAKE_A_TOKEN,
    MIN_TOKEN_CHARS,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    load_token,
)

logger = logging.getLogger(__name__)

# --drain-s at most: an hour (a longer grace is a pod that never stops).
MAX_DRAIN_S = 3600.0

HELP = "run a decode worker (trainers with TRAINFEED_DECODE=remote send it partitions)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decoder", help=HELP,
        description="Read partitions of a storage's datasets and decode them for trainers "
                    "(TRAINFEED_DECODE=remote, TRAINFEED_DECODERS=host:port,... on the "
                    "trainers): the same crops, flips and seeds as local decode, streamed as "
                    "uint8 pixels over Arrow Flight. Stateless: start and stop any number. "
                    f"Every call must carry the job's token (${TOKEN_ENV}, or the file named "
                    f"by ${TOKEN_FILE_ENV}: the master's token, which also admits the job "
                    "tokens made from it), unless --insecure.")
    add_storage_options(p)
    p.add_argument("--listen", metavar="HOST:PORT", default="0.0.0.0:50052",
                   help="address to listen on (default 0.0.0.0:50052; port 0 picks a free one, "
                        "printed at start)")
    p.add_argument("--threads", type=int, default=None,
                   help="decode threads (default: this process's cores)")
    p.add_argument("--master", metavar="HOST:PORT", default=None,
                   help="register with this master (default $TRAINFEED_MASTER; none: not "
                        "registered), which lists this decoder to its trainers: they then need "
                        "no TRAINFEED_DECODERS. Needs the master's own token")
    p.add_argument("--advertise", metavar="HOST:PORT", default=None,
                   help="the address trainers dial, as told by the master (default: the "
                        "--listen host, else $POD_IP, else this host's name; the listening port)")
    p.add_argument("--drain-s", type=float, default=DRAIN_S, metavar="SECONDS",
                   help=f"on SIGTERM or SIGINT, refuse new calls (trainers ask another decoder), "
                        f"leave the master's list, and let the calls in flight finish for up to "
                        f"this long before cutting them (default {DRAIN_S:g}; keep it under the "
                        f"pod's terminationGracePeriodSeconds)")
    p.add_argument("--insecure", action="store_true",
                   help="serve without a token: anyone who can reach the port can read the "
                        "storage's datasets through it")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from trainfeed.decoder.service import DecoderServer  # Flight: only for this command
    from trainfeed.decoder.stopping import serve_until_stopped
    from trainfeed.decoder.work import warm_up

    host, port = _checked(args)
    drain = Drain(args.drain_s)
    token = _token(args.insecure)
    master = args.master or settings.MASTER.get()
    if master:
        _check_registration(master, args.advertise)
    warm_up()  # (before it listens: a decoder trainers are told of answers at full speed)
    server = DecoderServer(f"grpc://{host}:{port}", storage_from(args), token, args.threads)
    print(f"trainfeed decoder listening on {host}:{server.port} (pid {os.getpid()})",
          flush=True)
    registrar = None
    if master:
        from trainfeed.decoder.registrar import Registrar

        advertise = args.advertise or f"{advertised_host(host)}:{server.port}"
        registrar = Registrar(master, advertise, server.figures, args.threads).start()
        print(f"registering with master {master} as {advertise}", flush=True)
    try:
        return serve_until_stopped(server, drain, registrar)
    finally:
        if registrar is not None:
            registrar.close()
        server.close()


def _checked(args: argparse.Namespace) -> tuple[str, str]:
    """--listen (as host, port), --threads and --drain-s, refused before anything starts."""
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigurationError(f"--listen {args.listen!r}: expected HOST:PORT, e.g. "
                                 f"0.0.0.0:50052")
    if args.threads is not None and args.threads < 1:
        raise ConfigurationError(f"--threads {args.threads}: expected a number ≥ 1")
    if not 0 <= args.drain_s <= MAX_DRAIN_S:
        raise ConfigurationError(f"--drain-s {args.drain_s:g}: expected seconds in [0, "
                                 f"{MAX_DRAIN_S:g}] (and under the pod's "
                                 f"terminationGracePeriodSeconds)")
    return host, port


def _token(insecure: bool) -> str | None:
    """The token every call must carry (None: --insecure), refused when missing, or given
    together with --insecure."""
    found = load_token()
    if insecure and found:
        raise ConfigurationError(f"--insecure and a token ({found[1]}) exclude each other: "
                                 f"drop --insecure to require the token, or unset it")
    if not insecure and not found:
        raise ConfigurationError(
            f"no token: a decoder requires one. Set ${TOKEN_ENV} (or ${TOKEN_FILE_ENV}) to the "
            f"master's token, made e.g. with {HOW_TO_MAKE_A_TOKEN}; or pass --insecure")
    token = found[0] if found else None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        logger.warning("the token is only %d characters long: a short token can be guessed; "
                       "make one with %s", len(token), HOW_TO_MAKE_A_TOKEN)
    return token


def advertised_host(listen_host: str) -> str:
    """The host trainers dial when --advertise is not given: the --listen host if it is one
    address, else the pod's IP ($POD_IP, set by the Deployment `submit` makes), else this
    host's name."""
    if listen_host not in ("0.0.0.0", "::", "[::]"):
        return listen_host
    return os.environ.get("POD_IP") or socket.gethostname()


def _check_registration(master: str, advertise: str | None) -> None:
    """--master and --advertise, checked before serving (the master would refuse an address
    its trainers could not dial, and the decoder would only log it)."""
    from trainfeed.master.core.decoders import DecoderRefused, check_address

    m_host, _, m_port = master.rpartition(":")
    if not m_host or not m_port.isdigit():
        raise ConfigurationError(f"--master {master!r}: expected HOST:PORT, e.g. "
                                 f"master:50051")
    if advertise is not None:
        try:
            check_address(advertise)
        except DecoderRefused as e:
            raise ConfigurationError(f"--advertise {advertise[:300]!r}: {e}") from None
