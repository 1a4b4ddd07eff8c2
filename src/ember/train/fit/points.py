"""Validation inside an epoch (`LearnerBuilder.valid_every(n)`).

Every `n` optimizer steps of an epoch (but its last, which the end-of-epoch validation
covers), the loop hands over to `ValidationPoints.run`: the model runs `valid_step` on
the whole validation loader (the one evaluation pass, `evaluation.py`), the values go
to `valid/epoch-N/iteration-K/<Metric>.log` (K: the training batches done in the
epoch), to the run history's points, to the renderer (its optional `valid_point`) and
to the listeners (`ValidPoint`). A model that carries state across batches
(`on_split_start`) validates on a copy told "valid", so the training batches after the
point carry on from the training state. Then the model is back in its mode and every random
generator is put back as it was, so the training that follows is the same, batch for
batch, as without the point: a run stopped and resumed around a point ends equal to
one never stopped. Early stopping that counts points judges every validation of the
run in order (`early_stop`, `stop_at_point`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from ember.durable import atomic_write_bytes
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.events import ValidPoint
from ember.train.files.artifacts import Artifacts
from ember.train.files.metric_files import add_lines, write_matrix
from ember.train.fit.evaluation import evaluating, model_copy, run_pass
from ember.train.history import Points, RunHistory
from ember.train.length.batches import BatchPlanner
from ember.train.length.duration import Counters, Duration, crossed
from ember.train.length.epoch_plan import Step
from ember.train.logger.base import MetricRecord
from ember.train.metric.base import RegisteredMetric
from ember.train.processor import MetricsProcessor


class PointLogger:
    """Writes one validation point's metric logs, each file whole and atomically once
    the point is done (a point's folder is complete or absent)."""

    def __init__(self, artifacts: Artifacts, iteration: int) -> None:
        self.artifacts = artifacts
        self.iteration = iteration
        self._lines: dict[str, list[str]] = {}

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        add_lines(self._lines, records)

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        for name, lines in self._lines.items():
            path = self.artifacts.point_log(epoch, self.iteration, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, "".join(lines).encode("utf-8"))
        self._lines.clear()

    def close(self) -> None:
        self._lines.clear()


def stateful_copy(model: torch.nn.Module, evaluation: Any) -> tuple[torch.nn.Module, str | None]:
    """The model a point validates, and the split it is told. A model that carries state
    across batches (`on_split_start`) validates on a copy told "valid", as validation at
    an epoch's end starts afresh, while the live model keeps its training state for the
    batches after the point; any other model validates as it is. A sharded model (FSDP,
    validated under `no_grad`) cannot be copied: it validates as it is."""
    if not callable(getattr(model, "on_split_start", None)) or evaluation is torch.no_grad:
        return model, None
    copied = model_copy(
        model, "a validation point runs on the live model, from the state training left"
    )
    return copied, None if copied is model else "valid"


class ValidationPoints:
    """Decides when a point is due and runs it."""

    def __init__(
        self,
        every: int | Duration,
        accumulation: int,
        metrics: Sequence[RegisteredMetric],
        artifacts: Artifacts,
        history: RunHistory,
        autocast: Callable[[], Any],
    ) -> None:
        self.every = every
        self.accumulation = accumulation
        self.metrics = tuple(metrics)
        self.artifacts = artifacts
        self.history = history
        self.autocast = autocast

    def due(self, step: Step, total: int | None, before: Counters, after: Counters) -> bool:
        """After this step (which took the run's counters from `before` to `after`): the
        `every`-th optimizer step of the epoch (counted from its first batch), or the
        step that passes a multiple of a sample or token duration; not the epoch's last
        step, and every process still has batches."""
        last = step.first + len(step.batches) - 1
        if not step.may_vote:
            return False
        if isinstance(self.every, Duration):
            if not crossed(self.every, before, after):
                return False
        elif ((step.first - 1) // self.accumulation + 1) % self.every:
            return False
        return total is None or last < total

    def run(
        self,
        model: torch.nn.Module,
        planner: BatchPlanner,
        epoch: int,
        num_epochs: int,
        iteration: int,
        device: torch.device,
        dist: Any,
        renderer: Any,
        emit: Callable[[Any], None],
        evaluation: Callable[[], Any] = torch.inference_mode,
        counters: Mapping[str, int] | None = None,
    ) -> dict[str, float]:
        """Validate on the whole loader after `iteration` training batches of `epoch`,
        under `evaluation` (inference mode; no_grad for a sharded model); returns the
        point's values (every process gets rank 0's)."""
        main = dist is None or dist.main
        rng = capture_rng_state()
        loggers = {"valid": [PointLogger(self.artifacts, iteration)] if main else []}
        processor = MetricsProcessor(
            {"valid": self.metrics}, loggers, None, num_epochs, gathers=dist is not None
        )
        plan = planner.epoch(epoch)
        processor.start_split("valid", epoch, plan.total)
        model, split = stateful_copy(model, evaluation)
        try:
            with evaluating(model, evaluation, self.autocast, split=split):
                run_pass(
                    model.valid_step,  # type: ignore[arg-type]
                    "valid_step",
                    plan.batches(),
                    processor,
                    "valid",
                    epoch,
                    device,
                    count=plan.count,
                )
            values = processor.end_split(dist)
        finally:
            restore_rng_state(rng)
        self.history.add_point(epoch, iteration, {"valid": values}, counters)  # by rank 0
        if main:
            for name, counts in processor.matrices.items():  # confusion matrices
                write_matrix(self.artifacts.point_matrix_file(epoch, iteration, name), name, counts)
            hook = getattr(renderer, "valid_point", None)
            if callable(hook):
                hook(iteration, processor.progress(), processor.views(final=values))
        emit(ValidPoint(epoch, iteration, dict(values)))
        return values


def validation_points(history: RunHistory) -> Points:
    """Every validation of the run in order: each epoch's points inside it, then its
    end-of-epoch validation (iteration None)."""
    inside = history.point_entries()
    result: list[tuple[int, int | None, Mapping[str, Mapping[str, float]]]] = []
    epochs = history.entries()
    ends = {epoch for epoch, _ in epochs}
    for epoch, values in epochs:
        result.extend((e, i, v) for e, i, v in inside if e == epoch)
        if "valid" in values:
            result.append((epoch, None, {"valid": values["valid"]}))
    result.extend((e, i, v) for e, i, v in inside if e not in ends)  # the epoch running
    return result


def counts_points(strategy: Any) -> bool:
    """An early stopping strategy that counts validation points: it has
    `should_stop_at_point(points)` and watches a validation metric."""
    ask = getattr(strategy, "should_stop_at_point", None)
    return callable(ask) and getattr(strategy, "split", "valid") == "valid"


def early_stop(strategy: Any, history: RunHistory, points: bool) -> str | None:
    """Ask the early stopping strategy. In a run with validation points (`points`), a
    strategy that counts them sees every validation of the run; otherwise it judges the
    completed epochs (`should_stop(history)`)."""
    if points and counts_points(strategy):
        return strategy.should_stop_at_point(validation_points(history))  # type: ignore[no-any-return]
    return strategy.should_stop(history.entries())  # type: ignore[no-any-return]


def stop_at_point(strategy: Any, history: RunHistory) -> str | None:
    """After a validation point: the reason an early stopping strategy that counts
    points gives to stop there, or None (no strategy, or one that judges epochs)."""
    if strategy is None or not counts_points(strategy):
        return None
    return strategy.should_stop_at_point(validation_points(history))  # type: ignore[no-any-return]
