"""Feeds step outputs to the metrics, and metric values to the loggers and the renderer.

Metric updates stay on the device. Every `tick` seconds the values computed since the
last tick start their way to the host (`ember.train.host`: non-blocking copies into
reused pinned buffers); the values of an earlier tick whose copies are done go to the
loggers and the renderer. The loop never waits on an accelerator for a metric between
split ends: a split's end waits once for the rest (its values, and the epoch values
metrics compute on the device), and a checkpoint inside an epoch once.
"""

from __future__ import annotations

import logging
import time
from itertools import repeat
from math import isfinite
from operator import mul, truediv
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from ember.train import host
from ember.train import metric_exchange as exchange
from ember.train.logger.base import MetricLogger, MetricRecord
from ember.train.metric.adapt import adapt
from ember.train.metric.base import MetricMetadata, RegisteredMetric
from ember.train.metric.inputs import LossInput
from ember.train.metric.loss import LossMetric
from ember.train.metric.state import MetricState
from ember.train.metric_check import check_first_batch, single_number
from ember.train.output import quick_reader
from ember.train.renderer.base import MetricView, Progress, Renderer

log = logging.getLogger(__name__)

TICK = 0.1
"""Seconds between two hand-overs of metric values to the loggers and the renderer."""


class MetricsProcessor:
    """Owns the metric states of both splits for one run."""

    def __init__(
        self,
        metrics: Mapping[str, Sequence[RegisteredMetric]],
        loggers: Mapping[str, Sequence[MetricLogger]],
        renderer: Renderer | None,
        num_epochs: int,
        tick: float | None = None,
        gathers: bool = False,
    ) -> None:
        self.states = {
            split: [MetricState(entry.metric, entry.numeric, gathers) for entry in entries]
            for split, entries in metrics.items()
        }
        self.loggers = loggers
        self.renderer = renderer
        self.num_epochs = num_epochs
        self.tick = TICK if tick is None else tick
        self._split = "train"
        self._epoch = 0
        self._iteration = 0
        self._num_iterations: int | None = None
        self._items = 0
        """The items of the split's batches in this session (a resumed epoch's earlier
        ones are `_items_before`); under several processes, on rank 0, every process's
        as of the last exchange of rows, and this one's since."""
        self._own_items = 0
        """This process's items of the split in this session (what it tells rank 0)."""
        self._iterations_before = 0
        self._items_before = 0
        self._tokens: int | Tensor | None = None
        """The tokens of the split so far, when a pass counts them (`count_tokens`) and
        every batch told them; None otherwise."""
        self._tokens_lost = False
        """A batch of the split told no tokens: the split has no token count."""
        self._started = 0.0
        self._next_tick = 0.0
        self._restore: tuple[list[dict[str, Any]], Any] | None = None
        self._held = False
        self._states: list[MetricState] = self.states.get("train", [])
        """The current split's states."""
        self._loss_state: MetricState | None = None
        self._on_nonfinite: Callable[[int, int, float], None] | None = None
        self.run_progress: Callable[[], str] | None = None
        """The run's progress in the unit of its length, for `Progress.run`."""
        self._copies = host.HostCopies()
        self._in_flight: host.InFlight[list[tuple[MetricState, list[Any]]]] = host.InFlight()
        """Ticks' values on their way to the host, oldest first."""
        self.matrices: dict[str, list[list[int]]] = {}
        """The count matrices of the split that ended last (matrix metrics such as the
        confusion matrix), by metric name; under several processes, rank 0's covers
        every rank's samples."""

    def start_split(
        self,
        split: str,
        epoch: int,
        num_iterations: int | None,
        first_iteration: int = 1,
        num_epochs: int | None = None,
        first_items: int = 0,
    ) -> None:
        """A split of `epoch` starts (after `first_iteration - 1` batches of a resumed
        one, which held `first_items` items: the split's counts go on from them);
        `num_epochs`: the run's epochs as they stand now."""
        if num_epochs is not None:
            self.num_epochs = num_epochs
        self._split = split
        self._epoch = epoch
        self._iteration = self._iterations_before = first_iteration - 1
        self._num_iterations = num_iterations
        self._items, self._own_items, self._items_before = 0, 0, first_items
        self._tokens, self._tokens_lost = None, False
        self._started = time.monotonic()
        self._next_tick = self._started + self.tick
        self._states = self.states.get(split, [])
        for state in self._states:
            state.clear()

    def check(self, split: str, item: Any, epoch: int = 1) -> None:
        """The first batch of a split: every metric of `split` reads `item` and updates
        once (then forgets it), so a metric that cannot work fails now, before the first
        optimizer step, with a message naming the metric, the split and what it got."""
        check_first_batch(self.states.get(split, ()), split, item, epoch, self.num_epochs)
        if split == self._split:
            self._apply_restore()

    def watch_loss(
        self, item: Any, loss: Any, on_nonfinite: Callable[[int, int, float], None]
    ) -> bool:
        """Let the training split's `LossMetric` stand guard: when it reads exactly `loss`
        (the loss backpropagated), each of its values that reaches the host and is not
        finite calls `on_nonfinite(epoch, iteration, value)`. True when one does."""
        self._loss_state = None
        self._on_nonfinite = None
        for state in self.states.get("train", ()):
            if type(state.metric) is LossMetric:
                read = getattr(adapt(item, LossInput, state.name), "loss", None)
                if read is loss:
                    self._loss_state, self._on_nonfinite = state, on_nonfinite
                    return True
        return False

    def _check_loss(self, state: MetricState, iteration: int, value: float) -> None:
        if state is self._loss_state and not isfinite(value):
            assert self._on_nonfinite is not None
            self._on_nonfinite(self._epoch, iteration, value)

    def update(self, item: Any, iteration: int, batch_size: int, lr: float | None) -> None:
        """One step's output: update every metric of the current split (no host sync)."""
        self._iteration = iteration
        self._items += batch_size
        self._own_items += batch_size
        states = self._states
        if states:
            meta = None
            grad = _grad_enabled()
            _set_grad_enabled(False)  # metric updates never build a graph
            item_type, loss_state = type(item), self._loss_state
            try:
                for state in states:
                    reader = state.reader if item_type is state.adapts else None
                    value = reader(item) if reader is not None else None  # the common case
                    if value is None:  # the metric's update on its input
                        if meta is None:
                            meta = self._meta(iteration, lr)
                        value = state.metric.update(_adapt(state, item), meta)
                    number, weight = value.value, value.weight
                    # Values already on the host are read at once (no sync, and no small
                    # tensors kept alive between ticks); device values wait for the tick.
                    if type(number) is Tensor:
                        if state.here or (state.here is None and state.learn_here(number)):
                            try:
                                number = number.item()
                            except RuntimeError:
                                single_number(number, state.name)  # raises, naming the metric
                            if state is loss_state and not isfinite(number):
                                self._check_loss(state, iteration, number)
                        else:
                            state.on_device = True
                    elif isinstance(number, Tensor):
                        state.on_device = True  # (a tensor subclass: read at the tick)
                    if isinstance(weight, Tensor):
                        if type(weight) is Tensor and host.on_host(weight):
                            weight = single_number(weight, state.name)
                        else:
                            state.on_device = True
                    state.pending.append((iteration, number, weight, value.scale, value.divisor))
            finally:
                _set_grad_enabled(grad)
        if time.monotonic() >= self._next_tick and not self._held:
            self._tick()

    def _meta(self, iteration: int, lr: float | None) -> MetricMetadata:
        """What a metric's `update` is told of the step."""
        split, epoch, total = self._split, self._epoch, self._num_iterations
        return MetricMetadata(split, epoch, self.num_epochs, iteration, total, lr)

    def hold(self) -> tuple[int, int, int, list[int]]:
        """Keep the coming updates on the device, undoable (`undo`) until `release`:
        a training step that may run again (grads_accumulation("auto"))."""
        self._held = True
        states = self._states
        lengths = [len(state.pending) for state in states]
        return self._iteration, self._items, self._own_items, lengths

    def undo(self, mark: tuple[int, int, int, list[int]]) -> None:
        """Forget the updates since `hold` returned `mark` (a dropped attempt). The
        metrics' own whole-epoch states (`epoch_value()` metrics) keep them."""
        self._iteration, self._items, self._own_items, lengths = mark
        for state, length in zip(self._states, lengths):
            del state.pending[length:]

    def release(self) -> None:
        self._held = False
        if time.monotonic() >= self._next_tick:
            self._tick()

    def _tick(self) -> None:
        """Hand on what has arrived on the host; start this tick's values on their way
        (when the previous tick's have arrived). Never waits on an accelerator."""
        records = self._arrived()
        if not self._in_flight:
            self.launch()
            records += self._arrived()  # host values (and CPU tensors) arrive at once
        self._publish(records)
        if self.renderer is not None:
            self.renderer.update(self.progress(), self.views(), records)
        self._next_tick = time.monotonic() + self.tick

    def count_tokens(self, tokens: int | Tensor | None) -> None:
        """The tokens of the batch just given to `update`, in a pass that counts them
        (None: the batch told none, so the split shows no token count). A tensor stays
        on its device until the split ends."""
        if tokens is None or self._tokens_lost:
            self._tokens, self._tokens_lost = None, True
        else:
            self._tokens = tokens if self._tokens is None else self._tokens + tokens

    def tokens(self) -> int | None:
        """The tokens of the split so far (waiting for them if need be), when the pass
        counts them and every batch told them; None otherwise."""
        return self._told_tokens(wait=True)

    def _told_tokens(self, wait: bool = False) -> int | None:
        """The split's tokens on the host (`wait`: read from the device if need be; else
        None while they are on an accelerator)."""
        tokens = self._tokens
        if isinstance(tokens, Tensor):
            if not wait and not host.on_host(tokens):
                return None
            tokens = self._tokens = int(tokens)
        return tokens

    def progress(self, final: bool = False) -> Progress:
        """Where the split stands (`final`: at its end, the token count read at last)."""
        return Progress(
            self._split,
            self._epoch,
            self.num_epochs,
            self._iteration,
            self._num_iterations,
            self._items_before + self._items,
            time.monotonic() - self._started,
            self.run_progress() if self.run_progress is not None else "",
            self._iterations_before,
            self._items_before,
            self._told_tokens(final),
        )

    def launch(self) -> None:
        """Start the values computed since the last launch on their way to the host
        (without waiting: a wait that follows for other copies, such as a checkpoint's
        snapshot, brings them too)."""
        batch: list[tuple[MetricState, list[Any]]] = []
        tensors: list[Tensor] = []
        for state in self._states:
            pending = state.pending
            if not pending:
                continue
            batch.append((state, pending))
            if state.on_device:  # a state's values first, then its weights (`_finish`)
                tensors += [row[1] for row in pending if isinstance(row[1], Tensor)]
                tensors += [row[2] for row in pending if isinstance(row[2], Tensor)]
            state.pending = []
        if batch:
            self._in_flight.add(batch, self._copies.launch(tensors, scalars=True))

    def _arrived(self, wait: bool = False) -> list[MetricRecord]:
        """The records of the launched values that reached the host, in order (`wait`:
        all of them, waiting once for the newest if need be)."""
        records: list[MetricRecord] = []
        for batch, values in self._in_flight.arrived(wait):
            records += self._finish(batch, iter(values))
        return records

    def _finish(
        self, batch: list[tuple[MetricState, list[Any]]], host_values: Any
    ) -> list[MetricRecord]:
        """Count one launch's rows into the states; return their records. A tick holds
        about a hundred rows per metric: they go through in columns, at C speed."""
        records: list[MetricRecord] = []
        for state, pending in batch:
            iterations, numbers, weights, scales, divisors = zip(*pending)
            if state.on_device:  # the host copies of the tensors, in `launch`'s order
                numbers = tuple(
                    next(host_values) if isinstance(number, Tensor) else number
                    for number in numbers
                )
                weights = tuple(
                    next(host_values) if isinstance(weight, Tensor) else weight
                    for weight in weights
                )
            if str in set(map(type, numbers)):  # a text metric's rows: shown, not counted
                rows = zip(iterations, numbers, weights, scales, divisors)
                records += self._finish_text(state, rows)
                continue
            # value * scale / divisor in float64, row by row: a correctly rounded ratio
            # (a scale or divisor of 1 changes nothing)
            values = list(map(truediv, map(mul, map(float, numbers), scales), divisors))
            floats = list(map(float, weights))
            if state is self._loss_state and state.on_device:  # (host values: checked)
                for iteration, number in zip(iterations, values):
                    if not isfinite(number):
                        self._check_loss(state, iteration, number)
            state.add_rows(values, floats)
            records += map(
                tuple.__new__,
                repeat(MetricRecord),
                zip(repeat(state.name), iterations, values, floats),
            )
        return records

    def _finish_text(self, state: MetricState, rows: Any) -> list[MetricRecord]:
        """`_finish` for rows some of whose values are text: a text value is shown as
        the metric's last value, neither counted nor logged."""
        records: list[MetricRecord] = []
        for iteration, number, weight, scale, divisor in rows:
            if isinstance(number, str):
                state.last = number
                continue
            value, weight = float(number) * scale / divisor, float(weight)
            state.add_rows([value], [weight])
            records.append(MetricRecord(state.name, iteration, value, weight))
        return records

    def views(self, final: dict[str, float] | None = None) -> list[MetricView]:
        """Every metric as shown; `final` holds the epoch values of the split that ended."""
        result = []
        for split, states in self.states.items():
            for state in states:
                matrix = None
                if final is not None and split == self._split:
                    value = final.get(state.name)
                    counts = self.matrices.get(state.name)
                    matrix = None if counts is None else tuple(tuple(row) for row in counts)
                else:
                    value = state.running
                result.append(
                    MetricView(
                        split, state.name, state.unit, state.numeric, state.last, value, matrix
                    )
                )
        return result

    def flush(self, dist: Any = None) -> None:
        """Everything computed so far to the loggers and the renderer (every process's
        values under several processes); waits for the values still on their way."""
        records = self.sync(dist)
        if self.renderer is not None:
            self.renderer.update(self.progress(), self.views(), records)
        self._next_tick = time.monotonic() + self.tick

    def resume(self, rows: Mapping[str, list[tuple[float, float]]]) -> None:
        """A run resumed mid-epoch: the current split's rows logged before its
        checkpoint, per metric name, go back into the states and to the renderer (the
        loggers have them already)."""
        records: list[MetricRecord] = []
        for state in self._states:
            found = rows.get(state.name, [])
            state.add_rows([value for value, _ in found], [weight for _, weight in found], True)
            records.extend(
                MetricRecord(state.name, index, value, weight)
                for index, (value, weight) in enumerate(found, start=1)
            )
        if records and self.renderer is not None:
            self.renderer.update(self.progress(), self.views(), records)

    def epoch_states(self) -> dict[str, Any]:
        """The current split's whole-epoch metric states (`epoch_state()`), by name: what
        a checkpoint taken mid-epoch keeps so a resumed epoch's value covers it all."""
        return exchange.epoch_states(self._states)

    def restore_epoch_states(self, saved: list[dict[str, Any]], device: Any) -> None:
        """Resuming mid-epoch: merge the saved whole-epoch states (one dict per process
        whose share this process now covers) back into the current split's metrics,
        once the first batch's check (which clears the metrics) is done."""
        self._restore = (saved, device)

    def _apply_restore(self) -> None:
        if self._restore is not None:
            saved, device = self._restore
            self._restore = None
            exchange.restore_epoch_states(self._states, saved, device)

    def log_checks(self) -> dict[str, int]:
        """The check of the last line written to each of the current split's metric logs
        (by the loggers that keep checked logs; empty on a process that writes none)."""
        checks: dict[str, int] = {}
        for logger in self.loggers.get(self._split, ()):
            told = getattr(logger, "checks", None)
            if callable(told):
                checks.update(told(self._epoch))
        return checks

    def line_counts(self, coming: bool = False) -> dict[str, int]:
        """Lines written so far this epoch per metric of the current split (`coming`:
        with the lines of the values computed but not yet written, which the next
        `flush` writes; one process)."""
        counts = {state.name: state.count for state in self._states}
        if coming:
            batches = [
                *self._in_flight.waiting(),
                [(state, state.pending) for state in self._states],
            ]
            for batch in batches:
                for state, rows in batch:
                    counts[state.name] += sum(not isinstance(row[1], str) for row in rows)
        return counts

    def sync(self, dist: Any = None) -> list[MetricRecord]:
        """Write everything computed so far (from every process) to the loggers; return
        the records written."""
        self.launch()
        records = self._arrived(wait=True)
        self._publish(records, dist)
        return records

    def _publish(self, records: list[MetricRecord], dist: Any = None) -> None:
        """Records to the loggers (under several processes, with every rank's rows)."""
        if dist is not None:
            self._items = exchange.gather_rows(
                self._states, dist, records, self._own_items, self._iteration + 1
            )
        if records:
            for logger in self.loggers.get(self._split, ()):
                logger.log(self._split, self._epoch, records)

    def end_split(self, dist: Any = None) -> dict[str, float]:
        """Finish the current split's epoch; return each metric's epoch value (under
        several processes, rank 0's, which covers every rank's samples)."""
        self.launch()
        self._apply_restore()
        if dist is not None:
            exchange.merge_epoch_states(self._states, dist)
        states = self._states
        own = [state.own_epoch_value() for state in states]
        # One wait for it all: the epoch values computed on the device are copied after
        # the split's last metric values, so once they are here, everything is.
        on_device = [value for value in own if isinstance(value, Tensor)]
        arrived = iter(self._copies.launch(on_device, scalars=True).values())
        own = [next(arrived) if isinstance(value, Tensor) else value for value in own]
        records = self._arrived(wait=True)
        self._publish(records, dist)
        aggregates: dict[str, float] = {}
        self.matrices = {}
        for state, value in zip(states, own):
            value = state.epoch_value(value)
            if value is not None:
                aggregates[state.name] = value
            matrix = getattr(state.metric, "matrix", None)
            counts = matrix() if callable(matrix) else None
            if counts is not None:
                self.matrices[state.name] = counts.tolist()
        if dist is not None:
            aggregates = dist.broadcast(aggregates)
        for logger in self.loggers.get(self._split, ()):
            logger.end_epoch(self._split, self._epoch, aggregates)
        if self.renderer is not None:
            self.renderer.update(self.progress(), self.views(), records)
            self.renderer.end_split(self.progress(final=True), self.views(final=aggregates))
        return aggregates


_grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled


def _adapt(state: MetricState, item: Any) -> Any:
    """`item` as `state`'s metric reads it, remembering the output type whose own
    `adapt` gives it (then called directly), and the metric's quick reading of that
    type (`quick_reader`, which `MetricsProcessor.update` tries first)."""
    input_type, kind = state.input_type, type(item)
    if kind is state.adapts:  # the output type's own adapt, known to work
        adapted = item.adapt(input_type)
        if type(adapted) is input_type:
            return adapted
    if kind is input_type:
        return item
    adapted = adapt(item, input_type, state.name)
    if type(adapted) is input_type and adapted is not item:
        state.adapts = kind
        state.reader = quick_reader(kind, state.metric)
    return adapted
