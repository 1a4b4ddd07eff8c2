"""The outputs of a model from another library, as the metrics read them: its loss alone
(`ForwardOutput`), or, for a task, the output type of that task with the model's logits
and the batch's targets (a causal language model's shifted by one token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ember.errors import TrainingError
from ember.train.metric.inputs import LossInput
from ember.train.output import (
    ClassificationOutput,
    LossFields,
    RegressionOutput,
    SequenceOutput,
)

TASKS = ("classification", "regression", "causal_lm", "tokens")
"""The tasks `LossFromModel(task=...)` knows, besides None (the loss alone)."""


@dataclass
class _ForwardFields:
    """The own fields of `ForwardOutput`."""

    loss: Tensor | None
    output: Any = None
    targets: Any = None
    samples: int = 1


@dataclass
class ForwardOutput(LossFields, _ForwardFields):
    """What a step of `LossFromModel` without a task returns: the forward's `loss`, its
    predictions as they are (`output`: a tensor, a detection model's list of dicts of
    boxes, or None when the forward returned only losses), the batch's `targets` as
    they are, and the `samples` the loss is the mean over. `LossMetric` reads the loss;
    a metric that reads predictions and targets of any kind can ask for the output
    itself (`TorchMetric(metric, input_type=ForwardOutput)`)."""

    def adapt(self, input_type: type) -> Any:
        if input_type is LossInput:
            if self.loss is None:
                raise TrainingError(
                    "The model's forward returned no loss in eval mode, so there is no "
                    "validation loss to measure (torchvision's detection models return "
                    "losses only in train mode). Pass LossFromModel(valid_loss='train_mode') "
                    "for a validation loss, or leave LossMetric out of the validation "
                    "metrics."
                )
            return LossInput(self.loss, self.samples, self.loss_reduction)
        return None


def task_output(
    task: str,
    loss: Tensor,
    predictions: Any,
    targets: Any,
    ignore_index: int,
    model_name: str,
) -> Any:
    """The output of `task` for a step's loss, predictions and targets."""
    if not isinstance(predictions, Tensor) or not isinstance(targets, Tensor):
        raise TrainingError(
            f"LossFromModel(task={task!r}) reads the predictions and the targets as tensors; "
            f"{model_name}'s forward gave {type(predictions).__name__} predictions and the "
            f"batch {type(targets).__name__} targets. Name where they are with call= (a "
            "function of the model and the batch returning the predictions) and targets=."
        )
    if task == "classification":
        return ClassificationOutput(loss, predictions, targets)
    if task == "regression":
        if predictions.shape[:-1] == targets.shape and predictions.shape[-1] == 1:
            predictions = predictions.squeeze(-1)  # one output per sample, [B, 1]
        return RegressionOutput(loss, predictions, targets)
    if task == "causal_lm":  # the logits of token t predict the label of token t + 1
        predictions, targets = predictions[:, :-1], targets[:, 1:]
    tokens = (targets != ignore_index).sum()
    return SequenceOutput(
        loss,
        predictions,
        targets,
        pad_token=ignore_index,
        loss_reduction="token_mean",
        tokens=tokens,
    )


def forward_output(loss: Tensor | None, predictions: Any, targets: Any, samples: int) -> Any:
    """The output of a step without a task."""
    if isinstance(predictions, Tensor):
        predictions = predictions.detach()
    return ForwardOutput(loss, predictions, targets, samples)
