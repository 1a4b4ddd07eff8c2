"""InMemoryMetricLogger keeps every value and aggregate, per split and metric."""

from __future__ import annotations

from logger_driver import METRICS, drive

from ember.train.logger import InMemoryMetricLogger, MetricLogger, MetricRecord


def test_holds_every_iteration_and_epoch_value_by_split_and_metric():
    logger = InMemoryMetricLogger()
    assert isinstance(logger, MetricLogger)
    expected = drive(logger)
    assert logger.closed
    for split in ("train", "valid"):
        assert set(logger.values[split]) == set(METRICS)
        for name in METRICS:
            assert logger.values[split][name] == [
                (e, i, v, w)
                for s, e, i, n, v, w, _ in expected.iterations
                if (s, n) == (split, name)
            ]
            assert logger.epochs[split][name] == expected.epoch_series(split, name)
            assert logger.series(split, name) == [v for _, v in expected.series(split, name)]
    assert logger.series("test", "Loss") == []


def test_keeps_logging_after_close_and_clear_forgets():
    logger = InMemoryMetricLogger()
    logger.log("train", 1, [MetricRecord("Loss", 1, 0.5, 2.0)])
    logger.close()
    logger.log("train", 2, [MetricRecord("Loss", 1, 0.25, 2.0)])
    assert logger.values == {"train": {"Loss": [(1, 1, 0.5, 2.0), (2, 1, 0.25, 2.0)]}}
    logger.clear()
    assert (logger.values, logger.epochs, logger.closed) == ({}, {}, False)
