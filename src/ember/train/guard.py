"""Guarding against non-finite losses without a host sync per step on accelerators."""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch

from ember.errors import TrainingError

NonFinitePolicy = Literal["stop", "skip"]


class NonFiniteLoss(TrainingError):
    """The loss became NaN or infinite."""


class LossGuard:
    """`stop` (default): a NaN/inf loss ends the run with a message naming where.
    `skip`: the optimizer step of a group with a NaN/inf loss is dropped.

    `stop` with a `LossMetric` on the training split that reads the loss the step
    backpropagates (`covered`): the guard does nothing per step; the metrics processor
    reports a non-finite value (`nonfinite`) when the metric's values reach the host,
    at once on the CPU (before the optimizer step), at each metrics tick and at the end
    of the split on an accelerator. Without such a metric, on the CPU every loss is
    checked at once; on an accelerator `stop` checks in bulk every `every` steps (no
    per-step sync), so up to that many steps may run before the stop. `skip` has to
    look at every loss before its step, and syncs each step on an accelerator.
    """

    def __init__(
        self,
        policy: NonFinitePolicy,
        device: torch.device,
        every: int = 50,
        last_checkpoint: Callable[[], str] | None = None,
    ) -> None:
        self.policy = policy
        self.last_checkpoint = last_checkpoint
        self.immediate = device.type == "cpu" or policy == "skip"
        self.every = every
        self.covered = False
        """The training loss metric reports non-finite losses: no check per step."""
        self._pending: list[tuple[int, int, torch.Tensor]] = []

    def check(self, loss: torch.Tensor, epoch: int, iteration: int) -> bool:
        """True when the loss is finite (as far as is known now)."""
        if self.covered:
            return True
        if self.immediate:
            value = float(loss.detach())
            if math.isfinite(value):
                return True
            if self.policy == "skip":
                return False
            raise self._error(value, epoch, iteration)
        self._pending.append((epoch, iteration, torch.isfinite(loss.detach())))
        if len(self._pending) >= self.every:
            self.flush()
        return True

    def nonfinite(self, epoch: int, iteration: int, value: float) -> None:
        """A loss that reached the host through the loss metric is not finite: stop."""
        raise self._error(value, epoch, iteration)

    def flush(self) -> None:
        """Check the deferred losses (accelerators, `stop` policy)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        finite = torch.stack([flag for _, _, flag in pending]).cpu().tolist()
        for (epoch, iteration, _), ok in zip(pending, finite):
            if not ok:
                raise self._error(math.nan, epoch, iteration)

    def _error(self, value: float, epoch: int, iteration: int) -> NonFiniteLoss:
        kind = "NaN" if math.isnan(value) else "infinite"
        where = f" {self.last_checkpoint()}." if self.last_checkpoint is not None else ""
        return NonFiniteLoss(
            f"The loss is {kind} at epoch {epoch}, iteration {iteration}.{where} Lower the learning "
            "rate, clip gradients (grad_clipping), check the data for NaN/inf, or pass "
            "nonfinite_loss('skip') to skip such steps."
        )
