"""Stopping a run mid-epoch (SIGTERM, the interrupter) and resuming it is exact."""

from __future__ import annotations

import pytest
import torch
from ember_testing import (
    Batch,
    BlobBatcher,
    BlobDataset,
    Classifier,
    assert_same_state,
    final_weights,
    stopped_and_resumed,
)

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder, load
from ember.train import LearnerBuilder, ProcessedItem
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer


@pytest.mark.parametrize(
    "options",
    [(), ("--workers", "2"), ("--accumulation", "3")],
    ids=["plain", "workers", "accumulation"],
)
def test_sigterm_mid_epoch_then_resume_latest_equals_an_uninterrupted_run(
    tmp_path, options, request
):
    reference = None if options else request.getfixturevalue("blob_straight")
    straight, resumed = stopped_and_resumed(tmp_path, *options, straight=reference)
    assert_same_state(final_weights(straight), final_weights(resumed))
    # the resumed epoch's logs continue where they stopped: same lines as the straight run
    for split, name in (("train", "Loss.log"), ("train", "Accuracy.log"), ("valid", "Loss.log")):
        for epoch in (1, 2, 3):
            assert read_metric_log(straight / split / f"epoch-{epoch}" / name) == read_metric_log(
                resumed / split / f"epoch-{epoch}" / name
            ), (
                split,
                epoch,
                name,
            )


@pytest.mark.slow
def test_a_run_with_an_ema_resumes_exactly_its_weights_its_ema_and_its_gradient_norms(tmp_path):
    """EMA (validating on the averaged weights) and GradNormMetric keep their state in the
    checkpoint: a run stopped by SIGTERM mid-epoch and resumed ends like one never stopped."""
    straight, resumed = stopped_and_resumed(tmp_path, "--ema")
    for name in ("final", "ema"):
        assert_same_state(final_weights(straight, name), final_weights(resumed, name))
    ema, final = final_weights(straight, "ema"), final_weights(straight)
    assert not all(torch.equal(ema[key], final[key]) for key in final)  # an average, not a copy
    for split, name in (("train", "Grad_Norm.log"), ("valid", "Loss.log")):
        for epoch in (1, 2, 3):
            lines = read_metric_log(straight / split / f"epoch-{epoch}" / name)
            assert lines and lines == read_metric_log(resumed / split / f"epoch-{epoch}" / name), (
                split,
                epoch,
                name,
            )


class DoubleBatcher:
    """Blob batches in double precision."""

    def batch(self, items):
        batch = BlobBatcher().batch(items)
        return Batch(batch.inputs.double(), batch.targets)


class StopAt:
    def __init__(self, interrupter, epoch: int, iteration: int) -> None:
        self.interrupter, self.at = interrupter, (epoch, iteration)

    def on_event(self, event) -> None:
        train = isinstance(event, ProcessedItem) and event.split == "train"
        if train and (event.epoch, event.iteration) == self.at:
            self.interrupter.stop("stopped mid-epoch")


def double_run(directory, *, stop: bool = False, resume: bool = False):
    ember.seed(5)
    train = DataLoaderBuilder(DoubleBatcher()).batch_size(16).shuffle(3).build(BlobDataset(160))
    valid = DataLoaderBuilder(DoubleBatcher()).batch_size(32).build(BlobDataset(64, seed=1))
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(2)
        .renderer(PlainRenderer(interval=3600))
    )
    if resume:
        builder = builder.checkpoint("latest")
    if stop:
        builder = builder.listener(StopAt(builder.interrupter(), 2, 4))
    learner = builder.build(Classifier().double(), AdamConfig().init(), 1e-2)
    return learner.fit(train, valid), learner


def test_a_double_precision_run_resumes_exactly(tmp_path, one_thread):
    """DefaultRecorder keeps float64 weights float64 ("full" never narrows), so a
    double-precision run stopped mid-epoch and resumed ends as one never stopped."""
    straight, _ = double_run(tmp_path / "straight")
    _, first = double_run(tmp_path / "resumed", stop=True)
    assert first.outcome == "stopped: stopped mid-epoch"
    checkpoint = next((tmp_path / "resumed" / "checkpoint").glob("model-*.mpk"))
    assert load(None, checkpoint)["net.0.weight"].dtype == torch.float64
    resumed, second = double_run(tmp_path / "resumed", resume=True)
    assert second.outcome == "completed"
    assert next(resumed.parameters()).dtype == torch.float64
    assert_same_state(straight.state_dict(), resumed.state_dict())
