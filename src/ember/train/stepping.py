"""One optimizer step of a fit: its batches' forward and backward, then the step.

`train_step` runs a step's batches (`run_step`), or under `grads_accumulation("auto")`
runs it again in micro-batches after an out-of-memory error; `run_step` calls the
model's `train_step` on each batch, checks the fit's first output (`check_output`
before its backward, `check_metrics` after it), backpropagates each batch's loss with
its share of the step, and updates the metrics; `step_optimizer` applies the step, or
skips it after a non-finite loss. Each works on the `Learner` whose epoch calls it.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import torch

from ember.data.device import to_device
from ember.errors import TrainingError
from ember.train.batches import Step
from ember.train.events import ProcessedItem
from ember.train.oom import RankSplit, run_split, run_split_ranks
from ember.train.output import loss_weight, summed_loss_hint
from ember.train.parallel import no_sync
from ember.train.processor import MetricsProcessor
from ember.train.step import call_step, check_train_output, note_step_error

if TYPE_CHECKING:
    from ember.train.learner import Learner

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


def train_step(
    learner: Learner,
    processor: MetricsProcessor,
    step: Step,
    epoch: int,
    total: int | None,
    check: int,
) -> bool:
    """`run_step`, or under `grads_accumulation("auto")` the step run again in
    micro-batches after an out-of-memory error (`train/oom.py`)."""
    if learner.optim.micro_split is None:
        return run_step(learner, processor, step, epoch, total, check)
    iteration, items, counting = learner.iteration, learner.items, not learner.flops.done
    ranks, mark = learner._ranks, processor.hold()

    def attempt(split: Step) -> bool:
        learner.iteration, learner.items = iteration, items  # a failed attempt counts nothing
        processor.undo(mark)  # nor do its metric values
        if counting:  # the FLOPs are counted on a batch that fits
            learner.flops.done = False
        return run_step(learner, processor, split, epoch, total, check, ranks)

    try:
        if ranks is not None:  # several processes: they agree on every attempt
            return run_split_ranks(learner.optim, step, attempt, ranks)
        return run_split(learner.optim, step, attempt)
    finally:
        processor.release()


def run_step(
    learner: Learner,
    processor: MetricsProcessor,
    step: Step,
    epoch: int,
    total: int | None,
    check: int,
    ranks: RankSplit | None = None,
) -> bool:
    """Forward and backward every batch of one optimizer step; False when a loss
    was not finite. The batch numbered `check` has its output checked. The callbacks'
    `on_before_optimizer_step` comes before the metrics of the step's last batch
    (they may read it: `GradNormMetric`), the step after them (a non-finite loss the
    metrics find stops the run before its step is applied). With `ranks`
    (grads_accumulation("auto") on several processes) the model runs without DDP and
    the processes agree after the last batch (`RankSplit.settle`)."""
    optim, ddp, manual = learner.optim, learner._ddp, learner._manual
    if ranks is not None:
        ddp = None  # gradients stay local until every process fitted
    forward = ddp if ddp is not None else learner.model.train_step
    flops, length = learner.flops, learner.length
    lr = optim.lr.before_step()  # the step's learning rate
    last, finite = len(step.batches) - 1, True
    tokens: Any = 0  # the group's tokens, when its losses are means over tokens
    origins = step.origins
    counts_tokens = length.counts_tokens
    if counts_tokens:
        length.start_step()
    for index, batch in enumerate(step.batches):
        iteration = step.first + (index if origins is None else origins[index])
        learner.iteration = iteration
        learner.items += step.items[index]
        told = getattr(batch, "num_tokens", None) if counts_tokens else None
        if learner._move:
            batch = to_device(batch, learner.device)
        if learner.callbacks is not None:
            learner.callbacks.ctx.epoch, learner.callbacks.ctx.iteration = epoch, iteration
        share: Any = step.shares[index]
        if manual is not None:  # custom optimization: the step runs backward itself
            with no_sync(ddp, index < last), flops.count():
                output, ok = _manual_batch(learner, processor, batch, step, index, epoch, check)
            weight: Any = 0  # (custom steps are not weighted by tokens)
        elif (ddp is None or index == last) and flops.done:  # nothing to run the batch in
            output, ok, weight = _train_batch(
                learner, processor, forward, batch, share, epoch, check
            )
        else:
            with no_sync(ddp, index < last), flops.count():
                output, ok, weight = _train_batch(
                    learner, processor, forward, batch, share, epoch, check
                )
        finite = ok and finite
        if learner._token_mean:
            tokens = tokens + weight
        if index == last and ranks is not None:
            verdict = ranks.settle(finite, tokens if learner._token_mean else 0)
            if learner._token_mean:
                optim.rescale(verdict.tokens, world=ranks.dist.world)
        elif index == last and learner._token_mean:
            optim.rescale(tokens, learner.dist)  # by the group's tokens on every process
        if index == last and finite and optim.callbacks is not None:
            optim.prepare()
        if counts_tokens:
            length.count_batch(told, output, iteration)
        if ok:  # a skipped non-finite batch stays out of the epoch's metrics
            processor.update(output.item, iteration, step.sizes[index], lr)
        if learner.listeners:
            learner._emit(ProcessedItem("train", epoch, iteration, total, output.item, lr))
    return finite


def plain(learner: Learner, plan: Any) -> bool:
    """Whether the epoch's steps may take `run_plain_step`: a batch per step, one
    process, and nothing around the forward and backward (no hooks, listeners, custom
    optimization, mixed precision or token counting)."""
    optim = learner.optim
    return (
        plan.accumulation == 1
        and plan._shards is None
        and learner.dist is None
        and learner._ddp is None
        and learner._manual is None
        and learner.callbacks is None
        and not learner.listeners
        and not optim.autocasts
        and optim.micro_split is None
        and not learner.length.counts_tokens
    )


def run_plain_step(learner: Learner, processor: MetricsProcessor, step: Step, epoch: int) -> bool:
    """`run_step` for a step of one batch when the epoch is `plain`, the fit's output
    checks are done, its FLOPs counted and its losses not weighted by tokens: what
    `run_step` does in that case, without the branches it cannot take."""
    iteration = learner.iteration = step.first
    learner.items += step.items[0]
    optim = learner.optim
    lr = optim.lr.before_step()
    batch = step.batches[0]
    if learner._move:
        batch = to_device(batch, learner.device)
    try:
        output = learner.model.train_step(batch)  # type: ignore[operator]
    except Exception as error:
        note_step_error(error, batch, "train_step", epoch, iteration)
        raise
    guard = learner.guard
    ok = guard.covered or guard.check(output.loss, epoch, iteration)
    optim.backward(output.loss, step.shares[0])
    if ok:
        processor.update(output.item, iteration, step.sizes[0], lr)
    return ok


def _train_batch(
    learner: Learner,
    processor: MetricsProcessor,
    forward: Any,
    batch: Any,
    share: Any,
    epoch: int,
    check: int,
) -> tuple[Any, bool, Any]:
    """One batch's forward (under autocast with mixed precision) and backward, its loss
    weighted by `share` (by its tokens when the run's losses are means over tokens);
    the output, whether its loss is finite (as far as is known now), and the weight."""
    optim, iteration = learner.optim, learner.iteration
    try:
        if optim.autocasts:
            with optim.autocast():
                output = forward(batch)
        else:
            output = forward(batch)
    except Exception as error:
        note_step_error(error, batch, "train_step", epoch, iteration)
        raise
    if iteration == check:
        check_output(learner, processor, output, epoch)
    guard = learner.guard
    ok = guard.covered or guard.check(output.loss, epoch, iteration)
    if learner.callbacks is not None:
        learner.callbacks.ctx.output = output
    if learner._token_mean:
        share = token_weight(output.item, iteration)
    optim.backward(output.loss, share)
    if iteration == check:
        check_metrics(learner, processor, output, epoch)
    return output, ok, share


def _manual_batch(
    learner: Learner,
    processor: MetricsProcessor,
    batch: Any,
    step: Step,
    index: int,
    epoch: int,
    check: int,
) -> tuple[Any, bool]:
    """One batch of a step that runs its own backward (custom optimization): the
    output, and whether the step went through."""
    manual, optim, model, iteration = (
        learner._manual,
        learner.optim,
        learner.model,
        learner.iteration,
    )
    assert manual is not None
    last = len(step.batches) - 1

    def manual_step(batch: Any) -> Any:  # the step gets the context
        return model.train_step(batch, manual)  # type: ignore[operator]

    manual.begin(epoch, iteration, index == 0, index == last, step.shares[index])
    with optim.autocast():
        output = call_step(manual_step, batch, "train_step", epoch, iteration)
    if iteration == check:
        check_output(learner, processor, output, epoch, manual=True)
        check_metrics(learner, processor, output, epoch)
    return output, manual.ok


def check_output(
    learner: Learner, processor: MetricsProcessor, output: Any, epoch: int, manual: bool = False
) -> None:
    """The first training output of the fit, before its backward: its type, its
    loss, how its loss is weighted."""
    learner._output_checked = True
    check_train_output(learner.model, output, manual)
    learner._token_mean = loss_weight(output.item) is not None
    if learner._token_mean and manual and learner.options.grads_accumulation > 1:
        raise TrainingError(
            "loss_reduction='token_mean' weights each accumulated batch by its tokens "
            "when ember runs backward; a step that runs its own (ctx.backward) under "
            "grads_accumulation cannot be weighted by them. Accumulate without "
            "'token_mean' (each batch weighs its samples), or do not accumulate."
        )
    guard = learner.guard
    if not manual and guard.policy == "stop":  # the loss metric's values stand guard
        guard.covered = processor.watch_loss(output.item, output.loss, guard.nonfinite)


def check_metrics(learner: Learner, processor: MetricsProcessor, output: Any, epoch: int) -> None:
    """The first training output of the fit, once its backward freed the graph (its
    activations no longer take memory) and before the first optimizer step: what
    the metrics read, and whether the loss looks summed."""
    processor.check("train", output.item, epoch)
    hint = summed_loss_hint(output.item)
    if hint is not None:
        log.warning("%s", hint)


def step_optimizer(learner: Learner, finite: bool, epoch: int) -> None:
    """Step, or skip the step of a group with a non-finite loss. Under "skip" with
    several processes they agree first (one all-reduce of a flag): a NaN on any rank
    skips the step on every rank, so the replicas stay equal."""
    elsewhere = False
    if learner.dist is not None and learner.guard.policy == "skip":
        if learner._ranks is not None and learner._ranks.verdict is not None:
            agreed = learner._ranks.verdict.finite  # the attempt's agreement said it
        else:
            agreed = not learner.dist.any(not finite)
        elsewhere, finite = finite and not agreed, agreed
    if finite:
        learner.optim.step()
        return
    learner.optim.skip()
    learner.skipped_steps += 1
    where = " on another process" if elsewhere else ""
    message = (
        f"Skipped the optimizer step at epoch {epoch}, iteration {learner.iteration}: "
        f"non-finite loss{where} (nonfinite_loss('skip'))."
    )
    log.warning("%s", message)
    print(f"ember: {message}", file=sys.stderr)


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
