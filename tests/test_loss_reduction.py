"""A summed loss reported per sample, a summed loss detected, and a batch that tells
its number of items."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from ember_testing import Batch, Classifier
from torch import nn

from ember.optim import AdamConfig
from ember.train import ClassificationOutput, LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.logger.file import read_metric_log
from ember.train.metric import LossMetric


class SummedRegressor(nn.Module):
    """Regresses the inputs' sum with a summed squared error, as a VAE sums its loss."""

    def __init__(self, say_sum: bool):
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.say_sum = say_sum

    def regress(self, batch: Batch) -> RegressionOutput:
        output = self.layer(batch.inputs).squeeze(1)
        targets = batch.inputs.sum(dim=1)
        loss = F.mse_loss(output, targets, reduction="sum")
        reduction = "sum" if self.say_sum else "mean"
        return RegressionOutput(loss, output, targets, loss_reduction=reduction)

    def train_step(self, batch):
        return TrainOutput(self.regress(batch))

    def valid_step(self, batch):
        return self.regress(batch)


def test_a_summed_loss_is_reported_per_sample(tmp_path, loaders, quiet):
    torch.manual_seed(0)
    model = SummedRegressor(say_sum=True)
    learner = (
        LearnerBuilder(tmp_path)
        .metric_valid_numeric(LossMetric())
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-3)
    )
    learner.fit(*loaders)
    # The plain computation: the mean squared error per sample over the validation set.
    model.eval()
    with torch.no_grad():
        total = sum(float(model.regress(batch).loss) for batch in loaders[1])
    samples = sum(len(batch.targets) for batch in loaders[1])
    reported = learner.history[-1][1]["valid"]["Loss"]
    assert math.isclose(reported, total / samples, rel_tol=1e-6)
    first = read_metric_log(tmp_path / "valid" / "epoch-1" / "Loss.log")[0]
    assert first[1] == 32  # each line is one batch's per-sample mean, weighted by its size


def test_a_loss_that_looks_summed_is_pointed_out(tmp_path, loaders, quiet):
    class SumsCrossEntropy(Classifier):
        def train_step(self, batch):
            logits = self(batch.inputs)
            loss = F.cross_entropy(logits, batch.targets, reduction="sum")
            return TrainOutput(ClassificationOutput(loss, logits, batch.targets))

    LearnerBuilder(tmp_path).metric_train_numeric(LossMetric()).renderer(quiet).build(
        SumsCrossEntropy(), AdamConfig().init(), 1e-3
    ).fit(loaders[0])
    log = (tmp_path / "experiment.log").read_text()
    assert "is 32 times the batch's mean loss: it looks summed" in log
    assert "loss_reduction='sum'" in log


@dataclass
class TimeMajor:
    """A [T, B] sequence batch: its first dimension is time, not items."""

    steps: torch.Tensor  # [T, B, 8]
    targets: torch.Tensor  # [B]

    @property
    def num_items(self) -> int:
        return int(self.targets.shape[0])


class TimeMajorClassifier(Classifier):
    def train_step(self, batch: TimeMajor):
        return super().train_step(Batch(batch.steps.mean(dim=0), batch.targets))


class TimeMajorBatcher:
    def batch(self, items):
        inputs = torch.stack([x for x, _ in items])
        return TimeMajor(inputs.unsqueeze(0).repeat(5, 1, 1), torch.tensor([y for _, y in items]))


def test_a_batch_that_tells_its_items_is_counted_by_them(tmp_path, blobs, quiet):
    from ember.data import DataLoaderBuilder

    loader = DataLoaderBuilder(TimeMajorBatcher()).batch_size(32).build(blobs[0])
    LearnerBuilder(tmp_path).metric_train_numeric(LossMetric()).renderer(quiet).build(
        TimeMajorClassifier(), AdamConfig().init(), 1e-3
    ).fit(loader)
    assert "7 iterations, 200 items" in quiet.stream_text.getvalue()  # not 7 x 5 time steps
