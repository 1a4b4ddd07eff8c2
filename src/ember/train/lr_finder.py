"""The learning-rate range test: `learner.lr_find(train)` (or `lr_find(learner, train)`).

The suggestion comes from the loss's curvature where the model stands: the largest
eigenvalue of the Hessian of the mean loss over the first few training batches (by
Lanczos iteration on Hessian-vector products, preconditioned as Adam preconditions its
steps; `ember.train.curvature`), turned into the optimizer's largest stable rate (plain
SGD on a quadratic is stable below 2 / lambda) and suggested at `SAFETY` times it: a
rate within 2x below the largest stable one. A rising-rate curve cannot tell this
limit: while the rate rises, the steep directions converge before the rate passes
their limit, and the curve turns up only 1.3 to 4 times past it.

The curve is drawn all the same: the model trains on one mini-batch after another
while the learning rate rises from `start` to `end` (exponentially, or linearly), one
rate per optimizer step. The smoothed loss is a centred weighted median (weights
`smoothing ** distance`), which follows the raw loss without lag and ignores one
batch's spike; the test stops early when the running (one-sided) median exceeds
`diverge` times its lowest value, or a loss is not finite. Each step's `ratio` is the
loss it removed from its own batch (the batch again after the step, with the same
random numbers) over the loss its gradient promised to remove; the `edge` is the first
rate at which the steps stop lowering their own batch's loss (the median of three
neighbouring ratios is 0 or below). Where no curvature can be measured (an optimizer
without a stability rule, a model without second derivatives) the suggestion is half
that edge, or without an edge the steepest fall of the smoothed loss, and the result's
`notes` say so, as they say when the rates stop below the largest stable rate.

Afterwards the model's weights and buffers, the optimizer's state and rates, the
gradient scaler, the gradients, the model's mode and every random generator are put
back exactly as they were: a `fit` after `lr_find` trains as it would have without it.
The curve is written to `ARTIFACT_DIR/lr-find.json`, which `ember plot` draws.
"""

from __future__ import annotations

import copy
import itertools
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
from ember.train.curvature import StabilityRule, curvature, stability_rule
from ember.train.files.artifacts import Artifacts
from ember.train.optimization import Optimization
from ember.train.step import check_steps, check_train_output

FORMAT = "ember-lr-find"
VERSION = 3
"""Version 2 added each step's `ratios` and the `edge`, version 3 the `curvature`, the
`limit`, the `rule` and the `notes`; versions 1 and 2 still load."""

SAFETY = 0.7
"""The suggestion is this share of the largest stable rate the curvature gives: below
it where the curvature is measured a little low (a few Lanczos steps, a few batches),
and within 2x of it where the curvature is measured a little high."""

CURVATURE_RULE = "curvature"
EDGE_RULE = "half the edge"
FALL_RULE = "steepest fall"


@dataclass
class LrFinderResult:
    """The range test's curve: one learning rate and loss per optimizer step taken, and
    the suggestion with what it was read from."""

    lrs: list[float]
    losses: list[float]
    """The loss of each step's mini-batch, as computed."""
    smoothed: list[float]
    """The losses smoothed: a centred weighted median (weights `smoothing ** distance`)."""
    suggestion: float | None
    """`SAFETY` times the largest stable rate (`limit`, from the curvature); without a
    measured curvature, half the `edge`, or the rate where the smoothed loss falls
    fastest; None when nothing can be read (`notes` says why)."""
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
    test diverged); None when the rates never got there. Often 1.3 to 4 times the
    largest stable rate: the steep directions have converged before it."""
    curvature: float | None = None
    """The largest eigenvalue of the loss's Hessian at the model's parameters (of the
    Hessian preconditioned by the second moments, for Adam); None when not measured."""
    limit: float | None = None
    """The largest stable rate the curvature gives for the optimizer (2 / `curvature`
    for plain SGD); None when not measured."""
    rule: str | None = None
    """What the suggestion was read from: "curvature", "half the edge", "steepest fall"."""
    notes: list[str] = field(default_factory=list)
    """What the user should know: the rates stopped below the `limit`, no curvature
    could be measured, and why."""

    @property
    def reached(self) -> bool:
        """The rates went past the largest stable rate (the `limit`, else the `edge`):
        the curve shows where training stops being stable."""
        if self.limit is not None:
            return bool(self.lrs) and self.lrs[-1] >= self.limit
        return self.edge is not None

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
            "curvature": self.curvature,
            "limit": self.limit,
            "rule": self.rule,
            "suggestion": self.suggestion,
            "diverged": self.diverged,
            "notes": self.notes,
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
        if data.get("version") not in (1, 2, VERSION):
            raise EmberError(
                f"{file} has version {data.get('version')!r}; this ember reads 1 to {VERSION}."
            )
        suggestion = _optional(data.get("suggestion"))
        edge = _optional(data.get("edge"))
        rule = data.get("rule")
        if rule is None and suggestion is not None:  # versions 1 and 2: read from the curve
            rule = EDGE_RULE if edge is not None else FALL_RULE
        return cls(
            [float(v) for v in data["lrs"]],
            [float(v) for v in data["losses"]],
            [float(v) for v in data["smoothed"]],
            suggestion,
            str(data.get("mode", "exp")),
            bool(data.get("diverged", False)),
            file,
            [float(v) for v in data.get("ratios", [])],
            edge,
            _optional(data.get("curvature")),
            _optional(data.get("limit")),
            None if rule is None else str(rule),
            [str(v) for v in data.get("notes", [])],
        )


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)


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
    """The suggestion read from the curve alone, where no curvature is measured: half
    the rate at the edge (`stability_edge` of the steps' `ratios`, else the last rate
    of a test that `diverged`); without an edge, the rate of the steepest fall of the
    smoothed loss before its lowest point (`steepest_fall`). Often past the largest
    stable rate: the edge lies 1.3 to 4 times beyond it."""
    edge = stability_edge(lrs, ratios)
    if edge is None and diverged and lrs:
        edge = lrs[-1]
    if edge is not None:
        return edge / 2
    return steepest_fall(lrs, smoothed, mode)


def smooth(losses: Sequence[float], factor: float) -> list[float]:
    """Each loss replaced by the weighted median of the finite losses around it, with
    weights `factor ** distance`, as far on each side (fewer near the ends): centred, so
    it follows the losses without lag, and a median, so one batch's spike does not move
    it (NaN where the loss is not finite)."""
    reach, last = _reach(factor), len(losses) - 1
    smoothed = []
    for index, value in enumerate(losses):
        side = min(reach, index, last - index)  # as far each way: no lag at the ends
        median = _weighted_median(losses, index, index - side, index + side + 1, factor)
        smoothed.append(median if math.isfinite(value) else math.nan)
    return smoothed


def running_median(losses: Sequence[float], factor: float) -> float:
    """The weighted median of the losses up to the last (weights `factor ** age`): the
    one-sided smoothing that decides, while the test runs, whether it diverged."""
    last = len(losses) - 1
    return _weighted_median(losses, last, max(0, last - _reach(factor)), last + 1, factor)


def _reach(factor: float) -> int:
    """How far the weights reach before they fall below a thousandth."""
    return 0 if factor <= 0 else math.ceil(math.log(1e-3) / math.log(factor))


def _weighted_median(
    values: Sequence[float], centre: int, low: int, high: int, factor: float
) -> float:
    pairs = sorted(
        (v, factor ** abs(i - centre) if factor > 0 else float(i == centre))
        for i, v in enumerate(values[low:high], start=low)
        if math.isfinite(v)
    )
    half = sum(w for _, w in pairs) / 2
    total = 0.0
    for value, weight in pairs:
        total += weight
        if total >= half:
            return value
    return math.nan


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


def _check(
    start: Any, end: Any, steps: Any, mode: Any, smoothing: Any, diverge: Any, batches: Any
) -> None:
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
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 0:
        raise ConfigError(
            f"lr_find(curvature_batches=...) must be an int >= 0 (0: no curvature, the "
            f"suggestion is read from the curve), got {batches!r}."
        )


def _batches(loader: Iterable[Any]) -> Iterator[tuple[int, Any]]:
    """The loader's batches with the pass they come from (0, 1, ...): the loader is
    read again from its start when it runs out."""
    passes = 0
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield passes, batch
        if empty or iter(loader) is loader:  # an empty loader, or a one-pass iterator
            return
        passes += 1


def _first_pass(stream: Iterator[tuple[int, Any]], count: int) -> tuple[list[Any], list[Any]]:
    """Up to `count` batches of the loader's first pass, and the batch of the next pass
    read to find that the first had ended (none, or one)."""
    sample: list[Any] = []
    over: list[Any] = []
    while len(sample) < count:
        item = next(stream, None)
        if item is None:
            break
        if item[0] > 0:
            over.append(item[1])
            break
        sample.append(item[1])
    return sample, over


def lr_find(
    learner: Any,
    train: Iterable[Any],
    *,
    start: float = 1e-7,
    end: float = 10.0,
    steps: int = 100,
    mode: str = "exp",
    smoothing: float = 0.8,
    diverge: float = 4.0,
    curvature_batches: int = 8,
) -> LrFinderResult:
    """Run the range test with `learner`'s model, optimizer, device, mixed precision
    and clipping on `train`, the curvature on its first `curvature_batches` batches
    (0: none, the suggestion is read from the curve); put everything back; write
    `lr-find.json`; return the curve and the suggestion."""
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
        curvature_batches=curvature_batches,
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
    curvature_batches: int = 8,
) -> LrFinderResult:
    """`lr_find` on its parts: `model` (with its `train_step`) trains on `train` on
    `device` through `optim` (its optimizer, mixed precision and clipping); `devices`
    are the run's devices (one at most); the curve is written to `artifact_dir`."""
    _check(start, end, steps, mode, smoothing, diverge, curvature_batches)
    if devices is not None and len(devices) > 1:
        raise ConfigError(
            "lr_find runs in this process, on one device: build a learner with one device "
            "for the range test, then train on several."
        )
    optimizer = optim.optimizer
    check_steps(model)
    rule = stability_rule(optimizer) if curvature_batches else None
    notes: list[str] = []
    if curvature_batches and rule is None:
        notes.append(
            f"ember has no stability rule for {type(optimizer).__name__} (it has for SGD, "
            "Adam and AdamW): the suggestion is read from the curve, a rate to start "
            "from, not checked against the largest stable rate."
        )
    saved = _Saved(model, optim)
    lrs: list[float] = []
    losses: list[float] = []
    ratios: list[float] = []
    diverged = False
    measured: float | None = None
    try:
        model.train()
        stream = _batches(train)
        sample, over = _first_pass(stream, curvature_batches if rule is not None else 0)
        if rule is not None and sample:
            measured = _curvature(model, optim, device, sample, rule, notes)
        batches = itertools.chain(sample, over, (batch for _, batch in stream))
        del sample, over
        best = math.inf
        for index, lr in enumerate(rates(float(start), float(end), steps, mode)):
            batch = next(batches, None)
            if batch is None:
                break
            for group in optimizer.param_groups:
                group["lr"] = lr
            value, ratio = _step(model, optim, device, batch, index)
            lrs.append(lr)
            losses.append(value)
            ratios.append(ratio)
            current = running_median(losses, smoothing)
            if not math.isfinite(value) or (index > 0 and current > diverge * best):
                diverged = True
                break
            best = min(best, current)
    finally:
        saved.restore(model, optim)
    if not lrs:
        raise TrainingError("lr_find: the training data loader yielded no batch.")
    smoothed = smooth(losses, smoothing)
    edge = stability_edge(lrs, ratios) or (lrs[-1] if diverged else None)
    limit = None if rule is None or measured is None else rule.limit(measured)
    if rule is not None and measured is not None and limit is None:
        notes.append(
            f"the loss curves nowhere upward here (largest Hessian eigenvalue {measured:.4g}):"
            " no rate is unstable for a quadratic; the suggestion is read from the curve."
        )
    if limit is not None:
        suggestion: float | None = SAFETY * limit
        how: str | None = CURVATURE_RULE
        if lrs[-1] < limit and diverged:
            suggestion = SAFETY * lrs[-1]
            notes.append(
                f"the curve diverged at {lrs[-1]:.4g}, below the largest stable rate "
                f"{limit:.4g} the curvature gives where the model started: the suggestion "
                f"is {SAFETY:g} times the rate it diverged at instead, a rate to start from."
            )
        elif lrs[-1] < limit:
            notes.append(
                f"the rates stopped at {lrs[-1]:.4g}, below the largest stable rate "
                f"{limit:.4g}: the curve does not reach the edge (raise `end` to see it); "
                "the suggestion comes from the curvature."
            )
    else:
        suggestion = suggest(lrs, smoothed, mode, ratios, diverged)
        how = None if suggestion is None else EDGE_RULE if edge is not None else FALL_RULE
        if how == FALL_RULE:
            notes.append(
                f"the rates stopped at {lrs[-1]:.4g}, before the steps stopped lowering the "
                "loss: the curve does not reach the edge (raise `end`); the suggestion is "
                "the steepest fall of the smoothed loss, well below the edge."
            )
    result = LrFinderResult(
        lrs,
        losses,
        smoothed,
        suggestion,
        mode,
        diverged,
        ratios=ratios,
        edge=edge,
        curvature=measured,
        limit=limit,
        rule=how,
        notes=notes,
    )
    result.path = _write(Artifacts(artifact_dir), result)
    return result


def _curvature(
    model: Any,
    optim: Optimization,
    device: torch.device,
    sample: list[Any],
    rule: StabilityRule,
    notes: list[str],
) -> float | None:
    """`curvature` of the model's loss on `sample` (the loader's first batches); None,
    with a note, where it cannot be measured."""
    moved = [to_device(b, device) for b in sample] if device.type != "cpu" else sample
    checked: list[bool] = []

    def forward(batch: Any) -> torch.Tensor:
        try:
            with optim.autocast():
                output = model.train_step(batch)
        except Exception as error:
            if hasattr(error, "add_note"):
                error.add_note(
                    "ember: raised by train_step while lr_find measured the curvature; the "
                    f"batch was {describe(batch)}"
                )
            raise
        if not checked:
            check_train_output(model, output)
            checked.append(True)
        return output.loss * scale if scale != 1.0 else output.loss

    scale = float(optim.scaler.get_scale()) if optim.scaler is not None else 1.0
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return None  # nothing trains: no rate is unstable
    try:
        value = curvature(forward, params, moved, optim.optimizer, rule, scale)
    except RuntimeError as error:
        notes.append(
            f"the curvature could not be measured ({str(error).splitlines()[0]}): the "
            "suggestion is read from the curve, a rate to start from."
        )
        return None
    if not math.isfinite(value):
        notes.append(
            "the curvature is not finite at the model's parameters: the suggestion is read "
            "from the curve, a rate to start from."
        )
        return None
    return value


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
