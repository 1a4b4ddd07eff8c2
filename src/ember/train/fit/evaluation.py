"""The one evaluation pass: a model's step over a loader's batches, in eval mode,
under inference mode (or `no_grad` for a sharded model) and the run's autocast, with
every output going to a metrics processor. Validation at an epoch's end, validation
points, the pre-flight check of the validation step and the `Evaluator` all run it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch

from ember.data.device import to_device
from ember.errors import TrainingError
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.length.epoch_plan import StandIn
from ember.train.length.loader_view import own_count
from ember.train.processor import MetricsProcessor
from ember.train.step import call_step, start_split

log = logging.getLogger("ember.train.fit")


@dataclass
class Pass:
    """What a pass saw: its samples and batches, and whether a stop cut it short."""

    items: int = 0
    batches: int = 0
    stopped: bool = False


@contextlib.contextmanager
def evaluating(
    model: torch.nn.Module,
    evaluation: Callable[[], Any] = torch.inference_mode,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    after: bool | None = None,
    split: str | None = None,
) -> Iterator[None]:
    """The model in eval mode under `evaluation` and `autocast`; afterwards in train
    mode (`after` True), in eval mode (False), or as it was (None). With `split`, the
    model is told that split starts (`on_split_start`) once in eval mode, before
    `evaluation` begins, as validation tells it."""
    training = model.training if after is None else after
    model.eval()
    try:
        if split is not None:
            start_split(model, split)
        with evaluation(), autocast():
            yield
    finally:
        model.train(training)


def run_pass(
    step: Callable[[Any], Any],
    step_name: str,
    batches: Iterable[Any],
    processor: MetricsProcessor,
    split: str,
    epoch: int,
    device: torch.device,
    *,
    check: bool = False,
    only_check: bool = False,
    each: Callable[[int, Any], None] | None = None,
    stop: Callable[[], bool] | None = None,
    count: Callable[[Any], int] = own_count,
    tokens: bool = False,
) -> Pass:
    """Run `step` on every batch (moved to `device`) and update the metrics with its
    output (a stand-in's is not counted); `check`: the first output is checked
    against the metrics first (with `only_check`, that is all: one batch, no update);
    `each` is told of every batch (its number and output); `stop` is asked after each;
    `count` gives each batch's items (the loader's count, `EpochPlan.count`); `tokens`:
    the processor counts each batch's tokens too (`batch_tokens`)."""
    move = device.type != "cpu"
    seen = Pass()
    for iteration, batch in enumerate(batches, start=1):
        stand_in = type(batch) is StandIn  # only to join the others' gathers (FSDP)
        if stand_in:
            batch = batch.batch
        told = getattr(batch, "num_tokens", None) if tokens else None
        if move:
            batch = to_device(batch, device)
        item = call_step(step, batch, step_name, epoch, iteration)
        if stand_in:
            continue
        if check and iteration == 1:
            processor.check(split, item, epoch)
            if only_check:
                seen.batches = 1
                break
        size = count(batch)
        processor.update(item, iteration, size, None)
        if tokens:
            processor.count_tokens(batch_tokens(told, item))
        seen.items, seen.batches = seen.items + size, iteration
        if each is not None:
            each(iteration, item)
        if stop is not None and stop():
            seen.stopped = True
            break
    return seen


def batch_tokens(told: Any, item: Any) -> int | torch.Tensor | None:
    """The tokens of an evaluated batch, as training counts them: the batch's
    `num_tokens` (an int), else its output's `tokens` (an int or a tensor); None when
    neither tells."""
    if isinstance(told, int) and not isinstance(told, bool):
        return told
    found = getattr(item, "tokens", None)
    if isinstance(found, torch.Tensor) or (isinstance(found, int) and not isinstance(found, bool)):
        return found
    return None


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


def model_copy(
    model: torch.nn.Module,
    otherwise: str = "the validation check before training runs on the live model",
) -> torch.nn.Module:
    """A copy of the model for a check that must leave the live one untouched: its
    modules, buffers and attributes are copied, its parameters shared (a check under
    inference mode does not change them, and a second copy of the weights would raise
    the run's peak memory by the model's size); the live model itself when it cannot
    be copied (a warning then says what happens `otherwise`)."""
    shared: dict[int, Any] = {id(parameter): parameter for parameter in model.parameters()}
    try:
        return copy.deepcopy(model, shared)
    except Exception:
        log.warning("%s cannot be copied: %s.", type(model).__name__, otherwise)
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
        with evaluating(model, evaluation, autocast, after=True, split="valid"):
            step: Any = model.valid_step
            run_pass(
                step,
                "valid_step",
                loader,
                processor,
                "valid",
                epoch,
                device,
                check=True,
                only_check=True,
            )  # type: ignore[arg-type]
    finally:
        model.train()
        restore_rng_state(rng)
