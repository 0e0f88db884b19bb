"""The saved form of a ledger (trainfeed.master.core.ledger): the JSON snapshot a state store holds
(inside trainfeed.master.core.saved_job.SavedJob), and its restore.

`saved_form` and `restore` are each other's inverse (but for lease deadlines, which the master sets
afresh with `Ledger.refresh_deadlines`, and the expiry metric). A restore reads every older
version it may meet in a store: v1 kept [worker, deadline] per pending partition and nobody
in done; v1 and v2 had no fencing tokens; states before v4 had no holders.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from trainfeed.master.core.ledger_state import LedgerState

__all__ = ["STATE_VERSION", "check_version", "restore", "saved_form"]

STATE_VERSION = 4


def saved_form(ledger: LedgerState) -> dict[str, Any]:
    """A JSON-serializable snapshot of `ledger`; `restore` rebuilds it exactly (but for lease
    deadlines, which `Ledger.refresh_deadlines` sets afresh)."""
    return {
        "version": STATE_VERSION, "num_partitions": ledger.num_partitions, "seed": ledger.seed,
        "max_failures": ledger.max_failures, "epoch": ledger.epoch, "todo": list(ledger.todo),
        "pending": {str(p): worker for p, worker in ledger.pending.items()},
        "done": {str(p): worker for p, worker in ledger.done.items()},
        "failed": {str(p): reason for p, reason in ledger.failed.items()},
        "previous_failed": {str(p): r for p, r in ledger.previous_failed.items()},
        "failures": {str(p): n for p, n in ledger.failures.items()},
        "progress": {str(p): n for p, n in ledger.progress.items()},
        "progress_by": {str(p): w for p, w in ledger.progress_by.items()},
        "next_token": ledger.next_token,
        "token_key": ledger.token_key.hex() if ledger.token_key is not None else None,
        "leases": {str(p): [worker, token] for p, (worker, token) in ledger.leases.items()},
        "holders": {str(p): sorted(w) for p, w in ledger.holders.items()},
        "keep": ledger.keep, "limits": {str(p): n for p, n in ledger.limits.items()},
        "dropped": ledger.dropped,
    }


def check_version(state: dict[str, Any]) -> None:
    """Refuses a saved `state` of a version this code cannot restore."""
    version = state.get("version")
    if version not in (1, 2, 3, STATE_VERSION):
        raise ValueError(f"ledger state version {version!r}, expected {STATE_VERSION}")


def restore(ledger: LedgerState, state: dict[str, Any]) -> None:
    """Fills `ledger`, made afresh from the state's num_partitions, seed, max_failures and epoch,
    with the rest of a saved `state` (of a version `check_version` accepted)."""
    version = state.get("version")
    ledger.todo = deque(state["todo"])
    for p, holder in state["pending"].items():
        worker = holder[0] if version == 1 else holder  # v1: [worker, deadline]
        ledger.pending[int(p)] = worker
        # mutmut: any value is equivalent (by_worker's dicts are ordered sets).
        ledger.by_worker.setdefault(worker, {})[int(p)] = None
    done = state["done"]
    ledger.done = ({int(p): "" for p in done} if version == 1
                   else {int(p): w for p, w in done.items()})
    ledger.failed = {int(p): r for p, r in state["failed"].items()}
    ledger.previous_failed = {int(p): r for p, r in state.get("previous_failed", {}).items()}
    ledger.failures = {int(p): n for p, n in state["failures"].items()}
    ledger.progress = {int(p): n for p, n in state.get("progress", {}).items()}
    ledger.progress_by = {int(p): w for p, w in state.get("progress_by", {}).items()}
    ledger.keep = state.get("keep")
    ledger.limits = {int(p): n for p, n in state.get("limits", {}).items()}
    ledger.dropped = state.get("dropped", 0)
    _restore_fencing(ledger, state)


def _restore_fencing(ledger: LedgerState, state: dict[str, Any]) -> None:
    """Tokens from a v3 state; a v1/v2 state had none: its pending leases get fresh ones
    (in partition order, so that every restore of the same state agrees)."""
    ledger.next_token = state.get("next_token", 1)
    key = state.get("token_key")
    ledger.token_key = bytes.fromhex(key) if key else None
    ledger.leases = {int(p): (worker, token)
                     for p, (worker, token) in state.get("leases", {}).items()}
    for p in sorted(ledger.pending):
        if p not in ledger.leases:
            ledger._fence(p, ledger.pending[p])
    holders = state.get("holders")
    if holders is None:  # a state older than it: the holders it still names
        ledger.holders = {}
        for p, (worker, _) in ledger.leases.items():
            ledger.holders.setdefault(p, set()).add(worker)
        for p, worker in (*ledger.done.items(), *ledger.progress_by.items()):
            if worker:
                ledger.holders.setdefault(p, set()).add(worker)
    else:
        ledger.holders = {int(p): set(w) for p, w in holders.items()}
