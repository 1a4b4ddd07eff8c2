"""Per-split metric state: values waiting on the device, then exact running sums for the epoch.

The state of a metric takes the same memory at the last iteration of an epoch as at
the first: the iteration lines go to the loggers as they are produced (the file logger
appends them to `<split>/epoch-N/<Metric>.log`) and the epoch's weighted mean is kept as
two exact sums, not as a list of rows.
"""

from __future__ import annotations

import math
from operator import mul
from typing import Any, Callable, Iterable, Sequence

import torch

from ember.train import host
from ember.train.metric.base import metric_unit


class ExactSum:
    """The exact sum of many floats in a few floats of memory.

    The sum is kept as a short list of non-overlapping floats (at most a few dozen,
    usually one to three) whose exact total is the exact total of every number added,
    so `value()` is the correctly rounded sum: the same float `math.fsum` gives over all
    the numbers at once. Numbers are added in batches at C speed (`math.fsum`).
    Infinities and NaN are kept aside: the value is NaN if any NaN (or both infinities)
    was added, else the infinity added.
    """

    __slots__ = ("_nan", "_negative", "_positive", "_terms")

    def __init__(self) -> None:
        self._terms: list[float] = []
        self._positive = False
        self._negative = False
        self._nan = False

    def add(self, numbers: Iterable[float]) -> None:
        items = self._terms + list(numbers)
        try:
            total = math.fsum(items)
        except (OverflowError, ValueError):  # an overflowing sum, or inf + -inf
            total = math.nan
        if not math.isfinite(total):
            items = self._keep_finite(items)
            try:
                total = math.fsum(items)
            except OverflowError:  # finite numbers whose exact sum overflows a float
                self._terms = items
                return
        terms: list[float] = []
        while total != 0.0 and len(terms) < 64:
            terms.append(total)
            total = math.fsum([*items, *(-term for term in terms)])
        self._terms = terms

    def _keep_finite(self, items: list[float]) -> list[float]:
        finite = []
        for number in items:
            if math.isfinite(number):
                finite.append(number)
            elif math.isnan(number):
                self._nan = True
            elif number > 0:
                self._positive = True
            else:
                self._negative = True
        return finite

    def value(self) -> float:
        if self._nan or (self._positive and self._negative):
            return math.nan
        if self._positive:
            return math.inf
        if self._negative:
            return -math.inf
        try:
            return math.fsum(self._terms)
        except OverflowError:
            return math.copysign(math.inf, sum(self._terms))

    def approximate(self) -> float:
        """A cheap estimate (exact in all but the last bits), for display."""
        if self._nan or self._positive or self._negative:
            return self.value()
        return sum(self._terms)


MEAN = object()
"""`MetricState.own_epoch_value` of a metric without its own epoch value."""
_UNREAD = object()


class MetricState:
    """One registered metric in one split. Values on an accelerator are kept as they
    come and moved to the host in bulk by `MetricsProcessor`; host values are read at once.

    Its memory does not grow with the epoch: the rows of a tick go to the loggers and
    into two `ExactSum`s (value x weight, and weight); only `gathers=True` (several
    processes) keeps the rows drained since the last exchange between processes."""

    def __init__(self, metric: Any, numeric: bool, gathers: bool = False) -> None:
        self.metric = metric
        self.name: str = str(metric.name)
        self.unit = metric_unit(metric)
        self.numeric = numeric
        self.input_type: type = metric.input_type
        self.adapts: type | None = None
        """The step output type whose own `adapt` gave this metric's input."""
        self.reader: Callable[[Any], Any] | None = None
        """The metric's quick reading of that type's outputs (`output.quick_reader`)."""
        self.gathers = gathers
        self.pending: list[tuple[int, Any, Any, Any, Any]] = []
        """(iteration, value, weight, scale, divisor): host numbers, or tensors still on
        a device (the row's value is `value * scale / divisor`)."""
        self.on_device = False
        """Whether `pending` may hold tensors (values not yet read on the host)."""
        self.here: bool | None = None
        """Whether the metric's tensors are read without a wait (`host.on_host`),
        learned from its first tensor of the split."""
        self.unshared: list[tuple[float, float]] = []
        """Rows not yet exchanged between processes (kept only when `gathers`)."""
        self.count = 0
        """Rows (iteration lines) of the epoch so far."""
        self.last: float | str | None = None
        self._products = ExactSum()
        self._weights = ExactSum()

    def clear(self) -> None:
        self.metric.clear()
        self.pending.clear()
        self.on_device = False
        self.here = None
        self.unshared = []
        self.count = 0
        self.last = None
        self._products = ExactSum()
        self._weights = ExactSum()

    def add_rows(
        self, values: Sequence[float], weights: Sequence[float], shared: bool = False
    ) -> None:
        """Count a tick's rows (`values[i]` with `weights[i]`) into the epoch (`shared`:
        rows that were already exchanged between processes)."""
        if not values:
            return
        self.count += len(values)
        self._products.add(map(mul, values, weights))
        self._weights.add(weights)
        self.last = values[-1]
        if self.gathers and not shared:
            self.unshared.extend(zip(values, weights))

    def learn_here(self, tensor: torch.Tensor) -> bool:
        """Whether this metric's values are read without a wait (`host.on_host`),
        learned from its first tensor of the split."""
        here = self.here = bool(host.on_host(tensor))
        return here

    def take_unshared(self) -> list[tuple[float, float]]:
        """The rows drained since the last exchange between processes (then forgotten)."""
        rows, self.unshared = self.unshared, []
        return rows

    @property
    def running(self) -> float | None:
        """The epoch so far (weighted mean), for display."""
        weight = self._weights.approximate()
        return self._products.approximate() / weight if weight > 0 else None

    def own_epoch_value(self) -> Any:
        """The metric's own `epoch_value()` (a tensor may still be on its device), or
        `MEAN` when the epoch value is the weighted mean of the rows."""
        own = getattr(self.metric, "epoch_value", None)
        return own() if callable(own) else MEAN

    def epoch_value(self, own: Any = _UNREAD) -> float | None:
        """The epoch's value: the metric's own `epoch_value()` (`own`, already read,
        when given), or the weighted mean of the rows, exactly as readers of the log
        files compute it (`weighted_mean`)."""
        if own is _UNREAD:
            own = self.own_epoch_value()
        if own is not MEAN:
            if own is None:
                return None
            if isinstance(own, torch.Tensor):
                return float(own.detach().double().cpu())
            return float(own)
        if not self.count:
            return None
        total = self._weights.value()
        if total == 0:
            return math.nan
        return self._products.value() / total
