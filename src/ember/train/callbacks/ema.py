"""`EMA`: an exponential moving average of the model's weights, kept beside training."""

from __future__ import annotations

from typing import Any

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.callbacks.base import Callback, Context


class EMA(Callback):
    """Shadow weights that follow the model: `shadow = d * shadow + (1 - d) * weight`
    after every `every`-th optimizer step, with `d = min(decay, (1 + n) / (10 + n))`
    where `n` is the number of updates made before this one: 0 for the first update,
    whose `d` is 0.1 (`warmup=False`: `d = decay` from the start).

    The shadow holds every floating-point parameter and buffer of the model, on the
    model's device; other buffers (counts such as BatchNorm's `num_batches_tracked`) are
    copied as they are. It is saved in every checkpoint and restored on resume.

    - `validate_with_ema=True`: validation runs on the shadow weights (swapped in,
      then swapped back), so the validation metrics, early stopping and the best
      checkpoint judge the averaged model. Checkpoints always hold the trained weights.
    - `optimizer`: with several optimizers, update only after the steps of this one
      (e.g. "gen"); by default after every optimizer step.
    - At the end, `ema.copy_to(model)` puts the averaged weights into the model (or
      `ema.state_dict()["shadow"]` gives them as a state dict).
    """

    def __init__(
        self,
        decay: float = 0.999,
        *,
        warmup: bool = True,
        every: int = 1,
        validate_with_ema: bool = False,
        optimizer: str | None = None,
    ) -> None:
        if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 <= decay < 1:
            raise ConfigError(f"EMA(decay=...) must be a number in [0, 1), got {decay!r}.")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"EMA(every=...) must be an int >= 1, got {every!r}.")
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.every = every
        self.validate_with_ema = bool(validate_with_ema)
        self.optimizer = optimizer
        self.shadow: dict[str, torch.Tensor] | None = None
        """The averaged state (parameter and buffer names of the model), once `fit` starts."""
        self.updates = 0
        """Shadow updates so far."""
        self.steps = 0
        """Optimizer steps seen (updates happen at every `every`-th)."""
        self._saved: dict[str, Any] | None = None
        self._backup: dict[str, torch.Tensor] | None = None
        self._floats: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._others: list[tuple[torch.Tensor, torch.Tensor]] = []

    # Hooks ----------------------------------------------------------------------------
    def on_fit_start(self, ctx: Context) -> None:
        if self.optimizer is not None and self.optimizer not in ctx.optimizers:
            raise ConfigError(
                f"EMA(optimizer={self.optimizer!r}): the learner has no optimizer of that "
                f"name; its optimizers are {', '.join(map(repr, ctx.optimizers))}."
            )
        self.attach(ctx.model)

    def on_after_optimizer_step(self, ctx: Context) -> None:
        if self.optimizer is not None and ctx.optimizer_name != self.optimizer:
            return
        self.steps += 1
        if self.steps % self.every == 0:
            self.update()

    def on_validation_start(self, ctx: Context) -> None:
        if self.validate_with_ema:
            self._swap_in(ctx.model)

    def on_validation_end(self, ctx: Context) -> None:
        if self.validate_with_ema:
            self._swap_out(ctx.model)

    # The average ----------------------------------------------------------------------
    def attach(self, model: torch.nn.Module) -> None:
        """Start the shadow from `model`'s weights (or from a restored state)."""
        state = model.state_dict()
        shadow = {key: value.detach().clone() for key, value in state.items()}
        if self._saved is not None:
            saved, self._saved = self._saved["shadow"], None
            problems = [key for key in shadow if key not in saved]
            problems += [key for key in saved if key not in shadow]
            problems += [
                key
                for key in shadow
                if key in saved and tuple(saved[key].shape) != tuple(shadow[key].shape)
            ]
            if problems:
                raise TrainingError(
                    "The EMA state in the checkpoint does not fit the model (keys or shapes "
                    f"differ: {', '.join(problems[:5])}). Resume with the model the run was "
                    "started with."
                )
            for key, value in shadow.items():
                value.copy_(saved[key])
        self.shadow = shadow
        self._floats = [
            (shadow[key], value) for key, value in state.items() if value.is_floating_point()
        ]
        self._others = [
            (shadow[key], value) for key, value in state.items() if not value.is_floating_point()
        ]

    def current_decay(self) -> float:
        """The decay the next update uses."""
        if not self.warmup:
            return self.decay
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """Move the shadow towards the model's weights (one update)."""
        if self.shadow is None:
            raise TrainingError("EMA.update() before the EMA is attached to a model.")
        decay = self.current_decay()
        if self._floats:
            shadows = [shadow for shadow, _ in self._floats]
            weights = [weight.detach() for _, weight in self._floats]
            torch._foreach_lerp_(shadows, weights, 1.0 - decay)
        for shadow, value in self._others:
            shadow.copy_(value)
        self.updates += 1

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> torch.nn.Module:
        """Load the averaged weights into `model` (the trained one, or a copy of it);
        return it."""
        if self.shadow is None:
            raise TrainingError(
                "EMA.copy_to(model): the EMA has no weights yet; it gets them when fit() starts."
            )
        model.load_state_dict(self.shadow)
        return model

    def _swap_in(self, model: torch.nn.Module) -> None:
        if self.shadow is None:
            return
        state = model.state_dict()
        self._backup = {key: value.detach().clone() for key, value in state.items()}
        with torch.no_grad():
            for key, value in state.items():
                value.copy_(self.shadow[key])

    def _swap_out(self, model: torch.nn.Module) -> None:
        if self._backup is None:
            return
        backup, self._backup = self._backup, None
        with torch.no_grad():
            for key, value in model.state_dict().items():
                value.copy_(backup[key])

    # State ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "shadow": dict(self.shadow) if self.shadow is not None else {},
            "updates": self.updates,
            "steps": self.steps,
            "decay": self.decay,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take a checkpointed state; the shadow comes back onto the model's device when
        `fit` starts (or at once, when the EMA is already attached)."""
        self.updates = int(state["updates"])
        self.steps = int(state["steps"])
        self._saved = {"shadow": state["shadow"]}
        if self.shadow is not None:
            saved, self._saved = state["shadow"], None
            with torch.no_grad():
                for key, value in self.shadow.items():
                    value.copy_(saved[key])
