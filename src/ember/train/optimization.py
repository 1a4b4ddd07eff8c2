"""One optimizer step per group of batches: loss scaling, mixed precision, clipping, LR.

The learner sets the group's rate (`lr.before_step()`), then calls `backward(loss,
share)` for each batch of the group (share = the batch's fraction of the group's
samples, so the accumulated
gradient is the gradient of the group's mean loss), then `step()`. A loss that is a
mean over tokens (`loss_reduction="token_mean"`) has its tokens as share instead, and
`rescale()` divides the group's gradients by their total over every process before
the step: the gradient of the mean over every token.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, ContextManager, Literal

import torch

from ember.errors import ConfigError, TrainingError
from ember.lr.base import LrDriver
from ember.train.callbacks.base import Callbacks

MixedPrecision = Literal["bf16", "fp16"]


class Optimization:
    """Owns the optimizer, the LR driver, the optional GradScaler and gradient clipping."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr: LrDriver,
        device: torch.device,
        mixed_precision: MixedPrecision | None = None,
        clip_norm: float | None = None,
        clip_value: float | None = None,
        callbacks: Callbacks | None = None,
    ) -> None:
        self.model = model
        self.callbacks = callbacks
        """The run's callbacks (None without any: the steps then call no hook)."""
        self.optimizer = optimizer
        self.lr = lr
        self.device = device
        self.mixed_precision = mixed_precision
        self.clip_norm = clip_norm
        self.clip_value = clip_value
        self.scaler: torch.amp.GradScaler | None = None
        if mixed_precision == "fp16":
            self.scaler = torch.amp.GradScaler(device.type)
        self._dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision or "")
        self._no_autocast = contextlib.nullcontext()
        self.autocasts = self._dtype is not None
        """The steps run under autocast (mixed precision)."""
        self._prepared = False
        self._clips = clip_norm is not None or clip_value is not None
        self.bare = callbacks is None and self.scaler is None and not self._clips
        """Nothing runs around the optimizer's step but the schedule's (`step`)."""
        self.micro_split: int | None = None
        """Under `grads_accumulation("auto")`: how many micro-batches each batch is split
        into (1 until a step runs out of memory; `train/oom.py`). None otherwise."""
        self.notes: list[str] = []
        """Warnings about the optimization found at build, for the run's log."""
        self.closes = needs_closure(optimizer)
        """The optimizer's step takes a closure that re-evaluates the loss (L-BFGS)."""
        self.closure: Callable[[], Any] | None = None
        """The closure of the coming step (`reevaluation`), when the optimizer takes one."""

    def autocast(self) -> ContextManager[Any]:
        """The context the steps run in: autocast under mixed precision, else nothing."""
        if self._dtype is None:
            return self._no_autocast
        return torch.autocast(self.device.type, dtype=self._dtype)

    def backward(
        self,
        loss: torch.Tensor,
        share: float | torch.Tensor,
        inputs: list[torch.Tensor] | None = None,
    ) -> None:
        """Add the gradient of `loss * share` (scaled under fp16), with the backward
        hooks of the callbacks around it; `inputs`: only into these tensors."""
        scaled = loss * share if isinstance(share, torch.Tensor) or share != 1.0 else loss
        if self.scaler is not None:
            scaled = self.scaler.scale(scaled)
        callbacks = self.callbacks
        if callbacks is not None and callbacks.before_backward:
            callbacks.update(loss=loss)
            callbacks.call("on_before_backward")
        try:
            scaled.backward(inputs=inputs)
        except RuntimeError as error:
            explain_backward(error)
            raise
        if callbacks is not None and callbacks.after_backward:
            callbacks.call("on_after_backward")

    def rescale(self, total: torch.Tensor | float, dist: Any = None, world: int = 1) -> None:
        """Token-weighted accumulation: each batch of the group added the gradient of
        `loss * weight` (its loss is a mean over `weight` tokens); divide by the group's
        total weight over every process, so the gradient is that of the mean over all
        of its tokens. Several processes average their gradients (DDP, FSDP): the
        factor is the number of processes over the total weight. Without `dist`, `total`
        is already the total over the `world` processes."""
        weight = torch.as_tensor(total, dtype=torch.float32)
        if dist is not None:
            weight, world = dist.sum(weight), dist.world
        factor = torch.where(weight > 0, world / weight, torch.zeros_like(weight))
        for param in self.model.parameters():
            if param.grad is not None:
                param.grad.mul_(factor.to(param.grad.device))

    def prepare(self) -> None:
        """Before the step, once the gradients are complete: unscale them (fp16) and call
        the callbacks' `on_before_optimizer_step` (nothing without such callbacks). The
        loop does it before the metrics of the step's last batch, which may read it."""
        callbacks = self.callbacks
        if callbacks is None or not callbacks.optimizer_steps or self._prepared:
            return
        self._before(self.optimizer, None)
        self._prepared = True

    def step(self) -> None:
        """Apply the accumulated gradients, then clear them."""
        closure, self.closure = self.closure, None
        if self.bare:
            if closure is None:  # `apply` with nothing around the step
                self.optimizer.step()
            else:
                self.optimizer.step(closure)
            self.lr.after_step()
            self.optimizer.zero_grad(set_to_none=True)
            return
        prepared, self._prepared = self._prepared, False
        self.apply(self.optimizer, None, self.lr, None, prepared, closure)
        if self.scaler is not None:
            self.scaler.update()

    def reevaluation(
        self, forward: Callable[[], torch.Tensor], loss: torch.Tensor, share: float | torch.Tensor
    ) -> Callable[[], torch.Tensor]:
        """The closure of a step whose optimizer takes one (`closes`): its first call
        returns `loss`, the step's first evaluation, whose forward and backward already
        ran (its gradients are in place, the metrics saw its output); each later call
        clears the gradients, runs `forward` again (under autocast with mixed
        precision), adds the gradient of its loss times `share`, clips, and returns the
        loss, as a script's closure does."""
        first: list[torch.Tensor] = [loss.detach()]

        def closure() -> torch.Tensor:
            if first:
                return first.pop()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.enable_grad():
                with self.autocast():
                    again = forward()
                scaled = again * share if isinstance(share, torch.Tensor) or share != 1.0 else again
                scaled.backward()
            if self._clips:
                self._clip(self.model.parameters())
            return again.detach()

        return closure

    def clipped(self, closure: Callable[[], Any], params: Any) -> Callable[[], Any]:
        """A step's own closure (custom optimization), its gradients clipped after each
        evaluation, as the gradients of the step's first evaluation are."""
        if not self._clips:
            return closure
        params = list(params)

        def evaluate() -> Any:
            loss = closure()
            self._clip(params)
            return loss

        return evaluate

    def _before(self, optimizer: Any, name: str | None) -> None:
        callbacks = self.callbacks
        assert callbacks is not None
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        callbacks.update(optimizer_name=name or callbacks.ctx.optimizer_name)
        callbacks.call("on_before_optimizer_step")

    def apply(
        self,
        optimizer: Any,
        params: Any,
        lr: Any,
        name: str | None = None,
        prepared: bool = False,
        closure: Callable[[], Any] | None = None,
    ) -> Any:
        """One optimizer's step: unscale (fp16), the callbacks' `on_before_optimizer_step`
        (unless `prepare` did both), clip `params` (None: the model's), step (with
        `closure`, when the optimizer takes one), the learning rate's step,
        `on_after_optimizer_step`, clear. Returns what the optimizer's step returned."""
        callbacks = self.callbacks
        hooks = callbacks is not None and callbacks.optimizer_steps
        if hooks and not prepared:
            self._before(optimizer, name)
        returned = self._update(optimizer, params, unscaled=prepared or hooks, closure=closure)
        lr.after_step()
        if hooks:
            assert callbacks is not None
            callbacks.call("on_after_optimizer_step")
        optimizer.zero_grad(set_to_none=True)
        return returned

    def bare_step(self) -> None:
        """Apply the accumulated gradients as `step` does (unscaled for the clipping
        under fp16, clipped, stepped, the scaler updated), then clear them; without the
        callbacks' hooks and without the learning rate's step: the learning-rate range
        test (`lr_find`) sets the rate of each step itself."""
        closure, self.closure = self.closure, None
        self._update(self.optimizer, None, unscaled=False, closure=closure)
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def _update(
        self, optimizer: Any, params: Any, unscaled: bool, closure: Callable[[], Any] | None = None
    ) -> Any:
        """Clip `params` (None: the model's), unscaling the gradients first under fp16
        unless they are (`unscaled`); step `optimizer` (through the scaler under fp16;
        with `closure` when it takes one). Returns what the step returned."""
        if self._clips:
            if self.scaler is not None and not unscaled:
                self.scaler.unscale_(optimizer)
            self._clip(self.model.parameters() if params is None else params)
        if self.scaler is not None:
            return self.scaler.step(optimizer)
        if closure is not None:
            return optimizer.step(closure)
        return optimizer.step()

    def skip(self) -> None:
        """Drop the accumulated gradients without stepping (a non-finite loss was skipped)."""
        self._prepared = False
        self.closure = None
        self.optimizer.zero_grad(set_to_none=True)

    def _clip(self, params: Any) -> None:
        params = list(params)
        if self.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
        if self.clip_value is not None:
            torch.nn.utils.clip_grad_value_(params, self.clip_value)

    def state_dict(self) -> dict[str, Any]:
        """Scheduler and GradScaler states (the optimizer's is saved on its own)."""
        state: dict[str, Any] = {"lr_scheduler": self.lr.state_dict()}
        if self.scaler is not None:
            state["grad_scaler"] = self.scaler.state_dict()
        if self.callbacks is not None:
            state["callbacks"] = self.callbacks.state_dict()
        if self.micro_split is not None:
            state["micro_split"] = self.micro_split
        return state

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Restore the schedules, the scaler and the callbacks; return what a user should
        read about the callbacks' states (missing, or not used)."""
        self.lr.load_state_dict(state["lr_scheduler"])
        if self.scaler is not None and "grad_scaler" in state:
            self.scaler.load_state_dict(state["grad_scaler"])
        notes = []
        if self.micro_split is not None and int(state.get("micro_split", 1)) > 1:
            self.micro_split = int(state["micro_split"])
            notes.append(
                f"grads_accumulation('auto'): every batch is split into {self.micro_split} "
                "micro-batches, as in the checkpoint's run."
            )
        saved = state.get("callbacks", {})
        if self.callbacks is not None:
            return notes + self.callbacks.load_state_dict(saved)
        if saved:
            notes.append(
                f"The checkpoint holds the state of callbacks ({', '.join(saved)}) that this "
                "run does not register: that state is not used."
            )
        return notes


def needs_closure(optimizer: Any) -> bool:
    """Whether an optimizer's `step` requires a closure that re-evaluates the loss
    (`torch.optim.LBFGS`); an optional closure (`SGD.step(closure=None)`) is not."""
    try:
        parameters = inspect.signature(optimizer.step).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return False
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in parameters
    )


def check_mixed_precision(value: Any) -> MixedPrecision | None:
    if value is None or value in ("bf16", "fp16"):
        return value
    raise ConfigError(f"mixed_precision takes 'bf16' or 'fp16', got {value!r}.")


def explain_backward(error: RuntimeError) -> None:
    """Raise a `TrainingError` for an error of the backward of a step's loss when
    `train_step` already called backward on it (the caller re-raises any other)."""
    if "backward through the graph a second time" in str(error):
        raise TrainingError(
            "train_step called loss.backward() itself: ember calls backward on the "
            "loss the step returns (that is how it accumulates gradients, scales "
            "mixed-precision losses and synchronises devices). Remove the backward() "
            "call (and any optimizer.step()/zero_grad()) from train_step."
        ) from error
