"""The loggers registered with the learner for both splits receive what the loop logs."""

from __future__ import annotations

import csv
import math

from ember_testing import Classifier

import ember
from ember.optim import AdamConfig
from ember.train import LearnerBuilder
from ember.train.logger import CsvMetricLogger, InMemoryMetricLogger, read_metric_log
from ember.train.metric import AccuracyMetric, LossMetric


def test_one_instance_for_both_splits_matches_the_metric_files(tmp_path, loaders, quiet):
    memory, table = InMemoryMetricLogger(), CsvMetricLogger(tmp_path / "metrics.csv")
    ember.seed(0)
    learner = (
        LearnerBuilder(tmp_path / "run")
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_loggers(train=[memory, table], valid=[memory, table])
        .devices(["cpu"])
        .num_epochs(2)
        .renderer(quiet)
        .build(Classifier(), AdamConfig().init(), 1e-2)
    )
    learner.fit(*loaders)
    assert memory.closed
    assert set(memory.values) == {"train", "valid"}
    for split, name, batches, size in (("train", "Loss", 7, 200), ("valid", "Accuracy", 3, 90)):
        for epoch in (1, 2):
            rows = read_metric_log(tmp_path / "run" / split / f"epoch-{epoch}" / f"{name}.log")
            kept = [(i, v, w) for e, i, v, w in memory.values[split][name] if e == epoch]
            assert [(v, w) for _, v, w in kept] == rows
            assert [i for i, _, _ in kept] == list(range(1, batches + 1))
            assert sum(w for _, _, w in kept) == size
        for epoch, aggregate in memory.epochs[split][name]:
            kept = [(v, w) for e, _, v, w in memory.values[split][name] if e == epoch]
            mean = math.fsum(v * w for v, w in kept) / math.fsum(w for _, w in kept)
            assert math.isclose(aggregate, mean, rel_tol=1e-5)
        assert [e for e, _ in memory.epochs[split][name]] == [1, 2]

    with open(tmp_path / "metrics.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    iterations = [
        (
            r["split"],
            int(r["epoch"]),
            int(r["iteration"]),
            r["metric"],
            float(r["value"]),
            float(r["weight"]),
        )
        for r in rows
        if r["kind"] == "iteration"
    ]
    assert sorted(iterations) == sorted(
        (split, e, i, name, v, w)
        for split, metrics in memory.values.items()
        for name, values in metrics.items()
        for e, i, v, w in values
    )
    epochs = [
        (r["split"], int(r["epoch"]), r["metric"], float(r["value"]))
        for r in rows
        if r["kind"] == "epoch"
    ]
    assert sorted(epochs) == sorted(
        (split, e, name, v)
        for split, metrics in memory.epochs.items()
        for name, values in metrics.items()
        for e, v in values
    )
