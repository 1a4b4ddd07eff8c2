"""The total L2 norm of the gradients at each optimizer step, as a training metric."""

from __future__ import annotations

from typing import Any

import torch

from ember.errors import ConfigError
from ember.train.metric.base import MetricMetadata, MetricValue


class GradNormMetric:
    """The total L2 norm of the gradient each optimizer step applies: unscaled under
    fp16 and before clipping (so clipping shows as values above the clipping norm).

    Register it as a training metric (`metric_train_numeric(GradNormMetric())`); the
    builder also registers it as a callback, which is how it sees the gradients (its
    `on_before_optimizer_step` hook). The value stays on the device: no host sync.

    One value per optimizer step, weight 1, so the epoch value is the mean over the
    epoch's steps. Under `grads_accumulation(n)` the batches that end no step log the
    last step's norm with weight 0 (they change no mean). With several optimizers
    (custom optimization), name the one to measure: `GradNormMetric("disc")`. Under
    fp16, a step the gradient scaler skips (its gradient overflowed) shows `inf`.
    """

    unit = ""
    higher_is_better = None
    input_type = object  # reads no step output: `adapt` passes anything through

    def __init__(self, optimizer: str | None = None) -> None:
        self.optimizer = optimizer
        self.name = "Grad Norm" if optimizer is None else f"Grad Norm {optimizer}"
        self._norm: torch.Tensor | float = 0.0
        self._at: tuple[int, int] = (0, 0)  # (epoch, iteration) of the last step measured

    # The callback side ------------------------------------------------------------------
    def on_fit_start(self, ctx: Any) -> None:
        names = list(ctx.optimizers)
        if self.optimizer is None and len(names) > 1:
            raise ConfigError(
                f"GradNormMetric(): the learner has several optimizers ({', '.join(names)}): "
                f"name the one to measure, e.g. GradNormMetric({names[0]!r})."
            )
        if self.optimizer is not None and self.optimizer not in names:
            raise ConfigError(
                f"GradNormMetric({self.optimizer!r}): the learner has no optimizer of that "
                f"name; its optimizers are {', '.join(map(repr, names))}."
            )

    def on_before_optimizer_step(self, ctx: Any) -> None:
        if self.optimizer is not None and ctx.optimizer_name != self.optimizer:
            return
        grads = [
            param.grad
            for group in ctx.optimizer.param_groups
            for param in group["params"]
            if param.grad is not None
        ]
        if grads:
            self._norm = torch.nn.utils.get_total_norm(grads, 2.0).detach()
        else:
            self._norm = 0.0
        self._at = (ctx.epoch, ctx.iteration)

    # The metric side --------------------------------------------------------------------
    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        stepped = self._at == (meta.epoch, meta.iteration)  # this batch ended a step
        return MetricValue(self._norm, 1 if stepped else 0)

    def clear(self) -> None:
        pass  # the last norm is held across epochs (the next step replaces it)

    def state_dict(self) -> dict[str, Any]:
        """The last norm, so a run resumed mid-step logs what it would have logged."""
        norm = self._norm
        norm = norm.detach().clone() if isinstance(norm, torch.Tensor) else norm
        return {"norm": norm, "at": list(self._at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._norm = state["norm"]
        self._at = (int(state["at"][0]), int(state["at"][1]))
