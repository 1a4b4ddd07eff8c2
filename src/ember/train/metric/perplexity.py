"""Perplexity of a sequence model, exact over the epoch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ember.errors import TrainingError
from ember.train.metric._common import (
    FirstBatch,
    dims,
    dtype_name,
    is_integral,
    resolve_pad,
    wide_float,
)
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import SequenceInput


class PerplexityMetric:
    """exp of the mean token negative log-likelihood, padding tokens left out.

    The iteration value is the batch's perplexity, weighted by its token count. The
    epoch value is exp(total NLL / total tokens) over the epoch, which a mean of batch
    perplexities would not give. It costs one cross-entropy over the batch's logits.

    Reads logits [B, T, V] and integer token ids [B, T] (or any logits [..., V] with
    targets of their leading shape). Shapes are checked at every update, the token
    ids (within [0, V), padding aside) on the first batch of every epoch.
    """

    name = "Perplexity"
    unit = ""
    higher_is_better = False
    input_type = SequenceInput

    def __init__(self, pad_token: int | None = None) -> None:
        self.pad_token = pad_token
        self._nll: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None
        self._checks = FirstBatch()

    def update(self, input: SequenceInput, meta: MetricMetadata) -> MetricValue:
        logits = input.logits.detach()
        _check_shapes(logits, input.targets)
        targets = input.targets.reshape(-1).long()  # cross_entropy reads int64 ids
        pad = resolve_pad(self.pad_token, input.pad_token)
        ignore = -100 if pad is None else pad  # -100: cross_entropy's own default
        if self._checks.due:
            _check_ids(self._checks, targets, logits.shape, ignore)
        self._checks.verify()
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
        self._checks.reset()

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


_WHO = "PerplexityMetric"
_EXPECTS = "logits [B, T, V] and token-id targets [B, T]"


def _check_shapes(logits: torch.Tensor, targets: torch.Tensor) -> None:
    shaped = logits.dim() >= 2 and logits.shape[-1] != 0 and targets.shape == logits.shape[:-1]
    if shaped and is_integral(targets):
        return  # the common case, checked without building any message
    got = f"got logits {dims(logits.shape)} and targets {dims(targets.shape)}"
    if logits.dim() < 2 or logits.shape[-1] == 0:
        raise TrainingError(
            f"{_WHO} reads {_EXPECTS}; {got}: the logits need a last dimension of one "
            "score per token of the vocabulary."
        )
    if targets.shape != logits.shape[:-1]:
        if targets.shape == logits.shape:
            fix = (
                "these look like one-hot (or probability) targets: pass token ids "
                "(targets.argmax(dim=-1))"
            )
        else:
            leading = dims(logits.shape[:-1])
            fix = f"the targets need the logits' shape without its last dimension, {leading}"
        raise TrainingError(f"{_WHO} reads {_EXPECTS}; {got}: {fix}.")
    if not is_integral(targets):
        raise TrainingError(
            f"{_WHO} reads {_EXPECTS}; {got} of dtype {dtype_name(targets)}: "
            "token ids are integers, pass targets.long()."
        )


def _check_ids(checks: FirstBatch, targets: torch.Tensor, shape: torch.Size, ignore: int) -> None:
    """A first-batch check: token ids in [0, V) for logits [..., V], the ignored
    (padding) id aside."""
    vocab = int(shape[-1])
    outside = ((targets < 0) | (targets >= vocab)) & (targets != ignore)

    def message() -> str:
        values = targets[targets != ignore].long()
        low, high = int(values.min()), int(values.max())
        return (
            f"{_WHO} reads token ids in [0, {vocab}) for logits {dims(shape)} ({vocab} "
            f"tokens); a batch holds targets from {low} to {high}. Give the model one logit "
            "per token of the vocabulary, or, if some targets are padding, name the padding "
            "id with pad_token."
        )

    checks.add(outside.any(), message)
