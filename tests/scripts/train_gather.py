"""Validation with whole-epoch metrics on 1 or more processes, weights left unchanged.

Usage: python train_gather.py DIR [--processes N]
The optimizer's rate is 0, so every run validates the same weights: the epoch values of
the whole-epoch metrics must not depend on how many processes share the data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from dataclasses import dataclass
from typing import Any

import torch
from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import SgdConfig
from ember.train import ClassificationOutput, LearnerBuilder
from ember.train.metric import (
    AucPrMetric,
    AurocMetric,
    BleuMetric,
    CerMetric,
    ConfusionMatrixMetric,
    DiceMetric,
    FBetaScoreMetric,
    ImageInput,
    LossMetric,
    MaeMetric,
    MccMetric,
    PrecisionMetric,
    R2Metric,
    RegressionInput,
    RmseMetric,
    RougeMetric,
    TextInput,
    WerMetric,
)
from ember.train.renderer import PlainRenderer

WORDS = ["red", "green", "blue"]


@dataclass
class ManyViews(ClassificationOutput):
    """The classifier's output also read as a regression (probabilities against one-hot
    targets) and as text (class names, three words per sample), so one run checks
    the whole-epoch metrics of every kind."""

    def adapt(self, input_type: type) -> Any:
        if input_type is RegressionInput:
            one_hot = torch.nn.functional.one_hot(self.targets, 3).float()
            return RegressionInput(self.output.softmax(-1), one_hot)
        if input_type is ImageInput:  # a segmentation of 1 x 1 images
            return ImageInput(self.output[:, :, None, None], self.targets[:, None, None])
        if input_type is TextInput:
            top2 = self.output.topk(2, dim=-1).indices.tolist()
            said = [" ".join(WORDS[i] for i in (a, a, a, a, b, a)) for a, b in top2]
            true = [" ".join([WORDS[t]] * 6) for t in self.targets.tolist()]
            return TextInput(said, true)
        return super().adapt(input_type)


class Model(Classifier):
    def valid_step(self, batch: Any) -> ManyViews:
        output = self(batch.inputs)
        loss = torch.nn.functional.cross_entropy(output, batch.targets)
        return ManyViews(loss, output, batch.targets)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    ember.seed(0)
    model = Model()
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).build(BlobDataset(64))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(16).build(BlobDataset(90, seed=4))
    learner = (
        LearnerBuilder(args.dir, overwrite=True)
        .metric_valid_numeric(AurocMetric(from_logits=True))
        .metric_valid_numeric(FBetaScoreMetric.multiclass(beta=2.0))
        .metric_valid_numeric(PrecisionMetric.multiclass(reduction="micro"))
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(MccMetric.multiclass())
        .metric_valid_numeric(AucPrMetric(from_logits=True))
        .metric_valid_numeric(ConfusionMatrixMetric.multiclass())
        .metric_valid_numeric(RmseMetric())
        .metric_valid_numeric(R2Metric())
        .metric_valid_numeric(BleuMetric())
        .metric_valid_numeric(WerMetric())
        .metric_valid_numeric(MaeMetric())
        .metric_valid_numeric(CerMetric())
        .metric_valid_numeric(RougeMetric("rougeL"))
        .metric_valid_numeric(DiceMetric())
        .devices(["cpu"] * args.processes)
        .renderer(PlainRenderer(interval=3600))
        .build(model, SgdConfig(), 0.0)
    )
    learner.fit(train, valid)
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
