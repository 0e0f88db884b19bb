from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainfeed.cluster.progress import Sample, partition_rate, render, sample_twice
from trainfeed.v1 import master_pb2 as pb


def status(epoch: int, done: int, failed: int = 0, partitions: int = 10,
           reasons: tuple[str, ...] = ()) -> pb.JobStatus:
    return pb.JobStatus(job="resnet", dataset="flowers", epoch=epoch, num_partitions=partitions,
                        todo=partitions - done - failed, pending=0, done=done, failed=failed,
                        workers=3, failed_reasons=list(reasons))


def test_rate_counts_partitions_across_an_epoch_boundary() -> None:
    first, second = Sample(100.0, status(0, 8)), Sample(102.0, status(1, 2))
    assert partition_rate(first, second) == 2.0  # 2 to end epoch 0, 2 into epoch 1
    assert partition_rate(first, Sample(100.0, status(0, 9))) == 0.0  # no time passed


@given(epoch=st.integers(0, 50), done=st.integers(0, 20), more=st.integers(0, 200),
       seconds=st.floats(0.01, 100))
def test_rate_is_partitions_finished_over_time(epoch: int, done: int, more: int,
                                               seconds: float) -> None:
    partitions = 20
    first = Sample(0.0, status(epoch, done, partitions=partitions))
    finished = epoch * partitions + done + more
    later = status(finished // partitions, finished % partitions, partitions=partitions)
    rate = partition_rate(first, Sample(seconds, later))
    assert abs(rate * seconds - more) < 1e-6 * max(1, more)


def test_two_samples_an_interval_apart() -> None:
    answers = iter([status(0, 1), status(0, 3)])
    slept: list[float] = []
    first, second = sample_twice(lambda: next(answers), 0.5, sleep=slept.append)
    assert slept == [0.5] and (first.status.done, second.status.done) == (1, 3)
    assert second.at >= first.at


def test_render_counts_rate_records_and_bar() -> None:
    lines = render(status(3, 6, failed=1, reasons=("partition 4: bad shard",)), 2.0, 1000.0)
    text = "\n".join(lines)
    assert "job         resnet (dataset flowers)" in text
    assert "epoch       3" in text
    assert "partitions  todo 3 · pending 0 · done 6 · failed 1  (of 10)" in text
    assert "workers     3" in text
    assert "rate        2.00 partitions/s · 1,000 records/s" in text
    bar = next(line for line in lines if line.startswith("epoch 3:"))
    assert "70%" in bar and "7/10 partitions" in bar and "00:01 left" in bar
    assert "failed      partition 4: bad shard" in text


def test_render_before_anything_finished() -> None:
    text = "\n".join(render(status(0, 0), 0.0, 0.0))
    assert "0.00 partitions/s · 0 records/s" in text
    assert "0/10 partitions [? left]" in text


def test_record_rate_from_the_masters_count_and_a_restart() -> None:
    from trainfeed.cluster.progress import Sample, record_rate

    first, second = status(0, 1), status(0, 3)
    first.records_served, second.records_served = 100, 400
    assert record_rate(Sample(10.0, first), Sample(12.0, second)) == 150.0
    second.records_served = 20  # the master restarted: its count began again
    assert record_rate(Sample(10.0, first), Sample(12.0, second)) == 0.0


def test_failed_reasons_are_capped() -> None:
    reasons = tuple(f"partition {i}: x" for i in range(8))
    lines = render(status(0, 0, failed=8, reasons=reasons), 0.0, 0.0)
    assert sum(line.startswith("failed ") for line in lines) == 6
    assert lines[-1] == "failed      … and 3 more"
