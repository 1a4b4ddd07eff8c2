"""Small helpers shared by the metric implementations."""

from __future__ import annotations

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.metric.base import MetricValue


def wide_float(device: torch.device) -> torch.dtype:
    """The float type for epoch totals: float64 where the device has it (not on MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def resolve_pad(own: int | None, given: int | None) -> int | None:
    """The metric's own padding token wins over the one the output carries."""
    return own if own is not None else given


def percent_correct(correct: torch.Tensor, mask: torch.Tensor | None = None) -> MetricValue:
    """The share of True in `correct` in percent, counting only where `mask` is True.

    Without a mask the value is the exact count of correct predictions and the
    percentage is taken on the host in float64 (`MetricValue.scale` and `divisor`,
    correctly rounded: 10 of 11 is exactly 1000 / 11). With one, the
    number of samples counted lives on the device, so the division happens there, in
    float64 where the device has it.
    """
    if mask is None:
        n = int(correct.numel())
        return MetricValue(correct.sum(), n, scale=100.0, divisor=max(n, 1))
    count = mask.sum()
    dtype = wide_float(count.device)
    hits = (correct & mask).sum().to(dtype)
    return MetricValue(hits * 100.0 / count.clamp(min=1).to(dtype), count)


class Probabilities:
    """Reads the scores of a binary or multi-label metric as probabilities.

    With `from_logits=True` the scores are logits and a sigmoid turns them into
    probabilities. Otherwise they must already lie in [0, 1]: thresholding logits at
    0.5 would silently move the decision to a probability of about 0.62. The range is
    checked on the first batch after each `reset()` (metrics reset it in `clear()`, at
    the start of every epoch), which reads one boolean from the device per epoch
    rather than one per step; a model whose outputs are logits fails on its first
    batch, before the first optimizer step.
    """

    def __init__(self, from_logits: bool, owner: str) -> None:
        if not isinstance(from_logits, bool):
            raise ConfigError(f"{owner}: from_logits must be True or False, got {from_logits!r}.")
        self.from_logits = from_logits
        self.owner = owner
        self._checked = False

    def reset(self) -> None:
        """Check the range again on the next batch."""
        self._checked = False

    def __call__(
        self, scores: torch.Tensor, metric: str, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`scores` as probabilities: their sigmoid (in at least float32) with
        `from_logits`, else the scores themselves once their range is checked. Rows
        where `keep` [N] is False (padding) are left out of the check."""
        if self.from_logits:
            if scores.dtype in (torch.float16, torch.bfloat16):
                scores = scores.float()  # half precision would round most probabilities
            return scores.sigmoid()
        if not self._checked:
            check_probabilities(scores, metric, self.owner, keep)
            self._checked = True
        return scores


def check_probabilities(
    scores: torch.Tensor, metric: str, owner: str, keep: torch.Tensor | None = None
) -> None:
    """Raise a `TrainingError` naming `from_logits=True` when `scores` hold values
    outside [0, 1] (rows where `keep` [N] is False aside). Reads one boolean from the
    device."""
    outside = (scores < 0) | (scores > 1)
    if keep is not None:
        outside = outside & keep.reshape(keep.shape + (1,) * (outside.dim() - keep.dim()))
    if not bool(outside.any()):
        return
    low, high = float(scores.min()), float(scores.max())
    raise TrainingError(
        f"{metric} reads probabilities in [0, 1], but a batch holds scores from {low:.4g} "
        f"to {high:.4g}: the outputs look like logits (as for BCEWithLogitsLoss). Pass "
        f"from_logits=True to {owner} to apply a sigmoid, or give it probabilities."
    )
