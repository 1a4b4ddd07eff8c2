"""Custom optimization: a `train_step(batch, ctx)` that runs its own backward passes and
optimizer steps (a GAN's two optimizers, several losses, a step of its own making)
through `ctx`, so that accumulation, mixed precision, clipping, the callbacks, the
checkpoints and exact resume all still apply.

`LearnerBuilder.build(model, {"gen": opt_g, "disc": opt_d}, lr)` chooses it: the
optimizers are named, the model's `train_step` takes the `StepContext` as `ctx`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from typing import Any, Callable, Mapping

import torch

from ember.errors import ConfigError, TrainingError
from ember.lr.base import LrDriver
from ember.train.optimization import Optimization, needs_closure

log = logging.getLogger(__name__)


class OptimizerGroup:
    """Named optimizers seen as one by the checkpoints: its state holds each one's state
    and class, by name."""

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        self.optimizers = dict(optimizers)

    @property
    def description(self) -> str:
        return ", ".join(f"{name} {type(opt).__name__}" for name, opt in self.optimizers.items())

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's param groups, in order (the hyperparameters a resume compares)."""
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {
            name: {"class": type(opt).__name__, "state": opt.state_dict()}
            for name, opt in self.optimizers.items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise TrainingError(
                f"The checkpoint holds the optimizers {', '.join(map(repr, state))} and this "
                f"run names {', '.join(map(repr, self.optimizers))}: resume with the optimizers "
                "(and names) the run was started with."
            )
        for name, optimizer in self.optimizers.items():
            saved = state[name]["class"]
            if saved != type(optimizer).__name__:
                raise TrainingError(
                    f"The checkpoint's optimizer {name!r} is a {saved} and this run's is a "
                    f"{type(optimizer).__name__}: resume with {saved}, or start a new run "
                    "(LearnerBuilder(dir, overwrite=True))."
                )
            optimizer.load_state_dict(state[name]["state"])


class LrGroup:
    """One learning-rate driver per named optimizer, driven together."""

    def __init__(self, drivers: Mapping[str, LrDriver]) -> None:
        self.drivers = dict(drivers)

    @property
    def description(self) -> str:
        return ", ".join(
            f"{name} {type(driver.scheduler).__name__}" for name, driver in self.drivers.items()
        )

    @property
    def scheduler(self) -> LrGroup:
        return self  # the schedules are per optimizer; a constant rate is not compared

    @property
    def pending(self) -> Any:
        return next((d.pending for d in self.drivers.values() if d.pending is not None), None)

    def resolve(self, total_steps: int | None) -> None:
        for driver in self.drivers.values():
            driver.resolve(total_steps)

    def check_monitor(self, registered: Mapping[str, Any]) -> None:
        for driver in self.drivers.values():
            driver.check_monitor(registered)

    def check_interval(self, steps_per_epoch: int | None) -> str | None:
        for driver in self.drivers.values():
            warning = driver.check_interval(steps_per_epoch)
            if warning:
                return warning
        return None

    def before_step(self) -> float:
        """Set every optimizer's rate for the coming step; return the first one's."""
        rates = [driver.before_step() for driver in self.drivers.values()]
        return rates[0]

    def end_epoch(self, values: Mapping[str, Mapping[str, float]]) -> None:
        for driver in self.drivers.values():
            driver.end_epoch(values)

    def state_dict(self) -> dict[str, Any]:
        return {name: driver.state_dict() for name, driver in self.drivers.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, driver in self.drivers.items():
            if name not in state:
                raise TrainingError(
                    f"The checkpoint holds no learning-rate schedule of the optimizer {name!r}: "
                    "resume with the optimizers (and names) the run was started with."
                )
            driver.load_state_dict(state[name])


class ManualOptimization(Optimization):
    """The optimization of a run whose `train_step` steps its own optimizers."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizers: Mapping[str, torch.optim.Optimizer],
        drivers: Mapping[str, LrDriver],
        device: torch.device,
        mixed_precision: Any = None,
        clip_norm: float | None = None,
        clip_value: float | None = None,
        callbacks: Any = None,
    ) -> None:
        super().__init__(
            model,
            OptimizerGroup(optimizers),  # type: ignore[arg-type]
            LrGroup(drivers),  # type: ignore[arg-type]
            device,
            mixed_precision,
            clip_norm,
            clip_value,
            callbacks,
        )
        self.optimizers = dict(optimizers)
        self.drivers = dict(drivers)
        self.params = {
            name: [p for group in opt.param_groups for p in group["params"]]
            for name, opt in self.optimizers.items()
        }
        self.backwards = 0
        self.calls = 0
        self.scaled_steps = 0

    def step(self) -> None:
        """The end of one step of the loop: check that `train_step` used its `ctx`, and
        update the loss scale (fp16) once every optimizer has stepped."""
        if self.backwards == 0 or self.calls == 0:
            missing = "ctx.backward(loss)" if self.backwards == 0 else "ctx.step(optimizer)"
            raise TrainingError(
                f"{type(self.model).__name__}.train_step(batch, ctx) never called {missing}. "
                "With several optimizers the step runs its own backward passes and optimizer "
                "steps through ctx: ctx.backward(loss, 'name') instead of loss.backward(), "
                "ctx.step('name') instead of optimizer.step() (ember then accumulates, scales, "
                "clips and checkpoints them)."
            )
        self.backwards = self.calls = 0
        if self.scaler is not None and self.scaled_steps:
            self.scaler.update()
        self.scaled_steps = 0

    def skip(self) -> None:
        self.step()

    def prepare(self) -> None:
        pass  # the step's own ctx.step calls run the optimizer hooks


class StepContext:
    """The `ctx` a `train_step(batch, ctx)` gets under custom optimization.

    - `ctx.optimizers["gen"]`: the optimizers by name (to read, not to step directly).
    - `ctx.backward(loss, "gen")`: add the gradient of `loss` into the parameters of the
      optimizer "gen" only (`ctx.backward(loss)`: into every parameter). ember scales it
      for gradient accumulation and fp16, and checks that it is finite.
    - `ctx.step("gen")`: step that optimizer (its rate, clipping, the callbacks'
      optimizer hooks, then its gradients are cleared). Under `grads_accumulation(n)`
      it steps only at the last batch of each group of n, and does nothing before.
      `ctx.step("gen", closure=closure)` passes the closure an optimizer such as
      L-BFGS needs (its gradients are clipped after each evaluation).
    - `ctx.accumulating`: True on the batches where `ctx.step` does nothing.
    - `ctx.epoch`, `ctx.iteration`: where the loop is.
    """

    def __init__(self, optim: ManualOptimization, guard: Any) -> None:
        self._optim = optim
        self._guard = guard
        self.optimizers: Mapping[str, torch.optim.Optimizer] = optim.optimizers
        self.epoch = 0
        self.iteration = 0
        self.accumulating = False
        self.share = 1.0
        self.ok = True
        self.skipped = 0
        """Optimizer steps skipped for a non-finite loss."""
        self._tainted: set[str] = set()
        self._stepped: set[str] = set()
        dtype = optim._dtype
        self._full = (
            torch.autocast(optim.device.type, enabled=False)
            if dtype is not None
            else contextlib.nullcontext()
        )

    def begin(self, epoch: int, iteration: int, first: bool, last: bool, share: float) -> None:
        """A new batch of the loop (`first`/`last` of its group of accumulated batches)."""
        self.epoch, self.iteration = epoch, iteration
        self.accumulating, self.share = not last, share
        self.ok = True
        self._stepped.clear()
        if first:
            self._tainted.clear()
        callbacks = self._optim.callbacks
        if callbacks is not None:
            callbacks.update(epoch=epoch, iteration=iteration)

    def _name(self, optimizer: Any) -> str:
        if isinstance(optimizer, str) and optimizer in self.optimizers:
            return optimizer
        for name, known in self.optimizers.items():
            if optimizer is known:
                return name
        raise TrainingError(
            f"ctx got {optimizer!r}, which is none of the learner's optimizers: name one of "
            f"{', '.join(map(repr, self.optimizers))} (or pass that optimizer object)."
        )

    def backward(self, loss: torch.Tensor, optimizer: Any = None) -> None:
        """Add the gradient of `loss`, into one optimizer's parameters when named."""
        optim = self._optim
        name = None if optimizer is None else self._name(optimizer)
        optim.backwards += 1
        if not self._guard.check(loss, self.epoch, self.iteration):  # "skip": not finite
            self.ok = False
            self._tainted.update(self.optimizers if name is None else (name,))
            return
        with self._full:  # backward outside autocast, as torch advises
            optim.backward(loss, self.share, optim.params[name] if name is not None else None)

    def step(self, optimizer: Any, closure: Callable[[], Any] | None = None) -> Any:
        """Step one optimizer (at the end of a group of accumulated batches); with
        `closure`, a function that evaluates the loss again (clears the gradients, runs
        the forward, calls `ctx.backward(loss, name)`, returns the loss) for an optimizer
        whose step takes one (L-BFGS). Returns what the optimizer's step returns (L-BFGS:
        the closure's first loss), None when the step did not run."""
        optim = self._optim
        name = self._name(optimizer)
        if closure is None and needs_closure(self.optimizers[name]):
            raise TrainingError(
                f"ctx.step({name!r}) steps a {type(self.optimizers[name]).__name__}, whose step "
                "evaluates the loss again several times: pass the evaluation, "
                f"ctx.step({name!r}, closure=closure), with a closure that clears the "
                f"gradients, computes the loss, calls ctx.backward(loss, {name!r}) and "
                "returns the loss."
            )
        if name in self._stepped:
            raise TrainingError(
                f"train_step called ctx.step({name!r}) twice for one batch: an optimizer "
                "steps once per step of the loop. Add the losses (or call ctx.backward for "
                "each) and step once."
            )
        self._stepped.add(name)
        optim.calls += 1
        if self.accumulating:
            return None
        if name in self._tainted:
            self._tainted.discard(name)
            self.optimizers[name].zero_grad(set_to_none=True)
            self.skipped += 1
            message = (
                f"Skipped the step of the optimizer {name!r} at epoch {self.epoch}, iteration "
                f"{self.iteration}: non-finite loss (nonfinite_loss('skip'))."
            )
            log.warning("%s", message, extra={"ember_console": False})  # printed below
            print(f"ember: {message}", file=sys.stderr)
            return None
        params = optim.params[name]
        evaluate = None if closure is None else optim.clipped(closure, params)
        returned = optim.apply(
            self.optimizers[name], params, optim.drivers[name], name, closure=evaluate
        )
        if optim.scaler is not None:
            optim.scaled_steps += 1
        return returned


def takes_context(model: Any) -> bool:
    """Whether `model.train_step` takes a second argument (the step context)."""
    try:
        parameters = inspect.signature(model.train_step).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)


def check_manual(model: Any, optimizers: Mapping[str, Any], lr: Any) -> None:
    """At build: the model's step takes `ctx`, the optimizers are named and disjoint,
    the rates name the same optimizers."""
    name = type(model).__name__
    if not optimizers:
        raise ConfigError("build() got an empty dict of optimizers: name at least one.")
    for key in optimizers:
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"build() names its optimizers with strings, e.g. {{'gen': ..., 'disc': ...}}; "
                f"got the key {key!r}."
            )
    configs = [
        key for key, value in optimizers.items() if not isinstance(value, torch.optim.Optimizer)
    ]
    if len(optimizers) > 1 and configs:
        raise ConfigError(
            f"build() got an optimizer config for {', '.join(map(repr, configs))} among several "
            "optimizers: ember would bind it to every parameter of the model. Create each "
            "torch optimizer on its own part of the model, e.g. "
            "{'gen': torch.optim.Adam(model.generator.parameters()), 'disc': ...}."
        )
    if not takes_context(model):
        raise ConfigError(
            f"build() got several optimizers ({', '.join(map(repr, optimizers))}), so "
            f"{name}.train_step runs its own optimization and must take the step context: "
            "def train_step(self, batch, ctx), calling ctx.backward(loss, 'name') and "
            "ctx.step('name'). With a single optimizer that ember steps, pass it alone."
        )
    if isinstance(lr, Mapping) and set(lr) != set(optimizers):
        raise ConfigError(
            f"build() got learning rates for {', '.join(map(repr, lr))} and optimizers "
            f"{', '.join(map(repr, optimizers))}: give one rate per optimizer, by the same "
            "names (or one float for all)."
        )


def check_automatic(model: Any) -> None:
    """At build, a single optimizer: a step that wants a `ctx` cannot get one."""
    if takes_context(model):
        raise ConfigError(
            f"{type(model).__name__}.train_step takes a second argument (a step context), "
            "which the Learner gives under custom optimization only: pass the optimizers by "
            "name, e.g. build(model, {'main': optimizer}, lr), and step them with "
            "ctx.backward(loss) and ctx.step('main'). Or define train_step(self, batch) and "
            "let ember run backward and the optimizer step."
        )
