"""How long a run trains, and how far it got: its length and its running counters.

A run's length is `num_epochs` epochs, or a `Duration` in optimizer steps, samples or
tokens (`LearnerBuilder.train_for`). `RunLength` keeps the run's `Counters` (optimizer
steps, samples and tokens of every process since the run began, kept in checkpoints),
counts each step as it ends, tells the optimizer steps a length takes (for "auto"
schedules), whether the length is reached, and the progress in its unit.

Samples are known from the batch plan without communication. Tokens are counted only
when a length or cadence is in tokens: each batch's `num_tokens`, or its output's
`tokens`, read on the host once per step; under several processes they are summed in
the all-reduce that also takes the stop vote, at a step every process has.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ember.errors import TrainingError
from ember.train.length.batches import BatchPlanner
from ember.train.length.duration import Counters, Duration, short_count
from ember.train.length.epoch_plan import Step, steps_to_reach
from ember.train.length.position import Position


class RunLength:
    """The length of one run (`train_for`, else `num_epochs` epochs) and its counters."""

    def __init__(
        self, train_for: Duration | None, num_epochs: int, cadences: tuple[Any, ...] = ()
    ) -> None:
        self.train_for = train_for
        self.num_epochs = num_epochs
        self.counters = Counters()
        """The optimizer steps, samples and tokens (every process's) of the run so far."""
        durations = [d for d in (train_for, *cadences) if isinstance(d, Duration)]
        self.counts_tokens = any(d.unit == "tokens" for d in durations)
        """A length or cadence is in tokens: each batch's tokens are counted."""
        self.uses_counts = bool(durations)
        """A length or cadence counts steps, samples or tokens over the run."""
        self.ended = False
        """The run's length (`train_for`) was reached."""
        self._step_tokens: int | torch.Tensor = 0
        """Tokens of the step running."""
        self._pending: int | torch.Tensor = 0
        """Tokens of this process not yet summed over the processes."""

    def steps(
        self, planner: BatchPlanner, per_epoch: int | None, start: Position
    ) -> tuple[int | None, int | None]:
        """`(total_steps, last_epoch)` of the run from `start`: its optimizer steps, and
        the epoch it ends in (None where the loader does not tell them). A run resumed
        with another batch size counts the steps left from an epoch's start."""
        length, done = self.train_for, start.counters
        if length is None:
            return (None if per_epoch is None else per_epoch * self.num_epochs), self.num_epochs
        before = start.epoch - 1
        if length.unit == "steps":
            left = max(0, length.value - done.steps)
            epochs = None if not per_epoch else before + max(1, math.ceil(left / per_epoch))
            return length.value, epochs
        if length.unit == "samples":
            per_step = planner.step_samples()
            reach = (
                None if per_step is None else steps_to_reach(length.value - done.samples, per_step)
            )
            if reach is not None:
                return done.steps + reach[0], before + max(1, reach[1])
        return None, None

    def finished(self, start: Position) -> bool:
        """A run resumed at `start` has nothing left to train."""
        if self.train_for is None:
            return start.epoch > self.num_epochs
        return start.counters.reached(self.train_for)

    def start_step(self) -> None:
        self._step_tokens = 0

    def count_batch(self, told: Any, output: Any, iteration: int) -> None:
        """Add a training batch's tokens to the step's (a length in tokens only)."""
        self._step_tokens = self._step_tokens + batch_tokens(told, output, iteration)

    def advance(self, step: Step, dist: Any, stop: Callable[[], bool]) -> bool | None:
        """Count the step done: one optimizer step, its samples (every process's, which
        the batch plan knows) and, with a duration in tokens, its tokens: read on the
        host once per step, and under several processes summed over them in the one
        all-reduce that also takes the stop vote (`stop()`: this process's), whose
        result is returned (None when not voted here)."""
        done = self.counters
        tokens, voted = done.tokens, None
        if self.counts_tokens:
            self._pending = self._pending + self._step_tokens
            if dist is None:
                tokens += int(self._pending)
                self._pending = 0
            elif step.may_vote:
                total, voted = dist.sum_and_any(self._pending, stop())
                tokens += total
                self._pending = 0
        self.counters = tuple.__new__(
            Counters, (done.steps + 1, done.samples + sum(step.items), tokens)
        )
        return voted

    def count(self, step: Step) -> None:
        """`advance` for a run of one process whose length is not in tokens."""
        done = self.counters
        self.counters = tuple.__new__(
            Counters, (done.steps + 1, done.samples + sum(step.items), done.tokens)
        )

    def end_epoch(self, dist: Any) -> None:
        """At an epoch's end: under several processes, they agree on the counters (the
        last steps of an uneven epoch, which some processes did not have, counted once,
        and the tokens not yet summed); then whether the length is reached."""
        if dist is not None and self.uses_counts:
            rows = dist.all_gather((self.counters.steps, self.counters.samples, int(self._pending)))
            self._pending = 0
            self.counters = Counters(
                max(row[0] for row in rows),
                max(row[1] for row in rows),
                self.counters.tokens + sum(row[2] for row in rows),
            )
        if self.train_for is not None and self.counters.reached(self.train_for):
            self.ended = True

    def reached_at(self, step: Step, dist: Any) -> bool:
        """The run's length is reached after this step (decided where every process
        has the step, so they end together)."""
        if self.train_for is None or (dist is not None and not step.may_vote):
            return False
        return self.counters.reached(self.train_for)

    def progress_text(self) -> str:
        """The run's progress in the unit of its length, e.g. "samples 1.2M/5M" (empty
        for a length in epochs)."""
        if self.train_for is None:
            return ""
        unit, target = self.train_for.unit, self.train_for.value
        return f"{unit} {short_count(self.counters.of(unit))}/{short_count(target)}"


def batch_tokens(told: Any, output: Any, iteration: int) -> int | torch.Tensor:
    """The tokens of a training batch, for a duration in tokens: the batch's
    `num_tokens` (an int), else its output's `tokens` (an int or a tensor)."""
    if isinstance(told, int) and not isinstance(told, bool):
        return told
    tokens = getattr(getattr(output, "item", output), "tokens", None)
    if tokens is None:
        raise TrainingError(
            f"A duration in tokens counts each batch's tokens, and the batch of iteration "
            f"{iteration} tells none: give the batch a num_tokens attribute (an int), or the "
            "training output tokens= (an int or a tensor)."
        )
    return tokens
