"""TensorBoardMetricLogger: scalars read back with TensorBoard's own event reader."""

from __future__ import annotations

import sys

import pytest

# Imported at the top on purpose: with tensorboard missing this module fails, not skips.
import tensorboard  # noqa: F401
from ember_testing import read_scalars
from logger_driver import EPOCHS, METRICS, drive

from ember.errors import EmberError
from ember.train.logger import MetricLogger, MetricRecord, TensorBoardMetricLogger


def assert_series(found: list[tuple[int, float]], wanted: list[tuple[int, float]]) -> None:
    assert [step for step, _ in found] == [step for step, _ in wanted]
    assert [value for _, value in found] == pytest.approx(
        [value for _, value in wanted],
        rel=1e-6,  # stored as float32
    )


def test_scalars_have_split_tags_global_steps_and_epoch_steps(tmp_path):
    logger = TensorBoardMetricLogger(tmp_path / "tb")
    assert isinstance(logger, MetricLogger)
    expected = drive(logger)
    scalars = read_scalars(tmp_path / "tb")
    assert set(scalars) == {
        f"{split}/{kind}{name}"
        for split in ("train", "valid")
        for kind in ("", "epoch/")
        for name in METRICS
    }
    for split in ("train", "valid"):
        for name in METRICS:
            assert_series(scalars[f"{split}/{name}"], expected.series(split, name))
            assert_series(scalars[f"{split}/epoch/{name}"], expected.epoch_series(split, name))
    # Global steps run on across epochs: 5 train iterations per epoch, then 3 valid.
    assert [s for s, _ in scalars["train/Loss"]] == list(range(1, 5 * len(EPOCHS) + 1))
    assert [s for s, _ in scalars["valid/Loss"]] == list(range(1, 3 * len(EPOCHS) + 1))


def test_epoch_values_are_on_disk_after_end_epoch(tmp_path):
    logger = TensorBoardMetricLogger(tmp_path)
    logger.log("train", 1, [MetricRecord("Loss", 1, 2.0, 1.0), MetricRecord("Loss", 2, 1.0, 1.0)])
    logger.end_epoch("train", 1, {"Loss": 1.5})
    logger.log("train", 2, [MetricRecord("Loss", 1, 0.5, 1.0)])  # no end_epoch seen yet
    logger.end_epoch("train", 2, {"Loss": 0.5})
    scalars = read_scalars(tmp_path)
    assert scalars["train/Loss"] == [(1, 2.0), (2, 1.0), (3, 0.5)]
    assert scalars["train/epoch/Loss"] == [(1, 1.5), (2, 0.5)]
    logger.close()


def test_missing_tensorboard_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    hint = r"pip install tensorboard.*pip install ember\[tensorboard\]"
    with pytest.raises(EmberError, match=hint):
        TensorBoardMetricLogger(tmp_path)
