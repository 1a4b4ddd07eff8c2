"""Checks before the first optimizer step: what cannot work fails in seconds, and
leaves the run untouched (the model's state, the random generators, the directory)."""

from __future__ import annotations

import copy
import logging
from typing import Any, Iterable

import torch

from ember.data.device import to_device
from ember.errors import TrainingError
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.processor import MetricsProcessor
from ember.train.step import call_step

log = logging.getLogger(__name__)


def check_not_empty(loader: Iterable[Any], what: str, fix: str) -> None:
    """A loader whose length is 0 is refused before anything starts."""
    try:
        empty = len(loader) == 0  # type: ignore[arg-type]
    except TypeError:
        return  # no length: an empty one is found at its first epoch
    if empty:
        raise TrainingError(
            f"The {what} data loader is empty (0 batches): give it data (check the dataset, "
            f"and drop_last with a batch size larger than the dataset), or call {fix}."
        )


def model_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model for a check that must leave the live one untouched: its
    modules, buffers and attributes are copied, its parameters shared (a check under
    inference mode does not change them, and a second copy of the weights would raise
    the run's peak memory by the model's size); the live model itself when it cannot
    be copied."""
    shared: dict[int, Any] = {id(parameter): parameter for parameter in model.parameters()}
    try:
        return copy.deepcopy(model, shared)
    except Exception:
        log.warning(
            "%s cannot be copied: the validation check before training runs on the live model.",
            type(model).__name__,
        )
        return model


def check_validation(
    model: torch.nn.Module,
    loader: Iterable[Any],
    processor: MetricsProcessor,
    epoch: int,
    device: torch.device,
    autocast: Any,
    evaluation: Any = torch.inference_mode,
) -> None:
    """Run one validation batch before training, so that a valid_step or a validation
    metric that cannot work fails now, not after an epoch. It runs on a copy of the
    model, so state the model keeps across batches is untouched; RNGs are put back.
    `evaluation` is the context validation runs in; a sharded model, which cannot be
    copied, runs it under `torch.no_grad` on the live model."""
    rng = capture_rng_state()
    model = model if evaluation is torch.no_grad else model_copy(model)
    try:
        model.eval()
        hook = getattr(model, "on_split_start", None)
        if callable(hook):
            hook("valid")
        with evaluation(), autocast():
            for batch in loader:
                item = call_step(model.valid_step, to_device(batch, device), "valid_step", 0, 1)
                processor.check("valid", item, epoch)
                break
    finally:
        model.train()
        restore_rng_state(rng)
