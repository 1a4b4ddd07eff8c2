"""Training a sharded model on two CPU processes (FSDP, gloo), then evaluating and
predicting with it on both: driven by tests/test_fsdp_evaluate.py in a subprocess.

Usage: python evaluate_fsdp.py DIR

Every process trains two epochs (checkpoints written in shards), then calls
`learner.evaluate("holdout", valid)` on the validation loader the fit used,
`learner.predict(valid)` and `learner.predict(tiny)` (one batch: the second process
has none and runs a stand-in), and saves what it got as DIR/rank-R.json and
DIR/rank-R-predictions.mpk; rank 0 saves the trained weights as DIR/final.mpk.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, BlobDataset
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Block(nn.Module):
    def __init__(self, inputs: int, outputs: int):
        super().__init__()
        self.linear = nn.Linear(inputs, outputs)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(8, 16), Block(16, 16))
        self.head = nn.Linear(16, 3)

    def classify(self, batch):  # the submodules, called directly
        logits = self.head(self.blocks(batch.inputs))
        return ClassificationOutput(F.cross_entropy(logits, batch.targets), logits, batch.targets)

    def train_step(self, batch):
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch):
        return self.classify(batch)

    def predict_step(self, batch):
        logits = self.head(self.blocks(batch.inputs))
        return {"logits": logits, "labels": logits.argmax(dim=1)}


def loaders():
    batcher = BlobBatcher()
    train = DataLoaderBuilder(batcher).batch_size(16).shuffle(3).build(BlobDataset(96))
    valid = DataLoaderBuilder(batcher).batch_size(8).build(BlobDataset(53, seed=1))
    tiny = torch.utils.data.DataLoader(
        BlobDataset(5, seed=2), batch_size=8, collate_fn=batcher.batch
    )  # one batch
    return train, valid, tiny


def main(directory: str) -> None:
    torch.set_num_threads(1)
    ember.seed(3)
    train, valid, tiny = loaders()
    learner = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .devices(["cpu", "cpu"], strategy="fsdp", modules=[Block], sharded_checkpoints=True)
        .num_epochs(2)
        .renderer(PlainRenderer(interval=3600))
        .build(Model(), AdamConfig().init(), 1e-2)
    )
    learner.fit(train, valid)
    state = learner.model_state_dict()
    values = learner.evaluate("holdout", valid)
    predicted = learner.predict(valid)
    few = learner.predict(tiny)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(directory)
    if rank == 0:
        DefaultRecorder().save(state, out / "final", kind="module")
    (out / f"rank-{rank}.json").write_text(json.dumps(values))
    tree = {"logits": predicted["logits"], "labels": predicted["labels"], "few": few["logits"]}
    DefaultRecorder().save(tree, out / f"rank-{rank}-predictions", kind="state")
    sys.exit(learner.exit_code)


if __name__ == "__main__":
    main(sys.argv[1])
