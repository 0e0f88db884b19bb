"""`trainfeed token JOB`: print the job token that opens one job only
(trainfeed.master.serve.auth)."""
from __future__ import annotations

import argparse

from trainfeed.errors import ConfigurationError
from trainfeed.names import validate_job_name
from trainfeed.security import TOKEN_ENV, TOKEN_FILE_ENV, job_token, load_token


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "token", help="print a token that opens one job only",
        description=f"Print the job token of JOB: a master started with the token in "
                    f"${TOKEN_ENV} (or the file named by --token-file or ${TOKEN_FILE_ENV}) "
                    f"admits it for that job only, so that one job's trainers cannot touch "
                    f"another's. Give it to the job's readers as their ${TOKEN_ENV}.")
    p.add_argument("job", help="the job name the readers use (TRAINFEED_JOB)")
    p.add_argument("--token-file", metavar="PATH", help="file holding the master's token")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        validate_job_name(args.job)
    except ValueError as e:
        raise ConfigurationError(str(e)) from None
    found = load_token(args.token_file)
    if found is None:
        raise ConfigurationError(f"no master token: set ${TOKEN_ENV} (or ${TOKEN_FILE_ENV}, or "
                                 f"--token-file PATH) to the token the master was started with")
    print(job_token(found[0], args.job))
    return 0
