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

from ember_testing import BlobBatcher, BlobDataset, Classifier

import ember
from ember.data import DataLoaderBuilder
from ember.optim import SgdConfig
from ember.train import LearnerBuilder
from ember.train.metric import AurocMetric, FBetaScoreMetric, LossMetric, PrecisionMetric
from ember.train.renderer import PlainRenderer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    ember.seed(0)
    model = Classifier()
    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).build(BlobDataset(64))
    valid = DataLoaderBuilder(BlobBatcher()).batch_size(16).build(BlobDataset(90, seed=4))
    learner = (
        LearnerBuilder(args.dir, overwrite=True)
        .metric_valid_numeric(AurocMetric(from_logits=True))
        .metric_valid_numeric(FBetaScoreMetric.multiclass(beta=2.0))
        .metric_valid_numeric(PrecisionMetric.multiclass(reduction="micro"))
        .metric_valid_numeric(LossMetric())
        .devices(["cpu"] * args.processes)
        .renderer(PlainRenderer(interval=3600))
        .build(model, SgdConfig(), 0.0)
    )
    learner.fit(train, valid)
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
