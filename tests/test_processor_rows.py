"""A tick's rows reach the loggers, the files and the epoch value exactly, whatever
mix of values the metrics return: host numbers with per-row scale and divisor, tensors,
text values, integer and fractional weights."""

from __future__ import annotations

import math

import pytest
import torch

from ember.train.files.metric_files import add_lines, format_line
from ember.train.logger.base import MetricRecord
from ember.train.metric.base import MetricValue, RegisteredMetric
from ember.train.processor import MetricsProcessor


class Scripted:
    """A metric returning, at each update, the next `MetricValue` of its script."""

    unit = ""
    input_type = float

    def __init__(self, name: str, script: list[MetricValue]):
        self.name, self.script = name, list(script)

    def update(self, item, meta):
        return self.script.pop(0)

    def clear(self):
        pass


class Capture:
    """A metric logger keeping the records it receives, as received."""

    def __init__(self):
        self.records: list = []

    def log(self, split, epoch, records):
        self.records += records

    def end_epoch(self, split, epoch, aggregates):
        pass


def run(script: list[MetricValue], numeric: bool = True) -> tuple[list, float | None, object]:
    memory = Capture()
    metric = Scripted("M", script)
    proc = MetricsProcessor(
        {"train": [RegisteredMetric(metric, numeric)]}, {"train": [memory]}, None, 1, tick=3600
    )
    proc.start_split("train", 1, len(script))
    for iteration in range(1, len(script) + 1):
        proc.update(0.0, iteration, 8, None)
    aggregates = proc.end_split()
    state = proc.states["train"][0]
    return memory.records, aggregates.get("M"), state.last


def records_of(records):
    assert all(type(record) is MetricRecord and record.name == "M" for record in records)
    assert all(type(record.value) is float and type(record.weight) is float for record in records)
    return [(record.iteration, record.value, record.weight) for record in records]


def test_scale_and_divisor_apply_row_by_row_as_one_rounding():
    script = [
        MetricValue(7, 8, scale=100.0, divisor=8),
        MetricValue(torch.tensor(3), 4, scale=100.0, divisor=4),
        MetricValue(torch.tensor(0.1, dtype=torch.float64), 3, divisor=3.0),
        MetricValue(2.5, torch.tensor(2)),
    ]
    rows, epoch, last = run(script)
    assert records_of(rows) == [
        (1, 700.0 / 8, 8.0),
        (2, 300.0 / 4, 4.0),
        (3, 0.1 / 3.0, 3.0),
        (4, 2.5, 2.0),
    ]
    values = [700.0 / 8, 75.0, 0.1 / 3.0, 2.5]
    weights = [8.0, 4.0, 3.0, 2.0]
    assert epoch == math.fsum(v * w for v, w in zip(values, weights)) / sum(weights)
    assert last == 2.5


def test_text_values_are_shown_not_counted_and_keep_their_order():
    script = [MetricValue(1.0, 1), MetricValue("n/a", 1), MetricValue(3.0, 1), MetricValue("x", 1)]
    rows, epoch, last = run(script, numeric=False)
    assert records_of(rows) == [(1, 1.0, 1.0), (3, 3.0, 1.0)]
    assert epoch == 2.0
    assert last == "x"  # the last value shown is the last one returned


def test_lines_of_interleaved_metrics_and_mixed_weights():
    records = [
        MetricRecord("A", 1, 0.5, 8.0),
        MetricRecord("A", 2, 1.0 / 3.0, 2.5),
        MetricRecord("B", 1, 2.0, 3),
        MetricRecord("A", 3, float("nan"), 1.0),
        MetricRecord("B", 2, float("inf"), float("inf")),
    ]
    first = format_line(0.25, 4)
    lines = add_lines({"A": [first]}, records)
    bodies = {name: [line.rsplit(",", 1)[0] for line in text] for name, text in lines.items()}
    assert bodies == {
        "A": ["0.25,4", "0.5,8", f"{1.0 / 3.0!r},2.5", "nan,1"],
        "B": ["2.0,3", "inf,inf"],
    }
    # each line's check chains on the one before it (the file's first: on nothing)
    second = format_line(0.5, 8.0, int(first.rsplit(",", 1)[1], 16))
    third = format_line(1.0 / 3.0, 2.5, int(second.rsplit(",", 1)[1], 16))
    assert lines["A"][1:3] == [second, third]
    assert lines["B"][0] == format_line(2.0, 3)


@pytest.mark.parametrize("weight", [4, 4.0, torch.tensor(4)])
def test_an_integer_weight_is_written_as_an_integer_whatever_its_type(weight):
    rows, _, _ = run([MetricValue(0.75, weight)])
    assert add_lines({}, rows) == {"M": [format_line(0.75, 4)]}
