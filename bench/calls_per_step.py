"""Python function calls per training step of the Learner, counted by cProfile.

    PYTHONPATH=src python bench/calls_per_step.py

A count, not a time: a busy machine does not move it, so two trees (or a change with
and without an option) compare directly. The Learner trains a Linear(32, 10) with
Accuracy and Loss on 40, then 120 pre-built batches; the difference of the two call
counts divided by 80 is the calls of one step (what is done once per run cancels
out). Metric flushes happen on a clock (every 0.1 s), so the figure varies by a call
or two between runs.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 10)

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> TrainOutput:
        inputs, targets = batch
        logits = self.layer(inputs)
        return TrainOutput(ClassificationOutput(F.cross_entropy(logits, targets), logits, targets))


def calls(batches: int) -> int:
    """Every Python call of one `fit` over `batches` batches of 64."""
    generator = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(64, 32, generator=generator), torch.randint(0, 10, (64,), generator=generator))
        for _ in range(batches)
    ]
    model = Linear()
    learner = (
        LearnerBuilder(tempfile.mkdtemp())
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
        .build(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.1)
    )
    profile = cProfile.Profile()
    profile.enable()
    learner.fit(data)
    profile.disable()
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


def main() -> None:
    torch.set_num_threads(1)
    small, large = calls(40), calls(120)
    print(f"Python calls per training step: {(large - small) / 80:.1f}")


if __name__ == "__main__":
    main()
