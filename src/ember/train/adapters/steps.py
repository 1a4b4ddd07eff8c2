"""`LossFromModel`: the train and valid steps of a model whose forward computes its own
loss (a Hugging Face model given `labels`, a torchvision detection model and its dict of
losses) or returns predictions ember computes a loss from (a graph network, a diffusion
UNet). The steps are attached to the model object itself, not to a wrapper module: the
model's state dict, its checkpoints and `save_pretrained` keep its own parameter names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from torch import Tensor, nn

from ember.errors import ConfigError, TrainingError
from ember.train.adapters.output import TASKS, forward_output, task_output
from ember.train.adapters.reading import (
    TargetsSpec,
    call_model,
    count_samples,
    find_field,
    find_targets,
    loss_of,
    no_loss,
    predictions_of,
    train_mode,
)
from ember.train.step import TrainOutput

VALID_LOSSES = ("eval_mode", "train_mode")
SPLITS = {"train_step": "train", "valid_step": "valid", "test_step": "test"}


class LossFromModel:
    """The steps of a model from another library, passed to
    `LearnerBuilder.build(model, optimizer, lr, steps=LossFromModel(...))`.

    Args:
        task: what the metrics read beside the loss. None: the loss, with the forward's
            predictions and the batch's targets as they are (`ForwardOutput`).
            "classification": logits [B, C] against class indices
            (`ClassificationOutput`). "regression": predictions against targets of the
            same shape (`RegressionOutput`). "causal_lm": a causal language model, the
            logits of each token against the label of the next one (`logits[:, :-1]`
            against `labels[:, 1:]`, as the model's loss reads them); "tokens": one label
            per token (token classification, masked language models). Both give a
            `SequenceOutput` whose loss is a mean over the labels that are not
            `ignore_index`, and weigh it by them.
        call: how a batch goes in, `call(model, batch)` returning the forward's result.
            By default a dict batch (a collator's) is passed as `model(**batch)`, a tuple
            or list as `model(*batch)` and anything else as `model(batch)`; with `loss`,
            without the targets.
        loss: `loss(predictions, targets)`, for a model whose forward returns
            predictions only (a tensor, or an output with `logits`); the targets are then
            not passed to the model.
        targets: where a batch holds its targets: a key of a dict batch or an attribute
            of a batch object, or a function of the batch. By default the "labels" key
            (or attribute), or the last element of a tuple or list.
        mask: the rows of the predictions and targets that count (node classification
            on one graph): the name of a boolean key or attribute of the batch, or one
            per split, `{"train": "train_mask", "valid": "val_mask", "test":
            "test_mask"}` (an evaluation is the "test" split). Needs `loss`.
        valid_loss: "eval_mode" (the default): validation runs the model in eval mode,
            as always, and reports the loss its forward returns there, if any.
            "train_mode": the validation loss comes from a second forward in train mode,
            for models that compute losses only in train mode; see `train_mode`.
        ignore_index: the label of padding for "causal_lm" and "tokens" (-100, what
            Hugging Face's collators and losses use), left out of the metrics.
    """

    def __init__(
        self,
        task: str | None = None,
        *,
        call: Callable[[Any, Any], Any] | None = None,
        loss: Callable[[Any, Any], Tensor] | None = None,
        targets: TargetsSpec = None,
        mask: str | Mapping[str, str] | None = None,
        valid_loss: str = "eval_mode",
        ignore_index: int = -100,
    ) -> None:
        if task is not None and task not in TASKS:
            raise ConfigError(
                f"LossFromModel(task={task!r}): the tasks are None (the loss alone), "
                + ", ".join(repr(name) for name in TASKS)
                + "."
            )
        for name, value in (("call", call), ("loss", loss)):
            if value is not None and not callable(value):
                raise ConfigError(
                    f"LossFromModel({name}=...) takes a function, got {type(value).__name__}."
                )
        if targets is not None and not (isinstance(targets, str) or callable(targets)):
            raise ConfigError(
                "LossFromModel(targets=...) takes a key or attribute name, or a function of "
                f"the batch; got {type(targets).__name__}."
            )
        if mask is not None and loss is None:
            raise ConfigError(
                "LossFromModel(mask=...) selects the rows ember computes the loss on, so it "
                "needs loss= (a model's own loss would cover every row)."
            )
        if valid_loss not in VALID_LOSSES:
            raise ConfigError(
                f"LossFromModel(valid_loss={valid_loss!r}): it is 'eval_mode' (the loss of "
                "the eval-mode forward, if it returns one) or 'train_mode' (a second forward "
                "in train mode)."
            )
        self.task = task
        self.call = call
        self.loss = loss
        self.targets = targets
        self.mask = mask
        self.valid_loss = valid_loss
        self.ignore_index = ignore_index

    def __repr__(self) -> str:
        return f"LossFromModel(task={self.task!r})"

    # Attaching ---------------------------------------------------------------
    def attach(self, model: nn.Module) -> nn.Module:
        """Give `model` this adapter's `train_step`, `valid_step`, `test_step` and
        `predict_step`, as attributes of the object (not modules: its state dict is
        unchanged); steps attached before are replaced. `build(..., steps=...)` calls
        it; call it yourself to evaluate a model with an `Evaluator`. Returns `model`."""
        if not isinstance(model, nn.Module):
            raise ConfigError(f"build() needs a torch.nn.Module, got {type(model).__name__}.")
        for name in (*SPLITS, "predict_step"):
            own = getattr(type(model), name, None)
            if own is not None:
                raise ConfigError(
                    f"{type(model).__name__} defines its own {name}, and steps= would replace "
                    "it. Pass steps= only for a model without step methods, or leave it out "
                    "to train with the model's own."
                )
        for name, split in (*SPLITS.items(), ("predict_step", "predict")):
            setattr(model, name, AttachedStep(self, model, split))
        return model

    # The steps ---------------------------------------------------------------
    def step(self, model: nn.Module, batch: Any, split: str) -> Any:
        """The output of one batch of `split` ("train", "valid" or "test"): a
        `TrainOutput` for "train"."""
        result = self.forward(model, batch)
        predictions = predictions_of(result)
        needs_targets = self.task is not None or self.loss is not None
        targets = find_targets(batch, self.targets)
        if needs_targets and targets is None:
            raise TrainingError(
                f"LossFromModel found no targets in a batch of type {type(batch).__name__}: "
                "name them with targets= (a key or attribute name, or a function of the "
                "batch)."
            )
        rows = self._rows(batch, split)
        if rows is not None:
            predictions, targets = self._select(rows, predictions, targets)
        if self.loss is not None:
            loss = self._own_loss(predictions, targets, model, result)
        else:
            loss = loss_of(result)
        if split != "train" and self.valid_loss == "train_mode":
            loss = self._train_mode_loss(model, batch, rows)
        if loss is None and (split == "train" or self.task is not None):
            raise no_loss(model, result, split)
        if self.task is None:
            output = forward_output(loss, predictions, targets, count_samples(targets, batch))
        else:
            assert loss is not None
            name = type(model).__name__
            output = task_output(self.task, loss, predictions, targets, self.ignore_index, name)
        return TrainOutput(output) if split == "train" else output

    def forward(self, model: nn.Module, batch: Any) -> Any:
        """The model's forward on `batch`, through `call` when it is given."""
        if self.call is not None:
            return self.call(model, batch)
        return call_model(model, batch, self.targets, self.loss is None)

    def predict(self, model: nn.Module, batch: Any) -> Any:
        """What `predict` collects from a batch: the forward's predictions (its logits,
        or the result itself when it holds none)."""
        result = self.forward(model, batch)
        predictions = predictions_of(result)
        return result if predictions is None else predictions

    def _rows(self, batch: Any, split: str) -> Any:
        if self.mask is None:
            return None
        if isinstance(self.mask, str):
            name = self.mask
        elif split in self.mask:
            name = self.mask[split]
        else:
            raise TrainingError(
                f"LossFromModel(mask={dict(self.mask)!r}) names no mask for the {split!r} "
                f"split: add {split!r}: '<the name of its mask>'."
            )
        rows = find_field(batch, name)
        if not isinstance(rows, Tensor):
            raise TrainingError(
                f"LossFromModel(mask=...) reads the mask {name!r} of the batch, and a "
                f"{type(batch).__name__} has no such tensor."
            )
        return rows

    def _own_loss(self, predictions: Any, targets: Any, model: nn.Module, result: Any) -> Any:
        if predictions is None:
            raise TrainingError(
                f"LossFromModel(loss=...) computes the loss from the predictions, and "
                f"{type(model).__name__}'s forward returned no tensor to read them from "
                f"({type(result).__name__}): return them with call=."
            )
        assert self.loss is not None
        return self.loss(predictions, targets)

    def _train_mode_loss(self, model: nn.Module, batch: Any, rows: Any) -> Any:
        """The loss of a forward in train mode, under the evaluation's no-grad mode."""
        with train_mode(model):
            result = self.forward(model, batch)
        if self.loss is None:
            return loss_of(result)
        predictions, targets = predictions_of(result), find_targets(batch, self.targets)
        if rows is not None:
            predictions, targets = self._select(rows, predictions, targets)
        return self._own_loss(predictions, targets, model, result)

    def _select(self, rows: Tensor, predictions: Any, targets: Any) -> tuple[Any, Any]:
        """The rows of the predictions and targets that `mask` keeps."""
        if not isinstance(predictions, Tensor) or not isinstance(targets, Tensor):
            raise TrainingError(
                "LossFromModel(mask=...) selects rows of the predictions and targets, which "
                f"must be tensors; they are {type(predictions).__name__} and "
                f"{type(targets).__name__}."
            )
        return predictions[rows], targets[rows]


class AttachedStep:
    """A step of a `LossFromModel` attached to one model: called with the batch, like
    the step methods a model defines. Copying the model (`copy.deepcopy`) binds the copy's
    steps to the copied model."""

    def __init__(self, adapter: LossFromModel, model: nn.Module, split: str) -> None:
        self.adapter = adapter
        self.model = model
        self.split = split

    def __call__(self, batch: Any) -> Any:
        if self.split == "predict":
            return self.adapter.predict(self.model, batch)
        return self.adapter.step(self.model, batch, self.split)

    def __repr__(self) -> str:
        return f"{self.adapter!r}.{self.split}_step of {type(self.model).__name__}"


def attach_steps(model: Any, steps: Any) -> None:
    """`build(..., steps=...)`: attach `steps` (a `LossFromModel`) to the model, if given."""
    if steps is None:
        return
    if not callable(getattr(steps, "attach", None)):
        raise ConfigError(
            f"build(steps=...) takes a LossFromModel (or an object with attach(model)); got "
            f"{type(steps).__name__}."
        )
    steps.attach(model)
