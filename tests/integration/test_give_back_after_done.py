"""Work stealing never takes back a partition whose DONE is on its way (seen in CI): a reader
delivered partitions 11 and 20, queued their DONE, and the master was killed before the call that
carried it got through. The restarted master, which saw no progress on them, asked the reader to
give them back for an idle reader; the reader, having forgotten that they were started, handed
them back, and the other reader delivered them again (16 records twice).

Reproduced with a real master process frozen (SIGSTOP) while the DONE is queued or in flight, and
the master's give-back request delivered to the reader as the master pushes it (a Watch event,
applied through the session's lease book exactly as an answer's `give_back`)."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest
from sample_data import make_image_list

from trainfeed.io.load import plain_load
from trainfeed.io.prefetch import LoadedPartition
from trainfeed.lease.client import MasterClient
from trainfeed.lease.session import JOIN_CURRENT_EPOCH, Join, WorkerSession
from trainfeed.lease.tasks import LeasedTasks
from trainfeed.master.serve.process import MasterProcess
from trainfeed.reader.producer import Dataset, prefetched
from trainfeed.upload import UploadOptions, upload
from trainfeed.v1 import master_pb2 as pb

pytestmark = pytest.mark.integration


def held_task(part: LoadedPartition) -> pb.HeldTask:
    return pb.HeldTask(epoch=part.task.epoch, partition=part.task.partition,
                       lease=part.task.lease)


def test_a_lease_whose_done_is_unconfirmed_is_not_given_back(tmp_path: Path) -> None:
    source = make_image_list(tmp_path / "source", 64)
    storage = str(tmp_path / "storage")
    upload(str(source), "flowers", storage, UploadOptions(row_group_rows=8), progress=False)
    with MasterProcess(storage) as master:
        session = WorkerSession(MasterClient(master.address, give_up_s=60),
                                Join("train", "flowers")).open()
        dataset = Dataset.joined(session.opened)
        stream = prefetched(LeasedTasks(session, JOIN_CURRENT_EPOCH, lambda epoch: None),
                            dataset, plain_load, 2, "test-fetch")
        parts: list[LoadedPartition] = []
        for item in stream:
            if item is not None:
                parts.append(item)
            if len(parts) == 2:
                break
        delivered, unstarted = parts
        assert session.claim(delivered.task) is False  # the trainer got its records
        master.proc.send_signal(signal.SIGSTOP)  # the DONE cannot get through
        try:
            session.report_done(delivered.task)
            asked = session.apply(pb.WatchEvent(give_back=[held_task(delivered)]))
            assert asked.given == 0, \
                "a delivered partition whose DONE is unconfirmed was handed back"
            # The control: a lease the trainer never began is handed back.
            assert session.apply(pb.WatchEvent(give_back=[held_task(unstarted)])).given == 1
            assert session.lease_lost(unstarted.task)
            assert not session.lease_lost(delivered.task)
        finally:
            master.proc.send_signal(signal.SIGCONT)
        stream.close()
        session.close()
