"""A slow little training run for driving the renderers from outside (tmux, pipes, ptys).

    python tests/renderer/tui_script.py ARTIFACT_DIR [--renderer default|tui|plain]
        [--epochs 6] [--sleep 0.02] [--persistent] [--checkpoint]

Prints `renderer <ClassName>` first, then trains a small MLP on Gaussian blobs. In the
first epoch it also prints a line and logs a warning, as a user's own code would.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ember_testing

from ember_testing import Batch, Classifier

from ember.optim import AdamConfig
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer, TuiRenderer, default_renderer

USER_PRINT = "user print from train_step"
USER_WARNING = "user warning from train_step"


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

    builder = (
        LearnerBuilder(args.artifact_dir, overwrite=True)
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .num_epochs(args.epochs)
        .renderer(renderer)
    )
    if args.checkpoint:
        from ember.record import CompactRecorder

        builder = builder.with_file_checkpointer(CompactRecorder())
    learner = builder.build(Blobs(args.sleep), AdamConfig().init(), 1e-2)
    learner.fit(blobs(args.batches, seed=1), blobs(max(1, args.batches // 4), seed=2))
    print("training script finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
