"""A slow little training run for driving the renderers from outside (tmux, pipes, ptys).

    python tests/renderer/tui_script.py ARTIFACT_DIR [--renderer default|tui|plain]
        [--epochs 6] [--sleep 0.02] [--persistent] [--checkpoint] [--many-metrics]
        [--valid-every N] [--valid-batches N]

Prints `renderer <ClassName>` first, then trains a small MLP on Gaussian blobs. In the
first epoch it also prints a line and logs a warning, as a user's own code would.
`--many-metrics` registers the seven metrics of `MANY_METRICS` instead of the loss and
the accuracy; `--valid-every N` validates every N training batches inside the epochs
as well (`LearnerBuilder.valid_every`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from ember_testing import Batch, Classifier

from ember.optim import AdamConfig
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import (
    AccuracyMetric,
    ClassificationInput,
    IterationSpeedMetric,
    LearningRateMetric,
    LossMetric,
    MetricMetadata,
    MetricValue,
    TopKAccuracyMetric,
)
from ember.train.renderer import PlainRenderer, TuiRenderer, default_renderer

USER_PRINT = "user print from train_step"
USER_WARNING = "user warning from train_step"
MANY_METRICS = {
    "Loss": ("train", "valid"),
    "Accuracy": ("train", "valid"),
    "Learning Rate": ("train",),
    "Top-2 Accuracy": ("train", "valid"),
    "Confidence": ("train", "valid"),
    "Entropy": ("train", "valid"),
    "Iteration Speed": ("train",),
}
"""`--many-metrics`: each metric's name and splits, in the order the table shows them."""


class ConfidenceMetric:
    """The mean probability of the predicted class, in percent."""

    name = "Confidence"
    unit = "%"
    input_type = ClassificationInput

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        probabilities = input.output.detach().softmax(dim=-1)
        return MetricValue(probabilities.max(dim=-1).values.mean() * 100, len(input.targets))

    def clear(self) -> None:
        pass


class EntropyMetric:
    """The mean entropy of the predicted distributions, in nats."""

    name = "Entropy"
    input_type = ClassificationInput

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        logs = input.output.detach().log_softmax(dim=-1)
        entropy = -(logs.exp() * logs).sum(dim=-1)
        return MetricValue(entropy.mean(), len(input.targets))

    def clear(self) -> None:
        pass


def many_metrics(split: str, names: Sequence[str] = tuple(MANY_METRICS)) -> list:
    """The metrics of `MANY_METRICS` among `names` that `split` has, in their order."""
    made = {
        "Loss": LossMetric,
        "Accuracy": AccuracyMetric,
        "Learning Rate": LearningRateMetric,
        "Top-2 Accuracy": lambda: TopKAccuracyMetric(2),
        "Confidence": ConfidenceMetric,
        "Entropy": EntropyMetric,
        "Iteration Speed": IterationSpeedMetric,
    }
    return [
        made[name]() for name, splits in MANY_METRICS.items() if split in splits and name in names
    ]


class Blobs(Classifier):
    """Linear(8, 16), ReLU, Linear(16, 3) that sleeps in each step, and prints and logs
    a warning in its fifth training step."""

    def __init__(self, sleep: float) -> None:
        super().__init__(dropout=0.0)
        self.sleep = sleep
        self.steps = 0

    def train_step(self, batch: Batch) -> TrainOutput:
        self.steps += 1
        if self.steps == 5:
            print(USER_PRINT)
            logging.getLogger("user").warning(USER_WARNING)
        time.sleep(self.sleep)
        return super().train_step(batch)

    def valid_step(self, batch: Batch) -> ClassificationOutput:
        time.sleep(self.sleep / 2)
        return super().valid_step(batch)


def blobs(count: int, seed: int, size: int = 16) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, 8, generator=torch.Generator().manual_seed(99)) * 3
    out = []
    for _ in range(count):
        targets = torch.randint(0, 3, (size,), generator=generator)
        out.append(Batch(centres[targets] + torch.randn(size, 8, generator=generator), targets))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact_dir")
    parser.add_argument("--renderer", choices=("default", "tui", "plain"), default="default")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--checkpoint", action="store_true")
    parser.add_argument("--many-metrics", action="store_true")
    parser.add_argument("--valid-every", type=int, default=0)
    parser.add_argument("--valid-batches", type=int, default=0)
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s"
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.renderer == "tui":
        renderer = TuiRenderer()
    elif args.renderer == "plain":
        renderer = PlainRenderer()
    else:
        renderer = default_renderer()
    if args.persistent and isinstance(renderer, TuiRenderer):
        renderer = renderer.persistent()
    print(f"renderer {type(renderer).__name__}", flush=True)

    builder = LearnerBuilder(args.artifact_dir, overwrite=True)
    if args.many_metrics:
        for metric in many_metrics("train"):
            builder = builder.metric_train_numeric(metric)
        for metric in many_metrics("valid"):
            builder = builder.metric_valid_numeric(metric)
    else:
        builder = (
            builder.metric_train_numeric(LossMetric())
            .metric_train_numeric(AccuracyMetric())
            .metric_valid_numeric(LossMetric())
            .metric_valid_numeric(AccuracyMetric())
        )
    builder = builder.num_epochs(args.epochs).renderer(renderer)
    if args.valid_every:
        builder = builder.valid_every(args.valid_every)
    if args.checkpoint:
        from ember.record import CompactRecorder

        builder = builder.with_file_checkpointer(CompactRecorder())
    learner = builder.build(Blobs(args.sleep), AdamConfig().init(), 1e-2)
    valid_batches = args.valid_batches or max(1, args.batches // 4)
    learner.fit(blobs(args.batches, seed=1), blobs(valid_batches, seed=2))
    print("training script finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
