"""The ledger under hostile reports (issue 14): a Hypothesis state machine in which honest
workers lease, report and heartbeat while every other call names the wrong worker, a wrong or
stale fencing token, a past or future epoch, or a partition that does not exist. Such reports must
never be applied and never change the ledger; honest ones always are."""
from __future__ import annotations

import json
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trainfeed.master.core.ledger import LeaseStatus, Ledger, Outcome, Verdict

T = 10.0  # lease timeout
P = 6  # partitions
WORKERS = "abc"


def apply(ledger: Ledger, worker: str, epoch: int, partition: int, token: int,
          outcome: Outcome, consumed: int = 0) -> Verdict:
    """What the master's servicer does with one report: check it, and apply it only if the
    verdict says so (trainfeed.master.serve.service._check_reports and _apply_reports)."""
    verdict = ledger.check_report(worker, epoch, partition, token, outcome)
    if verdict is Verdict.APPLY:
        if outcome is Outcome.DONE:
            ledger.report_done(epoch, partition, worker)
        elif outcome is Outcome.PROGRESS:
            ledger.report_progress(epoch, partition, consumed)
        else:
            ledger.report_failed(epoch, partition, "read error")
    return verdict


def snapshot(ledger: Ledger) -> str:
    return json.dumps(ledger.state(), sort_keys=True)


class HostileLedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger(P, seed=1, max_failures=2)
        self.now = 0.0
        self.snapshot: dict[str, Any] = self.ledger.state()
        self.ops: list[Any] = []
        # Every (worker, epoch, partition, token) ever leased: stale tokens to replay later.
        self.issued: list[tuple[str, int, int, int]] = []

    def _held(self) -> list[tuple[str, int, int]]:
        """(worker, partition, token) of every lease pending now."""
        return [(w, p, self.ledger.token_of(p)) for p, w in self.ledger.pending.items()]

    @rule(worker=st.sampled_from(WORKERS), n=st.integers(1, 3), ahead=st.booleans())
    def lease(self, worker: str, n: int, ahead: bool) -> None:
        epoch = self.ledger.epoch + (1 if ahead else 0)
        result = self.ledger.lease(worker, epoch, n, self.now, T)
        if result.status is LeaseStatus.TASKS:
            for p in result.partitions:
                self.issued.append((worker, result.epoch, p, self.ledger.token_of(p)))
        self.ops += self.ledger.take_journal()

    @rule(dt=st.floats(0, 2 * T))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.ledger.expire(self.now)
        self.ops += self.ledger.take_journal()

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        self.ledger.renew(worker, self.now, T)

    @precondition(lambda self: self.ledger.pending)
    @rule(data=st.data(), outcome=st.sampled_from(Outcome), consumed=st.integers(1, 50))
    def honest_report(self, data: st.DataObject, outcome: Outcome, consumed: int) -> None:
        worker, p, token = data.draw(st.sampled_from(sorted(self._held())))
        verdict = apply(self.ledger, worker, self.ledger.epoch, p, token, outcome, consumed)
        assert verdict is Verdict.APPLY
        if outcome is not Outcome.PROGRESS:
            assert p not in self.ledger.pending
        self.ops += self.ledger.take_journal()

    @rule(data=st.data(), outcome=st.sampled_from(Outcome), consumed=st.integers(0, 10**9))
    def hostile_report(self, data: st.DataObject, outcome: Outcome, consumed: int) -> None:
        """A report whose sender, token, epoch or partition is wrong: never applied."""
        ledger = self.ledger
        kind = data.draw(st.sampled_from(["worker", "token", "stale", "epoch", "range"]))
        held = sorted(self._held())
        worker, p, token = data.draw(st.sampled_from(held)) if held else ("a", 0, 0)
        epoch = ledger.epoch
        if kind == "worker":  # another worker, or one that never opened the job
            worker = data.draw(st.sampled_from([w for w in WORKERS + "xz" if w != worker]))
        elif kind == "token":
            token = data.draw(st.sampled_from([0, token + 1, max(0, token - 1), 2**64 - 1]))
        elif kind == "stale":  # a lease issued earlier to anyone, in any epoch
            if not self.issued:
                return
            worker, epoch, p, token = data.draw(st.sampled_from(self.issued))
        elif kind == "epoch":
            epoch = data.draw(st.sampled_from([ledger.epoch - 1, ledger.epoch + 1, 2**63 - 1,
                                               -1, -(2**63)]))
        else:
            p = data.draw(st.sampled_from([-1, P, P + 1, 2**32 - 1]))
        # The sender is the latest holder with that lease's token: a legitimate report.
        legit = (0 <= p < P and epoch == ledger.epoch and token > 0
                 and ledger.leases.get(p) == (worker, token))
        before = snapshot(ledger)
        verdict = apply(ledger, worker, epoch, p, token, outcome, consumed)
        if legit:
            assert verdict is not Verdict.INVALID and verdict is not Verdict.REFUSE
            self.ops += ledger.take_journal()
            return
        assert verdict in (Verdict.REFUSE, Verdict.INVALID), (kind, verdict)
        if not (0 <= p < P) or not 0 <= epoch <= ledger.epoch:
            assert verdict is Verdict.INVALID
        assert snapshot(ledger) == before and not ledger.journal

    @rule(worker=st.sampled_from(WORKERS + "x"), data=st.data())
    def revoked_lists_exactly_what_is_not_the_workers(self, worker: str,
                                                      data: st.DataObject) -> None:
        claims = data.draw(st.lists(st.sampled_from(
            [(e, p, t) for _, e, p, t in self.issued] or [(0, 0, 1)]), max_size=5))
        before = snapshot(self.ledger)
        revoked = self.ledger.revoked(worker, claims)
        assert snapshot(self.ledger) == before  # pure
        for claim in claims:
            e, p, t = claim
            ledger = self.ledger
            ours = (e == ledger.epoch and ledger.leases.get(p) == (worker, t)
                    and (ledger.pending.get(p) == worker or p in ledger.done
                         or p in ledger.failed))
            assert (claim in revoked) == (not ours)

    @rule(compact=st.booleans())
    def restart(self, compact: bool) -> None:
        """A master restart: snapshot + journal replay must give every lease the same token."""
        restored = Ledger.from_state(json.loads(json.dumps(self.snapshot)))
        restored.replay(json.loads(json.dumps(self.ops)))
        assert snapshot(restored) == snapshot(self.ledger)
        restored.refresh_deadlines(self.now, T)
        self.ledger = restored
        if compact:
            self.snapshot, self.ops = restored.state(), []

    @invariant()
    def every_pending_lease_is_fenced_by_a_unique_token_of_its_holder(self) -> None:
        ledger = self.ledger
        tokens = [ledger.token_of(p) for p in ledger.pending]
        assert len(set(tokens)) == len(tokens) and all(0 < t < ledger.next_token for t in tokens)
        for p, worker in ledger.pending.items():
            assert ledger.leases[p][0] == worker

    @invariant()
    def partitions_are_in_exactly_one_place(self) -> None:
        ledger = self.ledger
        places = [*ledger.todo, *ledger.pending, *ledger.done, *ledger.failed]
        assert sorted(places) == list(range(P))


TestHostileLedgerMachine = HostileLedgerMachine.TestCase
TestHostileLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                             deadline=None)
