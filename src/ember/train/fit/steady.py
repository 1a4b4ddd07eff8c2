"""The steady steps of an epoch (`steady_steps`): once the fit's first steps are
checked, a run of one process with nothing around a step's one forward and backward
(`Stepper.plain`) and nothing to decide after it but a stop request (`TrainLoop.quiet`)
takes the rest of the epoch's batches in one loop. Each batch does what
`Stepper.plain_step`, `Stepper.apply` and `TrainLoop.after_step` do for it there, in
the same order, without a `Step` per batch or a call per phase: a step of a small
model is a few hundred microseconds, and each Python call of the loop's own shows.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ember.data.device import to_device
from ember.train.fit.parts import FitParts
from ember.train.fit.state import FitState
from ember.train.length.duration import Counters
from ember.train.optimization import explain_backward
from ember.train.step import note_step_error


def steady_steps(
    parts: FitParts,
    state: FitState,
    batches: Iterator[Any],
    apply: Any,
    count: Callable[[Any], int],
) -> bool:
    """Train on every batch of `batches` (one optimizer step each, after
    `state.iteration`); True when a stop request ended them early. `apply`: the
    stepper's `apply`, for a step whose loss was not finite (skipped, or stopped);
    `count`: each batch's items (`EpochPlan.count`)."""
    optim, guard, processor, length = parts.optim, parts.guard, parts.processor, parts.length
    optimizer, lr, update = optim.optimizer, optim.lr, processor.update
    bare = optim.bare
    optimizer_step, zero_grad = optimizer.step, optimizer.zero_grad
    after_lr = lr.after_step if lr.steps_after else None
    train_step: Any = parts.model.train_step
    interrupter = parts.options.interrupter
    checkpoints = parts.checkpoints if parts.checkpoints.checkpointer is not None else None
    move, device, covered = parts.move, parts.device, guard.covered
    iteration, items, epoch = state.iteration, state.items, state.epoch
    done = length.counters
    steps, samples = done.steps, done.samples
    try:
        for batch in batches:
            iteration += 1
            size = count(batch)
            items += size
            state.iteration, state.items = iteration, items
            rate = lr.before_step()
            if move:
                batch = to_device(batch, device)
            try:
                output = train_step(batch)
            except Exception as error:
                note_step_error(error, batch, "train_step", epoch, iteration)
                raise
            loss = output.loss
            finite = covered or guard.check(loss, epoch, iteration)
            try:
                loss.backward()
            except RuntimeError as error:
                explain_backward(error)
                raise
            if finite:
                update(output.item, iteration, size, rate)
                if bare:
                    optimizer_step()
                    if after_lr is not None:
                        after_lr()
                    zero_grad(set_to_none=True)
                else:
                    optim.step()
            else:
                apply(False)
            steps += 1
            samples += size
            if interrupter.requested:
                return True
            if checkpoints is not None:
                checkpoints.check()  # a background write's failure
        return False
    finally:
        length.counters = tuple.__new__(Counters, (steps, samples, done.tokens))
