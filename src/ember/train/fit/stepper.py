"""One optimizer step of a fit (`Stepper`): its batches' forward and backward, then
the step.

The stepper chooses its path once per fit: the general one (`step`: checks the fit's
first output, counts FLOPs and tokens, runs the callbacks' hooks, DDP's `no_sync`,
custom optimization) or, under `grads_accumulation("auto")`, the general one run again
in micro-batches after an out-of-memory error (`split_step`, `train/oom.py`); once the
fit's first steps are checked it switches, once, to the plain path (`plain_step`) when
nothing runs around a step's one forward and backward. `apply` then steps the
optimizer, or skips the step after a non-finite loss. An optimizer whose step takes a
closure (L-BFGS) takes the general path: the step's forward and backward are the
closure's first evaluation, and the closure runs the forward again for the others.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable

import torch

from ember.data.device import to_device
from ember.errors import TrainingError
from ember.train import memory
from ember.train.events import ProcessedItem
from ember.train.fit.parts import FitParts
from ember.train.fit.state import FitState
from ember.train.length.epoch_plan import StandIn, Step
from ember.train.oom import run_split, run_split_ranks
from ember.train.output import loss_weight, summed_loss_hint
from ember.train.parallel import no_sync
from ember.train.step import call_step, check_train_output, note_step_error

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


class Stepper:
    """Takes the optimizer steps of one fit."""

    def __init__(self, parts: FitParts, state: FitState) -> None:
        self.parts, self.state = parts, state
        optim, train = parts.optim, parts.train
        self.plain = (  # nothing around a step's one forward and backward
            train.accumulation == 1
            and train.shard is None
            and parts.dist is None
            and parts.wrapped is None
            and parts.manual is None
            and optim.callbacks is None
            and not parts.events.any_listener
            and not optim.autocasts
            and not optim.closes
            and optim.micro_split is None
            and not parts.length.counts_tokens
        )
        self.steps_itself = parts.dist is None or parts.guard.policy != "skip"
        """Apply a finite step without the processes' agreement on a skip."""
        general = self.split_step if optim.micro_split is not None else self.step
        self.general: Callable[[Step], bool] = general
        self.run: Callable[[Step], bool] = general
        """The path of the next step."""
        self.check = 0
        """The iteration whose output is checked (the fit's first)."""
        self.estimates = memory.accelerator(parts.device)
        """The fit's first step estimates its memory (on an accelerator)."""
        self.total: int | None = None

    def start_epoch(self, start_iteration: int, total: int | None) -> None:
        """An epoch starts after `start_iteration` batches (a resumed run's)."""
        self.check = 0 if self.state.output_checked else start_iteration + 1
        self.total = total
        self.run = self.plain_step if self._settled(start_iteration) else self._general

    def _settled(self, iteration: int) -> bool:
        """The plain path may take the steps after `iteration`: the fit's first output
        is checked, its FLOPs counted, and its losses are not weighted by tokens."""
        parts, state = self.parts, self.state
        return self.plain and parts.flops.done and not state.token_mean and self.check <= iteration

    def _general(self, step: Step) -> bool:
        if self.estimates:  # once, before the fit's first step
            self.estimates = False
            from ember.train.memory_estimate.fits import start_estimate

            start_estimate(self.parts.options, step)
        finite = self.general(step)
        if self._settled(step.first):  # once: the fit's first steps are checked
            self.run = self.plain_step
        return finite

    # The paths ---------------------------------------------------------------------
    def plain_step(self, step: Step) -> bool:
        """`step` for a step of one batch on the plain path: what `step` does in that
        case, without the branches it cannot take."""
        state, parts = self.state, self.parts
        iteration = state.iteration = step.first
        state.items += step.items[0]
        optim = parts.optim
        lr = optim.lr.before_step()
        batch = step.batches[0]
        if parts.move:
            batch = to_device(batch, parts.device)
        try:
            output = parts.model.train_step(batch)  # type: ignore[operator]
        except Exception as error:
            note_step_error(error, batch, "train_step", state.epoch, iteration)
            raise
        guard = parts.guard
        ok = guard.covered or guard.check(output.loss, state.epoch, iteration)
        optim.backward(output.loss, step.shares[0])
        if ok:
            parts.processor.update(output.item, iteration, step.sizes[0], lr)
        return ok

    def split_step(self, step: Step) -> bool:
        """`step`, run again in micro-batches after an out-of-memory error
        (`grads_accumulation("auto")`, `train/oom.py`)."""
        parts, state = self.parts, self.state
        iteration, items, counting = state.iteration, state.items, not parts.flops.done
        processor, ranks = parts.processor, parts.ranks
        mark = processor.hold()

        def attempt(split: Step) -> bool:
            state.iteration, state.items = iteration, items  # a failed attempt counts nothing
            processor.undo(mark)  # nor do its metric values
            if counting:  # the FLOPs are counted on a batch that fits
                parts.flops.done = False
            return self.step(split, settle=ranks is not None)

        try:
            if ranks is not None:  # several processes: they agree on every attempt
                return run_split_ranks(parts.optim, step, attempt, ranks)
            return run_split(parts.optim, step, attempt)
        finally:
            processor.release()

    def step(self, step: Step, settle: bool = False) -> bool:
        """Forward and backward every batch of one optimizer step; False when a loss
        was not finite. The batch numbered `check` has its output checked. The callbacks'
        `on_before_optimizer_step` comes before the metrics of the step's last batch
        (they may read it: `GradNormMetric`), the step after them (a non-finite loss the
        metrics find stops the run before its step is applied). With `settle`
        (grads_accumulation("auto") on several processes) the model runs without DDP and
        the processes agree after the last batch (`RankSplit.settle`)."""
        parts, state = self.parts, self.state
        optim, manual, events, processor = parts.optim, parts.manual, parts.events, parts.processor
        ranks = parts.ranks if settle else None
        wrapped = None if settle else parts.wrapped  # gradients stay local until all fitted
        forward = wrapped if wrapped is not None else parts.model.train_step
        flops, length, epoch = parts.flops, parts.length, state.epoch
        lr = optim.lr.before_step()  # the step's learning rate
        last, finite = len(step.batches) - 1, True
        tokens: Any = 0  # the group's tokens, when its losses are means over tokens
        origins = step.origins
        streams: Any = parts.streams
        columns = step.columns if streams is not None else None
        counts_tokens = length.counts_tokens
        if counts_tokens:
            length.start_step()
        for index, batch in enumerate(step.batches):
            stand_in = type(batch) is StandIn  # only to join the others' collectives
            if stand_in:
                batch = batch.batch
            iteration = step.first + (index if origins is None else origins[index])
            state.iteration = iteration
            state.items += step.items[index]
            told = getattr(batch, "num_tokens", None) if counts_tokens else None
            if parts.move:
                batch = to_device(batch, parts.device)
            events.at(epoch, iteration)
            share: Any = step.shares[index]
            if columns is not None:  # the forward draws from its column's stream
                streams.enter(columns[index if origins is None else origins[index]])
            if manual is not None:  # custom optimization: the step runs backward itself
                with no_sync(wrapped, index < last), flops.count():
                    output, ok = self._manual_batch(batch, step, index)
                weight: Any = 0  # (custom steps are not weighted by tokens)
            elif (wrapped is None or index == last) and flops.done:  # nothing to run it in
                output, ok, weight = self._train_batch(forward, batch, share)
            else:
                with no_sync(wrapped, index < last), flops.count():
                    output, ok, weight = self._train_batch(forward, batch, share)
            if columns is not None:
                streams.leave(columns[index if origins is None else origins[index]])
            if optim.closes and manual is None:  # L-BFGS: this was the closure's first call
                optim.closure = optim.reevaluation(again(forward, batch), output.loss, weight)
            finite = ok and finite
            if state.token_mean:
                tokens = tokens + weight
            if index == last and ranks is not None:
                verdict = ranks.settle(finite, tokens if state.token_mean else 0)
                if state.token_mean:
                    optim.rescale(verdict.tokens, world=ranks.dist.world)
            elif index == last and state.token_mean:
                optim.rescale(tokens, parts.dist)  # by the group's tokens on every process
            if index == last and finite and optim.callbacks is not None:
                optim.prepare()
            if stand_in:
                continue
            if counts_tokens:
                length.count_batch(told, output, iteration)
            if ok:  # a skipped non-finite batch stays out of the epoch's metrics
                processor.update(output.item, iteration, step.sizes[index], lr)
            if events.any_listener:
                events.emit(ProcessedItem("train", epoch, iteration, self.total, output.item, lr))
        return finite

    def _train_batch(self, forward: Any, batch: Any, share: Any) -> tuple[Any, bool, Any]:
        """One batch's forward (under autocast with mixed precision) and backward, its loss
        weighted by `share` (by its tokens when the run's losses are means over tokens);
        the output, whether its loss is finite (as far as is known now), and the weight."""
        parts, state = self.parts, self.state
        optim, epoch, iteration = parts.optim, state.epoch, state.iteration
        try:
            if optim.autocasts:
                with optim.autocast():
                    output = forward(batch)
            else:
                output = forward(batch)
        except Exception as error:
            note_step_error(error, batch, "train_step", epoch, iteration)
            raise
        if iteration == self.check:
            self._check_output(output)
        guard = parts.guard
        ok = guard.covered or guard.check(output.loss, epoch, iteration)
        parts.events.output(output)
        if state.token_mean and share:  # (a stand-in's share is 0: it weighs nothing)
            share = token_weight(output.item, iteration)
        optim.backward(output.loss, share)
        if iteration == self.check:
            self._check_metrics(output)
        return output, ok, share

    def _manual_batch(self, batch: Any, step: Step, index: int) -> tuple[Any, bool]:
        """One batch of a step that runs its own backward (custom optimization): the
        output, and whether the step went through."""
        parts, state = self.parts, self.state
        manual, model, epoch, iteration = parts.manual, parts.model, state.epoch, state.iteration
        assert manual is not None
        last = len(step.batches) - 1

        def manual_step(batch: Any) -> Any:  # the step gets the context
            return model.train_step(batch, manual)  # type: ignore[operator]

        manual.begin(epoch, iteration, index == 0, index == last, step.shares[index])
        with parts.optim.autocast():
            output = call_step(manual_step, batch, "train_step", epoch, iteration)
        if iteration == self.check:
            self._check_output(output, manual=True)
            self._check_metrics(output)
        return output, manual.ok

    # The fit's first output ----------------------------------------------------------
    def _check_output(self, output: Any, manual: bool = False) -> None:
        """The first training output of the fit, before its backward: its type, its
        loss, how its loss is weighted."""
        parts, state = self.parts, self.state
        state.output_checked = True
        check_train_output(parts.model, output, manual)
        state.token_mean = loss_weight(output.item) is not None
        if state.token_mean and parts.optim.closes:
            raise TrainingError(
                f"loss_reduction='token_mean' weights a step's gradients by its tokens, and "
                f"{type(parts.optim.optimizer).__name__} re-evaluates the step's loss inside "
                "its step (a closure), where they cannot be weighted: report a plain mean "
                "loss (leave loss_reduction out)."
            )
        if state.token_mean and manual and parts.options.grads_accumulation > 1:
            raise TrainingError(
                "loss_reduction='token_mean' weights each accumulated batch by its tokens "
                "when ember runs backward; a step that runs its own (ctx.backward) under "
                "grads_accumulation cannot be weighted by them. Accumulate without "
                "'token_mean' (each batch weighs its samples), or do not accumulate."
            )
        guard = parts.guard
        if not manual and guard.policy == "stop":  # the loss metric's values stand guard
            guard.covered = parts.processor.watch_loss(output.item, output.loss, guard.nonfinite)

    def _check_metrics(self, output: Any) -> None:
        """The first training output of the fit, once its backward freed the graph (its
        activations no longer take memory) and before the first optimizer step: what
        the metrics read, and whether the loss looks summed."""
        self.parts.processor.check("train", output.item, self.state.epoch)
        hint = summed_loss_hint(output.item)
        if hint is not None:
            log.warning("%s", hint)

    # Applying the step ---------------------------------------------------------------
    def apply(self, finite: bool) -> None:
        """Step, or skip the step of a group with a non-finite loss. Under "skip" with
        several processes they agree first (one all-reduce of a flag): a NaN on any rank
        skips the step on every rank, so the replicas stay equal."""
        parts = self.parts
        if finite and self.steps_itself:
            parts.optim.step()
            return
        elsewhere, dist, ranks = False, parts.dist, parts.ranks
        if dist is not None and parts.guard.policy == "skip":
            if ranks is not None and ranks.verdict is not None:
                agreed = ranks.verdict.finite  # the attempt's agreement said it
            else:
                agreed = not dist.any(not finite)
            elsewhere, finite = finite and not agreed, agreed
        if finite:
            parts.optim.step()
            return
        parts.optim.skip()
        self.state.skipped_steps += 1
        where = " on another process" if elsewhere else ""
        message = (
            f"Skipped the optimizer step at epoch {self.state.epoch}, iteration "
            f"{self.state.iteration}: non-finite loss{where} (nonfinite_loss('skip'))."
        )
        log.warning("%s", message, extra={"ember_console": False})  # printed below
        print(f"ember: {message}", file=sys.stderr)


def again(forward: Any, batch: Any) -> Callable[[], torch.Tensor]:
    """The loss of `batch` evaluated once more (the later calls of a step's closure)."""
    return lambda: forward(batch).loss


def token_weight(item: Any, iteration: int) -> int | torch.Tensor:
    """The tokens of a batch of a run whose losses are means over tokens."""
    weight = loss_weight(item)
    if weight is None:
        raise TrainingError(
            f"The training output of iteration {iteration} has no loss_reduction='token_mean' "
            "while the run's first had it: give every batch's output "
            "loss_reduction='token_mean' and tokens=."
        )
    return weight
