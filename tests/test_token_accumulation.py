"""Losses that are means over tokens: accumulated and several-process gradients equal
the gradient of one batch's token mean, and the loss metric reports the token mean."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.optim import SgdConfig
from ember.train import LearnerBuilder, SequenceOutput, TrainOutput
from ember.train.logger.file import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer.silent import SilentRenderer

PAD = -100


@dataclass
class Sequences:
    tokens: torch.Tensor  # [B, T], padded with 0
    targets: torch.Tensor  # [B, T], padded with PAD


class PadBatcher:
    def batch(self, items):
        length = max(len(tokens) for tokens, _ in items)
        tokens = torch.zeros(len(items), length, dtype=torch.long)
        targets = torch.full((len(items), length), PAD, dtype=torch.long)
        for row, (x, y) in enumerate(items):
            tokens[row, : len(x)], targets[row, : len(y)] = x, y
        return Sequences(tokens, targets)


def sequences(count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences of 1 to 16 tokens: lengths vary a lot from batch to batch."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        length = int(torch.randint(1, 17, (), generator=generator))
        tokens = torch.randint(0, 12, (length,), generator=generator)
        rows.append((tokens, (tokens * 5 + 1) % 12))
    return rows


class TokenModel(nn.Module):
    def __init__(self, reduction: str = "token_mean"):
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.out = nn.Linear(8, 12)
        self.reduction = reduction

    def predict(self, batch: Sequences) -> SequenceOutput:
        logits = self.out(torch.tanh(self.embed(batch.tokens)))
        loss = F.cross_entropy(logits.transpose(1, 2), batch.targets, ignore_index=PAD)
        tokens = (batch.targets != PAD).sum()
        return SequenceOutput(
            loss, logits, batch.targets, PAD, loss_reduction=self.reduction, tokens=tokens
        )

    def train_step(self, batch):
        return TrainOutput(self.predict(batch))

    def valid_step(self, batch):
        return self.predict(batch)


def train(directory, batch: int, accumulation: int, reduction: str = "token_mean"):
    ember.seed(0)
    model = TokenModel(reduction)
    loader = DataLoaderBuilder(PadBatcher()).batch_size(batch).build(sequences(64, 1))
    valid = DataLoaderBuilder(PadBatcher()).batch_size(8).build(sequences(24, 2))
    learner = (
        LearnerBuilder(directory)
        .grads_accumulation(accumulation)
        .metric_valid_numeric(LossMetric())
        .metric_train_numeric(LossMetric())
        .num_epochs(2)
        .renderer(SilentRenderer())
        .build(model, SgdConfig().init(), 0.5)
    )
    learner.fit(loader, valid)
    return model, learner


def test_accumulated_token_means_equal_one_batch(tmp_path):
    accumulated, _ = train(tmp_path / "accumulated", 4, 4)
    whole, learner = train(tmp_path / "whole", 16, 1)
    for (name, a), b in zip(accumulated.named_parameters(), whole.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    # The validation loss is the mean over every token, computed here on its own.
    whole.eval()
    loader = DataLoaderBuilder(PadBatcher()).batch_size(24).build(sequences(24, 2))
    with torch.no_grad():
        expected = float(whole.predict(next(iter(loader))).loss)
    assert math.isclose(learner.history[-1][1]["valid"]["Loss"], expected, rel_tol=1e-6)
    rows = read_metric_log(tmp_path / "whole" / "valid" / "epoch-2" / "Loss.log")
    assert [weight for _, weight in rows] == [
        sum(len(y) for _, y in sequences(24, 2)[i : i + 8]) for i in (0, 8, 16)
    ]  # each batch weighs its tokens


def test_per_sample_means_do_not_give_the_token_mean(tmp_path):
    """The check above can fail: per-sample weighting of the same losses differs."""
    accumulated, _ = train(tmp_path / "accumulated", 4, 4, reduction="mean")
    whole, _ = train(tmp_path / "whole", 16, 1, reduction="mean")
    gap = max((a - b).abs().max() for a, b in zip(accumulated.parameters(), whole.parameters()))
    assert gap > 1e-4


def test_token_mean_without_tokens_is_refused(tmp_path):
    class NoTokens(TokenModel):
        def train_step(self, batch):
            output = self.predict(batch)
            output.tokens = None
            return TrainOutput(output)

    loader = DataLoaderBuilder(PadBatcher()).batch_size(4).build(sequences(8, 1))
    learner = (
        LearnerBuilder(tmp_path)
        .renderer(SilentRenderer())
        .build(NoTokens(), SgdConfig().init(), 0.5)
    )
    with pytest.raises(
        ember.TrainingError, match=r"loss_reduction='token_mean' but gives no tokens"
    ):
        learner.fit(loader)


def test_token_means_with_a_step_that_runs_backward_under_accumulation_are_refused(tmp_path):
    class OwnBackward(TokenModel):
        def train_step(self, batch, ctx):
            output = self.predict(batch)
            ctx.backward(output.loss)
            ctx.step("sgd")
            return TrainOutput(output)

    model = OwnBackward()
    loader = DataLoaderBuilder(PadBatcher()).batch_size(4).build(sequences(8, 1))
    learner = (
        LearnerBuilder(tmp_path)
        .grads_accumulation(2)
        .renderer(SilentRenderer())
        .build(model, {"sgd": SgdConfig().init()}, 0.5)
    )
    with pytest.raises(ember.TrainingError, match=r"cannot be weighted by them"):
        learner.fit(loader)
