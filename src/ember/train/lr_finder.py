"""The learning-rate range test: `learner.lr_find(train)` (or `lr_find(learner, train)`).

The model trains on one mini-batch after another while the learning rate rises from
`start` to `end` (exponentially, or linearly), one rate per optimizer step. The loss is
smoothed (an exponential moving average with bias correction); the test stops early
when the smoothed loss exceeds `diverge` times its lowest value (or a loss is not
finite).

The suggestion reads how well each step does on the batch it was computed on: after
the step, the same batch goes through the model again (without gradients, with the
same random numbers, so dropout draws the same masks), and the step's `ratio` is the
loss it removed over the loss its gradient promised to remove (the first-order
prediction, the gradient dotted with the step). For plain SGD on a quadratic the ratio
is 1 - rate * k / 2 along the step (k: the curvature along it): 1 for tiny rates, 0.5
at the best rate along the step, 0 at the largest stable rate 2 / k, below 0 past it.
The `edge` is the first rate at which the steps stop lowering their own batch's loss
(the median of a step's ratio and its two neighbours' is 0 or below), or where the
test stopped at divergence; the suggestion is half the edge: the rate that is best
along the steps, half the largest stable rate. With momentum or an adaptive optimizer
(Adam) the step is shaped by the optimizer's state, and the suggestion is a rate to
start from. A test whose rates never reach the edge (an `end` too low) suggests the
rate where the smoothed loss falls fastest before its lowest point instead.

Afterwards the model's weights and buffers, the optimizer's state and rates, the
gradient scaler, the gradients, the model's mode and every random generator are put
back exactly as they were: a `fit` after `lr_find` trains as it would have without it.
The curve is written to `ARTIFACT_DIR/lr-find.json`, which `ember plot` draws.
"""

from __future__ import annotations

import copy
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from ember.data.device import describe, to_device
from ember.durable import atomic_write_bytes
from ember.errors import ConfigError, EmberError, TrainingError
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.files.artifacts import Artifacts
from ember.train.optimization import Optimization
from ember.train.step import check_steps, check_train_output

FORMAT = "ember-lr-find"
VERSION = 2
"""Version 2 adds each step's `ratios` and the `edge`; version 1 files still load."""


@dataclass
class LrFinderResult:
    """The range test's curve: one learning rate and loss per optimizer step taken."""

    lrs: list[float]
    losses: list[float]
    """The loss of each step's mini-batch, as computed."""
    smoothed: list[float]
    """The losses smoothed (exponential moving average, bias-corrected)."""
    suggestion: float | None
    """Half the `edge` (see the module's text): the rate that is best along the steps,
    about half the largest stable rate; without an edge, the rate where the smoothed
    loss falls fastest; None when the curve is too short."""
    mode: str = "exp"
    diverged: bool = False
    """The test stopped early: the smoothed loss rose past `diverge` times its lowest."""
    path: Path | None = field(default=None)
    """Where the curve was written (`lr-find.json`)."""
    ratios: list[float] = field(default_factory=list)
    """Per step: the loss it removed from its own batch over the loss its gradient
    promised to remove (NaN where that promise is too small to measure)."""
    edge: float | None = None
    """The first rate at which the steps stop lowering their own batch's loss (or the
    test diverged); None when the rates never got there."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "mode": self.mode,
            "lrs": self.lrs,
            "losses": [_number(v) for v in self.losses],
            "smoothed": [_number(v) for v in self.smoothed],
            "ratios": [_number(v) for v in self.ratios],
            "edge": self.edge,
            "suggestion": self.suggestion,
            "diverged": self.diverged,
        }

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LrFinderResult:
        """Read `lr-find.json`; a missing or foreign file is an `EmberError` naming it."""
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise EmberError(f"{file} is not a readable learning-rate test: {error}.") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise EmberError(f"{file} is not an ember learning-rate test (no format {FORMAT!r}).")
        if data.get("version") not in (1, VERSION):
            raise EmberError(
                f"{file} has version {data.get('version')!r}; this ember reads 1 and {VERSION}."
            )
        return cls(
            [float(v) for v in data["lrs"]],
            [float(v) for v in data["losses"]],
            [float(v) for v in data["smoothed"]],
            None if data.get("suggestion") is None else float(data["suggestion"]),
            str(data.get("mode", "exp")),
            bool(data.get("diverged", False)),
            file,
            [float(v) for v in data.get("ratios", [])],
            None if data.get("edge") is None else float(data["edge"]),
        )


def _number(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def rates(start: float, end: float, steps: int, mode: str) -> list[float]:
    """The `steps` learning rates from `start` to `end`, both included."""
    if mode == "exp":
        ratio = end / start
        return [start * ratio ** (i / (steps - 1)) for i in range(steps)]
    return [start + (end - start) * i / (steps - 1) for i in range(steps)]


def stability_edge(lrs: Sequence[float], ratios: Sequence[float]) -> float | None:
    """The first rate at which the steps stop lowering the loss of their own batch: the
    median of a step's ratio and its measurable neighbours' (one on each side) is 0 or
    below. None when no step got there."""
    for index, ratio in enumerate(ratios):
        if not math.isfinite(ratio):
            continue
        window = [r for r in ratios[max(0, index - 1) : index + 2] if math.isfinite(r)]
        if len(window) >= 2 and statistics.median(window) <= 0:
            return lrs[index]
    return None


def suggest(
    lrs: list[float],
    smoothed: list[float],
    mode: str,
    ratios: Sequence[float] = (),
    diverged: bool = False,
) -> float | None:
    """Half the rate at the edge of stability (`stability_edge` of the steps' `ratios`,
    else the last rate of a test that `diverged`); without an edge, the rate of the
    steepest fall of the smoothed loss before its lowest point (`steepest_fall`)."""
    edge = stability_edge(lrs, ratios)
    if edge is None and diverged and lrs:
        edge = lrs[-1]
    if edge is not None:
        return edge / 2
    return steepest_fall(lrs, smoothed, mode)


def steepest_fall(lrs: list[float], smoothed: list[float], mode: str) -> float | None:
    """The rate of the steepest fall of the smoothed loss before its lowest point. The
    slope at each point is taken across its neighbours (a twentieth of the curve on
    each side, at least 2), so that one noisy batch does not make a steep fall; the
    first tenth of the curve (at most 10 points) is left out while the average settles."""
    finite = [i for i, v in enumerate(smoothed) if math.isfinite(v)]
    if len(finite) < 3:
        return None
    lowest = min(finite, key=lambda i: smoothed[i])
    curve = [i for i in finite if i <= lowest]
    if len(curve) < 2:
        return None
    xs = [math.log10(lrs[i]) if mode == "exp" else lrs[i] for i in curve]
    ys = [smoothed[i] for i in curve]
    half = max(2, len(finite) // 20)
    skip = min(10, len(finite) // 10, len(curve) - 1)
    best: tuple[float, int] | None = None
    for k in range(skip, len(curve)):
        a, b = max(0, k - half), min(len(curve) - 1, k + half)
        slope = (ys[b] - ys[a]) / (xs[b] - xs[a])
        if best is None or slope < best[0]:
            best = (slope, k)
    return None if best is None else lrs[curve[best[1]]]


def _check(start: Any, end: Any, steps: Any, mode: Any, smoothing: Any, diverge: Any) -> None:
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ConfigError(f"lr_find({name}=...) must be a learning rate > 0, got {value!r}.")
    if not end > start:
        raise ConfigError(f"lr_find needs end > start, got start={start!r}, end={end!r}.")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ConfigError(f"lr_find(steps=...) must be an int >= 2, got {steps!r}.")
    if mode not in ("exp", "linear"):
        raise ConfigError(f"lr_find(mode=...) takes 'exp' or 'linear', got {mode!r}.")
    if not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
        raise ConfigError(f"lr_find(smoothing=...) must be in [0, 1), got {smoothing!r}.")
    if not isinstance(diverge, (int, float)) or not diverge > 1:
        raise ConfigError(f"lr_find(diverge=...) must be a factor > 1, got {diverge!r}.")


def _batches(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, read again from its start when it runs out."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty or iter(loader) is loader:  # an empty loader, or a one-pass iterator
            return


def lr_find(
    learner: Any,
    train: Iterable[Any],
    *,
    start: float = 1e-7,
    end: float = 10.0,
    steps: int = 100,
    mode: str = "exp",
    smoothing: float = 0.98,
    diverge: float = 4.0,
) -> LrFinderResult:
    """Run the range test with `learner`'s model, optimizer, device, mixed precision
    and clipping on `train`; put everything back; write `lr-find.json`; return the curve."""
    return range_test(
        learner.model,
        learner.optim,
        train,
        device=learner.device,
        devices=learner.devices,
        artifact_dir=learner.artifact_dir,
        start=start,
        end=end,
        steps=steps,
        mode=mode,
        smoothing=smoothing,
        diverge=diverge,
    )


def range_test(
    model: Any,
    optim: Optimization,
    train: Iterable[Any],
    *,
    device: torch.device,
    devices: Sequence[Any] | None,
    artifact_dir: str | os.PathLike[str],
    start: float,
    end: float,
    steps: int,
    mode: str,
    smoothing: float,
    diverge: float,
) -> LrFinderResult:
    """`lr_find` on its parts: `model` (with its `train_step`) trains on `train` on
    `device` through `optim` (its optimizer, mixed precision and clipping); `devices`
    are the run's devices (one at most); the curve is written to `artifact_dir`."""
    _check(start, end, steps, mode, smoothing, diverge)
    if devices is not None and len(devices) > 1:
        raise ConfigError(
            "lr_find runs in this process, on one device: build a learner with one device "
            "for the range test, then train on several."
        )
    optimizer = optim.optimizer
    check_steps(model)
    saved = _Saved(model, optim)
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    ratios: list[float] = []
    diverged = False
    try:
        average, best = 0.0, math.inf
        model.train()
        batches = _batches(train)
        for index, lr in enumerate(rates(float(start), float(end), steps, mode)):
            batch = next(batches, None)
            if batch is None:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr
            value, ratio = _step(model, optim, device, batch, index)
            average = smoothing * average + (1 - smoothing) * value
            current = average / (1 - smoothing ** (index + 1)) if smoothing else value
            lrs.append(lr)
            losses.append(value)
            ratios.append(ratio)
            smoothed.append(current if math.isfinite(value) else math.nan)
            if not math.isfinite(value) or (index > 0 and current > diverge * best):
                diverged = True
                break
            best = min(best, current)
    finally:
        saved.restore(model, optim)
    if not lrs:
        raise TrainingError("lr_find: the training data loader yielded no batch.")
    edge = stability_edge(lrs, ratios) or (lrs[-1] if diverged else None)
    suggestion = suggest(lrs, smoothed, mode, ratios, diverged)
    result = LrFinderResult(
        lrs, losses, smoothed, suggestion, mode, diverged, ratios=ratios, edge=edge
    )
    result.path = _write(Artifacts(artifact_dir), result)
    return result


MEASURABLE = 1e-6
"""A step's promised decrease smaller than this share of its loss is not measured (the
loss's own rounding would decide its ratio)."""


def _step(
    model: Any, optim: Optimization, device: torch.device, batch: Any, index: int
) -> tuple[float, float]:
    """One optimizer step on `batch` at the rate already set: its loss, and the ratio of
    the loss it removed from `batch` to the loss its gradient promised to remove."""
    if device.type != "cpu":
        batch = to_device(batch, device)
    rng = capture_rng_state()
    try:
        with optim.autocast():
            output = model.train_step(batch)
    except Exception as error:
        if hasattr(error, "add_note"):
            error.add_note(
                f"ember: raised by train_step at step {index + 1} of lr_find; the batch was "
                f"{describe(batch)}"
            )
        raise
    if index == 0:
        check_train_output(model, output)
    loss = output.loss
    value = float(loss.detach())
    if not math.isfinite(value):
        optim.skip()
        return value, math.nan
    optim.backward(loss, 1.0)
    if optim.closes:  # L-BFGS: this was the closure's first evaluation
        optim.closure = optim.reevaluation(lambda: model.train_step(batch).loss, loss, 1.0)
    params = [p for p in model.parameters() if p.grad is not None]
    scale = float(optim.scaler.get_scale()) if optim.scaler is not None else 1.0
    grads = [p.grad.detach().clone() for p in params]  # type: ignore[union-attr]
    before = [p.detach().clone() for p in params]
    optim.bare_step()
    with torch.no_grad():
        moves = torch._foreach_sub([p.detach() for p in params], before)
        promised = sum(float(torch.sum(g.double() * m.double())) for g, m in zip(grads, moves))
    promised /= scale
    del grads, before, moves
    if not promised < -MEASURABLE * abs(value):
        return value, math.nan
    after = capture_rng_state()
    restore_rng_state(rng)  # the same random numbers: dropout draws the same masks
    try:
        with torch.no_grad(), optim.autocast():
            again = float(model.train_step(batch).loss)
    finally:
        restore_rng_state(after)
    return value, (again - value) / promised


class _Saved:
    """Everything the range test changes, copied before it starts."""

    def __init__(self, model: torch.nn.Module, optim: Optimization) -> None:
        self.model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optimizer = copy.deepcopy(optim.optimizer.state_dict())
        self.scaler = copy.deepcopy(optim.scaler.state_dict()) if optim.scaler is not None else None
        self.grads = [
            None if p.grad is None else p.grad.detach().clone() for p in model.parameters()
        ]
        self.training = model.training
        self.rng = capture_rng_state()

    def restore(self, model: torch.nn.Module, optim: Optimization) -> None:
        model.load_state_dict(self.model)
        optim.optimizer.load_state_dict(self.optimizer)
        if optim.scaler is not None and self.scaler is not None:
            optim.scaler.load_state_dict(self.scaler)
        for parameter, grad in zip(model.parameters(), self.grads):
            parameter.grad = grad
        model.train(self.training)
        restore_rng_state(self.rng)


def _write(artifacts: Artifacts, result: LrFinderResult) -> Path:
    artifacts.check_writable()
    path = artifacts.lr_find
    text = json.dumps(result.to_json(), indent=1, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
    return path
