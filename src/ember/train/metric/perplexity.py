"""Perplexity of a sequence model, exact over the epoch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ember.train.metric._common import resolve_pad, wide_float
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import SequenceInput


class PerplexityMetric:
    """exp of the mean token negative log-likelihood, padding tokens left out.

    The iteration value is the batch's perplexity, weighted by its token count. The
    epoch value is exp(total NLL / total tokens) over the epoch, which a mean of batch
    perplexities would not give. It costs one cross-entropy over the batch's logits.
    """

    name = "Perplexity"
    unit = ""
    higher_is_better = False
    input_type = SequenceInput

    def __init__(self, pad_token: int | None = None) -> None:
        self.pad_token = pad_token
        self._nll: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None

    def update(self, input: SequenceInput, meta: MetricMetadata) -> MetricValue:
        logits = input.logits.detach()
        targets = input.targets.reshape(-1)
        pad = resolve_pad(self.pad_token, input.pad_token)
        ignore = -100 if pad is None else pad  # -100: cross_entropy's own default
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets,
            ignore_index=ignore,
            reduction="sum",
        )
        tokens = (targets != ignore).sum()
        wide = wide_float(nll.device)
        if self._nll is None or self._tokens is None:
            self._nll, self._tokens = nll.to(wide), tokens
        else:
            self._nll, self._tokens = self._nll + nll.to(wide), self._tokens + tokens
        return MetricValue(torch.exp(nll / tokens.clamp(min=1)), tokens)

    def epoch_value(self) -> torch.Tensor | float:
        """exp(total NLL / total tokens) since the last `clear()`."""
        if self._nll is None or self._tokens is None:
            return math.nan
        return torch.exp(self._nll / self._tokens.clamp(min=1))

    def clear(self) -> None:
        self._nll = self._tokens = None

    def epoch_state(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This process's summed NLL and token count (exchanged across processes)."""
        if self._nll is None or self._tokens is None:
            return None
        return self._nll.cpu(), self._tokens.cpu()

    def merge_epoch_states(self, states: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Add other processes' sums, so `epoch_value` covers every token."""
        for state in states:
            if state is None:
                continue
            nll, tokens = state
            if self._nll is None or self._tokens is None:
                self._nll, self._tokens = nll, tokens
            else:
                self._nll = self._nll + nll.to(self._nll.device, self._nll.dtype)
                self._tokens = self._tokens + tokens.to(self._tokens.device)
