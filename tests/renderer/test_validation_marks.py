"""Validations inside epochs (`valid_every`) as the live views show them: marked where
they ran on the dashboard's chart and the notebook's charts, and named with their epoch
and iteration wherever their values are shown."""

from __future__ import annotations

import re

from ember.train.logger.base import MetricRecord
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.htmlview import page, plain
from ember.train.renderer.panels import dashboard
from ember.train.renderer.state import RunTracker


def tracked() -> RunTracker:
    """Epoch 1 of 2 (8 training batches): a point after 4 batches, the epoch's end,
    then 2 batches of epoch 2."""
    tracker = RunTracker()
    metrics = (("train", "Loss", "", True), ("valid", "Loss", "", True))
    tracker.start(RunInfo("run", 1, 2, "Net", 10, ("cpu",), metrics))
    train = [MetricView("train", "Loss", "", True, 0.9, 0.95)]
    records = [MetricRecord("Loss", i, 1.0 - 0.05 * i, 1.0) for i in range(1, 5)]
    tracker.update(Progress("train", 1, 2, 4, 8, 64, 1.0), train, records)
    point = [MetricView("valid", "Loss", "", True, 0.61, 0.625)]
    tracker.valid_point(4, Progress("valid", 1, 2, 2, 2, 32, 0.1), point)
    records = [MetricRecord("Loss", i, 1.0 - 0.05 * i, 1.0) for i in range(5, 9)]
    tracker.update(Progress("train", 1, 2, 8, 8, 128, 2.0), train, records)
    tracker.end_split(Progress("train", 1, 2, 8, 8, 128, 2.0), train)
    end = [*train, MetricView("valid", "Loss", "", True, 0.5, 0.5125)]
    tracker.update(Progress("valid", 1, 2, 2, 2, 32, 0.1), end, [])
    tracker.end_split(Progress("valid", 1, 2, 2, 2, 32, 0.1), end)
    records = [MetricRecord("Loss", i, 0.5, 1.0) for i in range(1, 3)]
    tracker.update(Progress("train", 2, 2, 2, 8, 32, 0.2), end, records)
    return tracker


def test_the_dashboard_marks_each_validation_and_names_the_latest():
    tracker = tracked()
    snapshot = tracker.snapshot("Loss")
    assert [(x, v) for x, v, _ in snapshot.validations] == [(0.5, 0.625), (1.0, 0.5125)]
    lines = ["".join(t for t, _ in line) for line in dashboard(snapshot, 120, 40)]
    text = "\n".join(lines)
    assert "● valid (epoch 1) 0.5125" in text and "train (epoch 2)" in text
    (head,) = [line for line in lines if line.startswith("│   metric ")]
    assert "train last" in head and "train (epoch 2)" in head and "valid (epoch 1)" in head
    chart = [line for line in lines if "┤" in line or line.startswith("│         │")]
    assert sum(line.count("●") for line in chart) == 2, text


def test_the_notebook_marks_points_as_diamonds_and_names_them():
    tracker = tracked()
    html = page(tracker.snapshot(), {"Loss": tracker.series("Loss")})
    diamonds = re.findall(r"<path d=\"M[^\"]+Z\"><title>([^<]+)</title>", html)
    assert diamonds == ["valid (epoch 1, iteration 4): 0.6250"]
    assert ">valid (epoch 1)</th>" in html and ">0.5125</td>" in html
    text = plain(tracker.snapshot())
    assert "valid (epoch 1)" in text.splitlines()[2] and "0.5125" in text
