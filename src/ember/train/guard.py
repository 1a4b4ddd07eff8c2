"""Guarding against non-finite losses without a host sync per step on accelerators."""

from __future__ import annotations

import math
from typing import Callable, Literal

import torch

from ember.errors import TrainingError
from ember.train import host

NonFinitePolicy = Literal["stop", "skip"]


class NonFiniteLoss(TrainingError):
    """The loss became NaN or infinite."""


class LossGuard:
    """`stop` (default): a NaN/inf loss ends the run with a message naming where.
    `skip`: the optimizer step of a group with a NaN/inf loss is dropped.

    `stop` with a `LossMetric` on the training split that reads the loss the step
    backpropagates (`covered`): the guard does nothing per step; the metrics processor
    reports a non-finite value (`nonfinite`) when the metric's values reach the host,
    at once on the CPU (before the optimizer step), as they arrive and at the end of
    the split on an accelerator. Without such a metric, on the CPU every loss is
    checked at once; on an accelerator `stop` collects a finiteness flag per step and
    every `every` steps starts them on their way to the host without waiting
    (`ember.train.host`), so a stop comes a few steps late, and at the latest at the
    split's end (`flush`). `skip` has to look at every loss before its step, and syncs
    each step on an accelerator.
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
        self.every = every
        self.covered = False
        """The training loss metric reports non-finite losses: no check per step."""
        self._pending: list[tuple[int, int, torch.Tensor]] = []
        self._copies = host.HostCopies()
        self._in_flight: host.InFlight[list[tuple[int, int]]] = host.InFlight()

    def check(self, loss: torch.Tensor, epoch: int, iteration: int) -> bool:
        """True when the loss is finite (as far as is known now)."""
        if self.covered:
            return True
        if self.policy == "skip" or host.on_host(loss):
            value = float(loss.detach())
            if math.isfinite(value):
                return True
            if self.policy == "skip":
                return False
            raise self._error(value, epoch, iteration)
        self._pending.append((epoch, iteration, torch.isfinite(loss.detach())))
        if len(self._pending) >= self.every:
            self._launch()
            self._read(wait=False)
        return True

    def nonfinite(self, epoch: int, iteration: int, value: float) -> None:
        """A loss that reached the host through the loss metric is not finite: stop."""
        raise self._error(value, epoch, iteration)

    def flush(self) -> None:
        """Check every deferred loss (accelerators, `stop` policy), waiting once for
        those still on their way."""
        self._launch()
        self._read(wait=True)

    def _launch(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            flags = torch.stack([flag for _, _, flag in pending])
            where = [(epoch, iteration) for epoch, iteration, _ in pending]
            self._in_flight.add(where, self._copies.launch([flags]))

    def _read(self, wait: bool) -> None:
        for where, values in self._in_flight.arrived(wait):
            for (epoch, iteration), ok in zip(where, values[0]):
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
