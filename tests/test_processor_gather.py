"""Under several processes, the records rank 0 receives from the other ranks carry
their true iteration numbers (every exchange, including after a resume mid-epoch)."""

from __future__ import annotations

from ember.train.logger import InMemoryMetricLogger
from ember.train.metric.base import MetricValue, RegisteredMetric
from ember.train.processor import MetricsProcessor


class Value:
    """A metric whose value is the step output itself (a float), weight 2."""

    name = "Value"
    unit = ""
    input_type = float

    def update(self, item, meta):
        return MetricValue(item, 2.0)

    def clear(self):
        pass


class Rank:
    """Stands in for `Distributed`: `all_gather` returns this rank's payload at its place
    among the other ranks' (given), and keeps what this rank sent."""

    def __init__(self, rank: int, others: list):
        self.rank, self.main, self.others, self.sent = rank, rank == 0, others, []

    def all_gather(self, payload):
        self.sent.append(payload)
        everyone = list(self.others.pop(0))
        everyone.insert(self.rank, payload)
        return everyone

    def broadcast(self, value):
        return value


def processor(tick: float) -> tuple[MetricsProcessor, InMemoryMetricLogger]:
    memory = InMemoryMetricLogger()
    metrics = {"train": [RegisteredMetric(Value(), True)]}
    return MetricsProcessor(metrics, {"train": [memory]}, None, 3, tick=tick, gathers=True), memory


def test_a_rank_sends_each_row_with_its_iteration_after_ticks_and_a_resume():
    proc, _ = processor(tick=0.0)  # a tick at every update: records drained one by one
    proc.start_split("train", 2, 10, first_iteration=4)  # resumed after iteration 3
    rank = Rank(1, [[(0, {})], [(0, {})]])
    for iteration in (4, 5, 6):
        proc.update(float(iteration), iteration, 8, None)
    proc.update(7.0, 7, 8, None)
    proc.tick = 3600.0
    proc._next_tick = float("inf")  # iteration 8 waits for the exchange
    proc.update(8.0, 8, 8, None)
    proc.flush(rank)  # a stop: the ranks exchange what they have
    proc.update(9.0, 9, 8, None)
    proc.end_split(rank)
    sent = [payload["Value"] for _, payload in rank.sent]
    assert sent == [
        [(4, 4.0, 2.0), (5, 5.0, 2.0), (6, 6.0, 2.0), (7, 7.0, 2.0), (8, 8.0, 2.0)],
        [(9, 9.0, 2.0)],
    ]


def test_rank_0_logs_the_other_ranks_records_at_their_iterations():
    proc, memory = processor(tick=3600.0)
    proc.start_split("train", 1, 10, first_iteration=6)
    others = [
        [(8, {"Value": [(6, 0.5, 2.0), (7, 0.25, 2.0)]})],
        [(8, {"Value": [(8, 0.125, 2.0)]})],
    ]
    rank = Rank(0, others)
    proc.update(6.0, 6, 8, None)
    proc.update(7.0, 7, 8, None)
    proc.flush(rank)
    proc.update(8.0, 8, 8, None)
    values = proc.end_split(rank)
    assert memory.values["train"]["Value"] == [
        (1, 6, 6.0, 2.0),
        (1, 7, 7.0, 2.0),
        (1, 6, 0.5, 2.0),
        (1, 7, 0.25, 2.0),
        (1, 8, 8.0, 2.0),
        (1, 8, 0.125, 2.0),
    ]
    assert values["Value"] == (6 + 7 + 8 + 0.5 + 0.25 + 0.125) / 6
