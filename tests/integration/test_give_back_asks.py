"""Work stealing's asks through a real master process (issue 13), with raw clients: a holder of
every lease of a small job, an idle reader (the thief), and another reader.

- An ask for a lease its holder does not list yet is kept for the holder's next call. Seen in CI
  as a slow reader finishing 1.4 s after two idle fast ones: a reader's producer and its reporter
  call the master on two threads, so a lease granted in one answer could be asked back in the
  other before the reader had registered it; the reader ignored the ask (not its lease, as far as
  it knew), and the master did not ask again for 2 s, so the partition waited for the slow
  reader.
- The master never asks for a lease the holder's calls list as started (HeldTask.started), and an
  ask for one that started before the ask reached the holder is void.
- What the holder gives back goes to the thief, not to another reader that asks first: at an
  epoch's tail that other one may be the slowest reader (seen in the timing test of
  test_training_together.py, where the slow reader re-leased what had been taken from it)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sample_data import make_image_list

from trainfeed.lease.client import MasterClient
from trainfeed.lease.session import JOIN_CURRENT_EPOCH
from trainfeed.master.serve.process import MasterProcess
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb

pytestmark = pytest.mark.integration
Lease = tuple[int, int, int]


@pytest.fixture
def holding(tmp_path: Path) -> Iterator[tuple[MasterClient, str, list[Lease]]]:
    """A master serving 64 records in 8 partitions of 8, a client, and a holder (its worker id)
    that leased every partition, in lease order."""
    source = make_image_list(tmp_path / "source", 64)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    with MasterProcess(storage) as master, MasterClient(master.address) as client:
        holder = client.open_job("steal", "flowers", seed=0).worker_id
        leases: list[Lease] = []
        while True:  # the master grants a few per call
            granted = client.get_tasks("steal", holder, JOIN_CURRENT_EPOCH, 1000, 0,
                                       held=leases)
            leases += [(t.epoch, t.partition, t.lease) for t in granted.tasks]
            if not granted.todo_left:
                break
        assert len(leases) == 8
        yield client, holder, leases


def test_an_ask_for_a_lease_the_holder_does_not_list_yet_waits_for_its_next_call(
        holding: tuple[MasterClient, str, list[Lease]]) -> None:
    client, holder, leases = holding
    thief = client.open_job("steal", "flowers", seed=0).worker_id
    idle = client.get_tasks("steal", thief, JOIN_CURRENT_EPOCH, 1, 100, held=[])
    assert idle.status == pb.GetTasksResponse.WAIT  # and the holder is asked to give back
    # The holder's reporter calls before its producer has registered the new leases.
    listed = leases[:1]
    early = client.report("steal", holder, held=listed)
    asked_early = {(t.epoch, t.partition, t.lease) for t in early.give_back}
    assert asked_early <= set(listed), "asked back a lease the holder did not know it had"
    # Its next call lists them all: the asks arrive now, not 2 s later.
    later = client.report("steal", holder, held=leases)
    asked = asked_early | {(t.epoch, t.partition, t.lease) for t in later.give_back}
    # Readers of unknown speed count alike: the idle one takes the later half of the holder's
    # unstarted leases (it would finish those before the holder gets to them).
    assert asked == set(leases[4:])


def test_a_lease_given_back_goes_to_its_thief_and_a_started_one_is_never_asked_for(
        holding: tuple[MasterClient, str, list[Lease]]) -> None:
    client, holder, leases = holding
    thief = client.open_job("steal", "flowers", seed=0).worker_id
    other = client.open_job("steal", "flowers", seed=0).worker_id
    # Its trainer began the last one it leased (shuffled readers may start any of them).
    client.report("steal", holder, held=leases, started={leases[-1]})
    idle = client.get_tasks("steal", thief, JOIN_CURRENT_EPOCH, 8, 0, held=[])
    assert idle.status == pb.GetTasksResponse.WAIT
    # The thief (speeds unknown: alike) is to get the 3 latest unstarted leases, each of which
    # it finishes before the holder would get to it. Before the ask reaches the holder, its
    # trainer begins one of them: that ask is void.
    begun = {leases[-1], leases[-2]}
    asked = {(t.epoch, t.partition, t.lease)
             for t in client.report("steal", holder, held=leases, started=begun).give_back}
    assert asked == {leases[-3], leases[-4]}
    released = [pb.TaskReport(epoch=e, partition=p, outcome=pb.TaskReport.RELEASED, lease=t)
                for e, p, t in sorted(asked)]
    kept = [lease for lease in leases if lease not in asked]
    client.report("steal", holder, released, held=kept, started=begun)
    # Another reader asking first does not get them (they are the thief's)...
    first = client.get_tasks("steal", other, JOIN_CURRENT_EPOCH, 8, 0, held=[])
    assert first.status == pb.GetTasksResponse.WAIT and not first.tasks
    # ... the thief does, and nothing else.
    mine = client.get_tasks("steal", thief, JOIN_CURRENT_EPOCH, 8, 0, held=[])
    assert {t.partition for t in mine.tasks} == {p for _, p, _ in asked}
    # Neither started lease is ever asked for, whoever is idle.
    later = client.report("steal", holder, held=kept, started=begun)
    assert not {(t.epoch, t.partition, t.lease) for t in later.give_back} & begun
