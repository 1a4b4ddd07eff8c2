"""Hamming score against scikit-learn; perplexity against an epoch-wide cross-entropy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import hamming_loss

from ember.train.metric.hamming import HammingScoreMetric
from ember.train.metric.inputs import SequenceInput
from ember.train.metric.perplexity import PerplexityMetric
from ember.train.output import MultiLabelClassificationOutput, SequenceOutput

SIZES = [32, 32, 32, 7]
N = sum(SIZES)
ZERO = torch.tensor(0.0)


@pytest.mark.parametrize("threshold", [0.5, 0.2])
def test_hamming_score(drive, threshold):
    g = torch.Generator().manual_seed(30)
    scores = torch.rand(N, 6, generator=g)
    targets = (torch.rand(N, 6, generator=g) < 0.3).float()
    outputs = [
        MultiLabelClassificationOutput(ZERO, x, y)
        for x, y in zip(scores.split(SIZES), targets.split(SIZES))
    ]
    value, values = drive(HammingScoreMetric(threshold), outputs)
    predicted = (scores > threshold).long().numpy()
    expected = 100.0 * (1.0 - hamming_loss(targets.long().numpy(), predicted))
    assert value == pytest.approx(expected, rel=1e-5)
    assert [int(v.weight) for v in values] == SIZES


def _sequences(seed: int, pad: int | None, vocab: int = 11, length: int = 9):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(N, length, vocab, generator=g) * 2
    targets = torch.randint(0, vocab, (N, length), generator=g)
    if pad is not None:
        # Uneven padding per sequence, so batch means differ from token means.
        lengths = torch.randint(1, length + 1, (N,), generator=g)
        targets[torch.arange(length).unsqueeze(0) >= lengths.unsqueeze(1)] = pad
    return logits, targets


@pytest.mark.parametrize("pad", [None, 0, -100])
def test_perplexity(drive, pad):
    logits, targets = _sequences(31, pad)
    outputs = [
        SequenceOutput(ZERO, x, y, pad_token=pad)
        for x, y in zip(logits.split(SIZES), targets.split(SIZES))
    ]
    warmup_logits, warmup_targets = _sequences(32, pad)
    warmup = [SequenceOutput(ZERO, warmup_logits[:16], warmup_targets[:16], pad_token=pad)]
    value, values = drive(PerplexityMetric(), outputs, warmup=warmup)
    vocab = logits.shape[-1]
    ignore = -100 if pad is None else pad
    nll = F.cross_entropy(
        logits.reshape(-1, vocab).double(), targets.reshape(-1), ignore_index=ignore
    )
    assert value == pytest.approx(math.exp(float(nll)), rel=1e-5)
    first = F.cross_entropy(
        logits[:32].reshape(-1, vocab), targets[:32].reshape(-1), ignore_index=ignore
    )
    assert float(values[0].value) == pytest.approx(math.exp(float(first)), rel=1e-5)
    assert sum(int(v.weight) for v in values) == int((targets != ignore).sum())


def test_perplexity_own_pad_token_overrides(drive):
    logits, targets = _sequences(33, 0)
    items = [SequenceInput(x, y) for x, y in zip(logits.split(SIZES), targets.split(SIZES))]
    value, _ = drive(PerplexityMetric(pad_token=0), items)
    nll = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1), ignore_index=0
    )
    assert value == pytest.approx(math.exp(float(nll)), rel=1e-5)


def test_perplexity_empty_epoch_is_nan():
    metric = PerplexityMetric()
    metric.clear()
    assert math.isnan(float(metric.epoch_value()))
