"""A small GAN on 2-D points: two optimizers in one Learner (custom optimization).

Run `python examples/gan/train.py ARTIFACT_DIR [--epochs 6] [--resume]`.

The real data are points of a tilted Gaussian in the plane. A generator turns noise
into points, a discriminator tells real points from generated ones, and each has its
own optimizer: `build(model, {"gen": ..., "disc": ...}, {"gen": ..., "disc": ...})`.
The model's `train_step(batch, ctx)` runs the two backward passes and the two steps
through `ctx`, so ember still accumulates, clips, checkpoints both optimizers and
their schedules, and resumes exactly. An `EMA` of the weights follows the generator's
steps, and `GradNormMetric("disc")` logs the discriminator's gradient norm.

Writes, besides the usual artifacts: `final.mpk` (the trained model), `ema.mpk` (the
model with the EMA weights) and `results.json` (how far the generated points' mean
and spread are from the real ones, before and after training). Trains in seconds on
a CPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.lr import CosineAnnealingLrSchedulerConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder, TrainOutput
from ember.train.callbacks import EMA
from ember.train.metric import GradNormMetric, MetricMetadata, MetricValue
from ember.train.renderer import PlainRenderer

LATENT = 4
MEAN = torch.tensor([2.0, -1.0])
MIXING = torch.tensor([[0.8, 0.0], [0.5, 0.3]])  # real points: MEAN + MIXING @ noise


def real_points(count: int, seed: int) -> torch.Tensor:
    noise = torch.randn(count, 2, generator=torch.Generator().manual_seed(seed))
    return MEAN + noise @ MIXING.T


@dataclass
class GanOutput:
    """What a step reports: both losses (detached) and the generated batch."""

    disc_loss: torch.Tensor
    gen_loss: torch.Tensor
    fake: torch.Tensor
    real: torch.Tensor


class Gan(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.generator = nn.Sequential(
            nn.Linear(LATENT, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 2),
        )  # fmt: skip
        self.discriminator = nn.Sequential(
            nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1),
        )  # fmt: skip

    def sample(self, count: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return self.generator(torch.randn(count, LATENT, device=device))

    def _losses(self, real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, ...]:
        on_real = self.discriminator(real)
        on_fake = self.discriminator(fake.detach())
        disc = F.binary_cross_entropy_with_logits(
            on_real, torch.ones_like(on_real)
        ) + F.binary_cross_entropy_with_logits(on_fake, torch.zeros_like(on_fake))
        return (disc,)

    def train_step(self, real: torch.Tensor, ctx) -> TrainOutput:
        fake = self.sample(real.shape[0], real.device)
        (disc_loss,) = self._losses(real, fake)
        ctx.backward(disc_loss, "disc")  # gradients into the discriminator only
        ctx.step("disc")
        on_fake = self.discriminator(fake)  # the discriminator just stepped
        gen_loss = F.binary_cross_entropy_with_logits(on_fake, torch.ones_like(on_fake))
        ctx.backward(gen_loss, "gen")  # gradients into the generator only
        ctx.step("gen")
        output = GanOutput(disc_loss.detach(), gen_loss.detach(), fake.detach(), real)
        return TrainOutput(output, loss=gen_loss.detach())

    def valid_step(self, real: torch.Tensor) -> GanOutput:
        fake = self.sample(real.shape[0], real.device)
        (disc_loss,) = self._losses(real, fake)
        on_fake = self.discriminator(fake)
        gen_loss = F.binary_cross_entropy_with_logits(on_fake, torch.ones_like(on_fake))
        return GanOutput(disc_loss, gen_loss, fake, real)


class GanLossMetric:
    """One of the two losses, per sample."""

    unit = ""
    higher_is_better = None
    input_type = GanOutput

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = f"Loss {part}"

    def update(self, input: GanOutput, meta: MetricMetadata) -> MetricValue:
        loss = input.disc_loss if self.part == "disc" else input.gen_loss
        return MetricValue(loss, input.real.shape[0])

    def clear(self) -> None:
        pass


class MeanGapMetric:
    """How far the generated batch's mean is from the real batch's (lower is better)."""

    name = "Mean Gap"
    unit = ""
    higher_is_better = False
    input_type = GanOutput

    def update(self, input: GanOutput, meta: MetricMetadata) -> MetricValue:
        gap = torch.linalg.vector_norm(input.fake.mean(0) - input.real.mean(0))
        return MetricValue(gap, input.real.shape[0])

    def clear(self) -> None:
        pass


def gaps(model: Gan, count: int = 4096) -> dict[str, float]:
    """The distance of the generated points' mean and covariance from the real ones."""
    with torch.no_grad():
        points = model.sample(count)
    covariance = MIXING @ MIXING.T
    return {
        "mean_gap": float(torch.linalg.vector_norm(points.mean(0) - MEAN)),
        "covariance_gap": float(torch.linalg.matrix_norm(torch.cov(points.T) - covariance)),
    }


def main(argv: list[str] | None = None, make_model: Callable[[], Gan] = Gan) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact_dir")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)

    ember.seed(args.seed)
    train = DataLoaderBuilder().batch_size(64).shuffle(args.seed).build(real_points(2048, 0))
    valid = DataLoaderBuilder().batch_size(256).build(real_points(512, 1))
    model = make_model()
    before = gaps(model)

    ema = EMA(decay=0.99, optimizer="gen")
    builder = (
        LearnerBuilder(args.artifact_dir)
        .metric_train_numeric(GanLossMetric("disc"))
        .metric_train_numeric(GanLossMetric("gen"))
        .metric_train_numeric(GradNormMetric("disc"))
        .metric_valid_numeric(MeanGapMetric())
        .callback(ema)
        .with_file_checkpointer(DefaultRecorder())
        .grads_accumulation(args.accumulation)
        .num_epochs(args.epochs)
        .renderer(PlainRenderer())
    )
    if args.resume:
        builder = builder.checkpoint("latest")
    optimizers = {
        "gen": torch.optim.Adam(model.generator.parameters(), betas=(0.5, 0.999)),
        "disc": torch.optim.Adam(model.discriminator.parameters(), betas=(0.5, 0.999)),
    }
    # The generator's rate decays over the run (a cosine); the discriminator's is constant.
    rates = {
        "gen": CosineAnnealingLrSchedulerConfig(initial_lr=2e-3, num_iters="auto"),
        "disc": 2e-3,
    }
    learner = builder.build(model, optimizers, rates)
    model = learner.fit(train, valid)
    if learner.outcome != "completed":
        return learner.exit_code

    directory = Path(args.artifact_dir)
    recorder = DefaultRecorder()
    recorder.save(model, directory / "final")
    averaged = ema.copy_to(copy.deepcopy(model))
    recorder.save(averaged, directory / "ema")
    results = {"before": before, "after": gaps(model), "ema": gaps(averaged)}
    (directory / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results))
    return learner.exit_code


if __name__ == "__main__":
    sys.exit(main())
