"""Callbacks: hooks that may change training, with state that checkpoints keep.

A listener (`events.py`) only watches the loop. A callback is called at fixed points
of it (the start and end of the run and of each epoch, around each backward pass and
optimizer step, around validation) with a `Context` that gives the model and the
optimizers, and may change them: edit gradients, swap weights, keep shadow copies.
Its `state_dict()` goes into every checkpoint, beside the random generator states,
and `load_state_dict()` gets it back when a run resumes.

The loop calls only the hooks a callback defines: a run without callbacks pays one
`is None` test per batch, and a callback that defines two hooks costs two calls.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

import torch

from ember.errors import ConfigError

HOOKS = (
    "on_fit_start",
    "on_fit_end",
    "on_epoch_start",
    "on_epoch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_after_optimizer_step",
    "on_validation_start",
    "on_validation_end",
)
"""Every hook, in the order the loop first reaches them."""


class Context:
    """What a hook sees. One object per run, updated in place as the loop goes.

    `model` and `optimizers` (by name; "optimizer" when `build` got a single one) are
    the live objects: a hook may change them. `epoch` and `iteration` say where the loop
    is (`iteration` counts the batches of the epoch). `output` is the last training
    step's `TrainOutput` and `loss` the loss about to be backpropagated (in
    `on_before_backward`). In the optimizer hooks, `optimizer_name` names the optimizer
    being stepped (`optimizer` is that optimizer). `values` holds the values of what just
    ended, by split and metric: in `on_epoch_end` the epoch's (`values["valid"]["Loss"]`,
    the numbers `history.jsonl` records), in `on_validation_end` that validation's
    (`{"valid": {...}}`, at an epoch's end or at a validation point). A decision made
    there (a learning rate annealed, a curriculum step) lands in the epoch's checkpoint,
    which is written after `on_epoch_end`."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Mapping[str, torch.optim.Optimizer],
        num_epochs: int,
    ) -> None:
        self.model = model
        self.optimizers = dict(optimizers)
        self.num_epochs = num_epochs
        self.epoch = 0
        self.iteration = 0
        self.output: Any = None
        self.loss: torch.Tensor | None = None
        self.values: dict[str, dict[str, float]] = {}
        self.optimizer_name: str = next(iter(self.optimizers), "")

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer being stepped (in the optimizer hooks), else the first one."""
        return self.optimizers[self.optimizer_name]


class Callback:
    """Base class of a callback: override the hooks you need (each takes the `Context`).

    Subclassing is optional: any object with at least one of the hook methods is a
    callback. A callback with state defines both `state_dict()` (tensors and plain
    values: numbers, strings, lists, dicts) and `load_state_dict(state)`.

    - `on_fit_start` / `on_fit_end`: once per `fit`, after a resumed state is loaded
      and before the first batch; after the last epoch.
    - `on_epoch_start` / `on_epoch_end`: around each epoch; `on_epoch_end` runs after
      validation and before the epoch's checkpoint, so the checkpoint holds what it did.
    - `on_before_backward` (`ctx.loss` is the loss) / `on_after_backward`: around the
      backward pass of every batch. The gradients are as backward left them: scaled
      under fp16, not clipped, and still accumulating under `grads_accumulation`.
    - `on_before_optimizer_step` / `on_after_optimizer_step`: around each optimizer
      step. Before it, the gradients are the step's whole gradient, unscaled under fp16
      and not yet clipped; after it, the weights are updated.
    - `on_validation_start` / `on_validation_end`: around each validation pass
      (`on_validation_end` runs even when validation fails).
    """

    def on_fit_start(self, ctx: Context) -> None: ...
    def on_fit_end(self, ctx: Context) -> None: ...
    def on_epoch_start(self, ctx: Context) -> None: ...
    def on_epoch_end(self, ctx: Context) -> None: ...
    def on_before_backward(self, ctx: Context) -> None: ...
    def on_after_backward(self, ctx: Context) -> None: ...
    def on_before_optimizer_step(self, ctx: Context) -> None: ...
    def on_after_optimizer_step(self, ctx: Context) -> None: ...
    def on_validation_start(self, ctx: Context) -> None: ...
    def on_validation_end(self, ctx: Context) -> None: ...


def defined_hooks(callback: Any) -> list[str]:
    """The hooks `callback` really implements (not the empty ones of `Callback`)."""
    found = []
    for name in HOOKS:
        method = getattr(callback, name, None)
        if not callable(method):
            continue
        if isinstance(callback, Callback) and getattr(type(callback), name) is getattr(
            Callback, name
        ):
            continue
        found.append(name)
    return found


def is_callback(obj: Any) -> bool:
    """Whether `obj` implements at least one hook (a metric may: `GradNormMetric`)."""
    return not isinstance(obj, type) and bool(defined_hooks(obj))


def check_callback(callback: Any) -> None:
    """Refuse, naming the fix, what cannot be a callback: a class, an object with no
    hook, a misspelt hook, a state without a way back."""
    name = type(callback).__name__
    if isinstance(callback, type):
        raise ConfigError(
            f"{callback.__name__} is a class, not a callback: pass an instance, e.g. "
            f"{callback.__name__}() with its arguments."
        )
    for attribute in dir(callback):
        if attribute.startswith("on_") and attribute not in HOOKS:
            close = difflib.get_close_matches(attribute, HOOKS, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise ConfigError(
                f"{name} has a method `{attribute}`, which is no callback hook{hint}: the "
                f"loop would never call it. The hooks are {', '.join(HOOKS)}."
            )
    if not defined_hooks(callback):
        raise ConfigError(
            f"{name} is not a callback: it defines none of the hooks "
            f"({', '.join(HOOKS)}). Subclass ember.train.callbacks.Callback and override "
            "the hooks you need."
        )
    saves = callable(getattr(callback, "state_dict", None))
    loads = callable(getattr(callback, "load_state_dict", None))
    if saves != loads:
        missing = "load_state_dict" if saves else "state_dict"
        raise ConfigError(
            f"{name} has {'state_dict' if saves else 'load_state_dict'} but no `{missing}`: a "
            "callback whose state is checkpointed needs both, so a resumed run gets it back."
        )


class Callbacks:
    """The run's callbacks, with one list of bound methods per hook (only the hooks
    they define), their shared `Context`, and their checkpointed state."""

    def __init__(self, callbacks: list[Any], ctx: Context) -> None:
        self.callbacks = list(callbacks)
        self.ctx = ctx
        self._hooks: dict[str, list[Any]] = {name: [] for name in HOOKS}
        for callback in self.callbacks:
            for name in defined_hooks(callback):
                self._hooks[name].append(getattr(callback, name))
        self.before_backward = bool(self._hooks["on_before_backward"])
        self.after_backward = bool(self._hooks["on_after_backward"])
        self.optimizer_steps = bool(
            self._hooks["on_before_optimizer_step"] or self._hooks["on_after_optimizer_step"]
        )
        self.keys = _state_keys(self.callbacks)

    def update(self, **fields: Any) -> None:
        """Set what the next hooks see (`epoch`, `iteration`, `output`, `loss`, `values`,
        `optimizer_name`, `num_epochs`): the one place the context is written."""
        ctx = self.ctx
        for name, value in fields.items():
            setattr(ctx, name, value)

    def call(self, hook: str) -> None:
        """Call `hook` of every callback that defines it, in registration order."""
        ctx = self.ctx
        for method in self._hooks[hook]:
            method(ctx)

    def has(self, hook: str) -> bool:
        return bool(self._hooks[hook])

    def state_dict(self) -> dict[str, Any]:
        """Each stateful callback's state, by a key made of its class name."""
        return {
            key: callback.state_dict()
            for key, callback in zip(self.keys, self.callbacks)
            if callable(getattr(callback, "state_dict", None))
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> list[str]:
        """Give each callback its saved state; return what is missing or left over."""
        notes = []
        wanted = {
            key: callback
            for key, callback in zip(self.keys, self.callbacks)
            if callable(getattr(callback, "load_state_dict", None))
        }
        for key, callback in wanted.items():
            if key in state:
                callback.load_state_dict(state[key])
            else:
                notes.append(
                    f"The checkpoint holds no state of the callback {key} (it was not "
                    "registered when the checkpoint was written): it starts afresh."
                )
        unused = [key for key in state if key not in wanted]
        if unused:
            notes.append(
                f"The checkpoint holds the state of callbacks ({', '.join(unused)}) that this "
                "run does not register: that state is not used."
            )
        return notes


def _state_keys(callbacks: list[Any]) -> list[str]:
    """`EMA`, `EMA#2`, ...: stable keys for the state of each callback."""
    keys, seen = [], {}  # type: ignore[var-annotated]
    for callback in callbacks:
        name = type(callback).__name__
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return keys
