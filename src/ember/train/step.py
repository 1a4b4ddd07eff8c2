"""The step protocols a model implements, and `TrainOutput`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor

from ember.data.device import describe
from ember.errors import TrainingError

T = TypeVar("T")
BatchT = TypeVar("BatchT", contravariant=True)
OutputT = TypeVar("OutputT")
ValidT = TypeVar("ValidT", covariant=True)


@dataclass(init=False, repr=False, eq=False, slots=True)
class TrainOutput(Generic[T]):
    """What `train_step` returns: the item metrics read, and the loss ember backpropagates.

    `loss` defaults to `item.loss`. ember calls `backward()` itself, which is what lets
    it accumulate gradients, scale losses for mixed precision and synchronise devices.
    A dataclass, so that FSDP finds the loss among a step's outputs and gathers the
    parameters again for the backward (`register_fsdp_forward_method`).
    """

    item: T
    loss: torch.Tensor

    def __init__(self, item: T, loss: torch.Tensor | None = None) -> None:
        if loss is None:
            loss = getattr(item, "loss", None)
        if not isinstance(loss, Tensor):
            if loss is None:
                raise TrainingError(
                    f"TrainOutput got a {type(item).__name__} without a `loss` attribute and no "
                    "loss= argument. Return TrainOutput(item, loss=your_loss_tensor)."
                )
            raise TrainingError(
                f"TrainOutput needs the loss as a torch.Tensor, got {type(loss).__name__}."
            )
        self.item = item
        self.loss = loss

    def __repr__(self) -> str:
        return f"TrainOutput(item={type(self.item).__name__}, loss=Tensor{tuple(self.loss.shape)})"


@runtime_checkable
class TrainStep(Protocol[BatchT, OutputT]):
    """A model that can be trained: one batch in, a TrainOutput out (no backward call)."""

    def train_step(self, batch: BatchT) -> TrainOutput[OutputT]: ...


@runtime_checkable
class ValidStep(Protocol[BatchT, ValidT]):
    """A model that can be validated: called in eval mode under `torch.inference_mode()`."""

    def valid_step(self, batch: BatchT) -> ValidT: ...


def check_steps(model: Any, names: tuple[str, ...] = ("train_step",)) -> None:
    """Fail early, naming the fix, when a model lacks a step method it needs
    (`valid_step` is needed only when there is validation data)."""
    missing = [name for name in names if not callable(getattr(model, name, None))]
    if missing:
        raise TrainingError(
            f"{type(model).__name__} has no {' or '.join(missing)} method. A model trained by "
            "the Learner defines `train_step(self, batch) -> TrainOutput` and, to be "
            "validated, `valid_step(self, batch) -> output` (e.g. a ClassificationOutput). "
            "A model whose forward returns its loss (Hugging Face, torchvision detection) or "
            "its predictions needs none: build(model, optimizer, lr, "
            "steps=LossFromModel(...)) (from ember.train) gives it both; see 'Models from "
            "other libraries' in the docs."
        )


def check_train_output(model: Any, output: Any, manual: bool = False) -> None:
    """The first `train_step` output of a run: a `TrainOutput` with a scalar loss that
    autograd can differentiate (under custom optimization, `manual`, the step ran its
    own backward passes: the loss is only reported); otherwise an error naming the fix."""
    if not isinstance(output, TrainOutput):
        raise TrainingError(
            f"{type(model).__name__}.train_step returned {type(output).__name__}; it must "
            "return TrainOutput(item) (ember calls backward on item.loss)."
        )
    if output.loss.dim() != 0:
        raise TrainingError(
            f"train_step's loss has shape {tuple(output.loss.shape)}; it must be a scalar. "
            "Reduce it (e.g. loss.mean()) before returning it."
        )
    if not manual and not output.loss.requires_grad:
        raise TrainingError(
            "train_step's loss does not require grad: it was computed without autograd "
            "(under torch.no_grad()/inference_mode, or from detached tensors)."
        )


def start_split(model: Any, split: str) -> None:
    """Tell a model that carries state across batches that a split begins: its
    `on_split_start(split)`, when it defines one ("train", "valid", "test" for an
    evaluation, "predict" for a prediction)."""
    hook = getattr(model, "on_split_start", None)
    if callable(hook):
        hook(split)


def call_step(step: Any, batch: Any, name: str, epoch: int, iteration: int) -> Any:
    """Run a step; an error it raises gets a note naming the step, where and the batch."""
    try:
        return step(batch)
    except Exception as error:
        note_step_error(error, batch, name, epoch, iteration)
        raise


def note_step_error(
    error: BaseException, batch: Any, name: str, epoch: int, iteration: int
) -> None:
    """Add to `error` a note naming the step that raised it, where, and its batch."""
    if hasattr(error, "add_note"):
        error.add_note(
            f"ember: raised by {name} at epoch {epoch}, iteration {iteration}; "
            f"the batch was {describe(batch)}"
        )
