"""The input types metrics read, produced from model outputs by `adapt`."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossInput:
    """A scalar loss and the number of samples it covers. `reduction` says how the step
    reduced it over them: "mean" (the default of torch's losses) or "sum" (a loss
    function called with `reduction="sum"`); `LossMetric` reports the per-sample mean
    either way. `tokens` is the number of tokens the step processed (an int or a
    tensor), when the step reports it: what `ThroughputMetric("tokens")` counts."""

    loss: torch.Tensor
    batch_size: int
    reduction: str = "mean"
    tokens: int | torch.Tensor | None = None


@dataclass
class ClassificationInput:
    """Scores or logits [N, C] (or binary scores [N]) and class indices [N]."""

    output: torch.Tensor
    targets: torch.Tensor
    pad_token: int | None = None


@dataclass
class MultiLabelInput:
    """Scores [N, C] and 0/1 targets [N, C]."""

    output: torch.Tensor
    targets: torch.Tensor


@dataclass
class RegressionInput:
    """Predictions and targets of the same shape."""

    output: torch.Tensor
    targets: torch.Tensor


@dataclass
class SequenceInput:
    """Logits [B, T, V], token ids [B, T] and an optional padding token."""

    logits: torch.Tensor
    targets: torch.Tensor
    pad_token: int | None = None


@dataclass
class ScoresInput:
    """Scores and targets for ranking metrics such as AUROC, single- or multi-label.

    Single-label: scores [N] / [N, C] and class indices [N]; multi-label
    (`multilabel=True`): scores [N, C] and 0/1 targets [N, C].
    """

    output: torch.Tensor
    targets: torch.Tensor
    multilabel: bool = False
    pad_token: int | None = None


@dataclass
class TextInput:
    """Generated texts and their references, one pair per sample, as strings."""

    predictions: list[str]
    references: list[str]


@dataclass
class ImageInput:
    """Predicted images and target images [N, C, H, W] (or, for segmentation, class
    scores [N, C, H, W] and class-index targets [N, H, W])."""

    output: torch.Tensor
    targets: torch.Tensor
