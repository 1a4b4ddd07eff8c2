"""Small helpers shared by the metric implementations."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ember.errors import ConfigError, TrainingError
from ember.train import host
from ember.train.metric.base import MetricValue, Number


def wide_float(device: torch.device) -> torch.dtype:
    """The float type for epoch totals: float64 where the device has it (not on MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def resolve_pad(own: int | None, given: int | None) -> int | None:
    """The metric's own padding token wins over the one the output carries."""
    return own if own is not None else given


def percent_correct(correct: torch.Tensor, mask: torch.Tensor | None = None) -> MetricValue:
    """The share of True in `correct` in percent, counting only where `mask` is True.

    Without a mask the value is the exact count of correct predictions and the
    percentage is taken on the host in float64 (`MetricValue.scale` and `divisor`,
    correctly rounded: 10 of 11 is exactly 1000 / 11). With one, the
    number of samples counted lives on the device, so the division happens there, in
    float64 where the device has it.
    """
    if mask is None:
        n = int(correct.numel())  # (a MetricValue made without a Python-level call)
        return tuple.__new__(MetricValue, (correct.sum(), n, 100.0, max(n, 1)))
    count = mask.sum()
    dtype = wide_float(count.device)
    hits = (correct & mask).sum().to(dtype)
    return MetricValue(hits * 100.0 / count.clamp(min=1).to(dtype), count)


class FirstBatch:
    """The value checks of a metric's inputs, made on the first update after each
    `reset()` (metrics reset it in `clear()`, at the start of every epoch).

    Shapes are host metadata and are checked at every update, for free; values (class
    ids within range, probabilities within [0, 1]...) live on the device. While `due`,
    a metric adds one boolean tensor per check, True when the check fails, and
    `verify()` reads them all in one transfer. The first batch of a run is checked at
    once (the metrics processor's check, `ember.train.host.at_once`): a model that
    returns the wrong values fails on its first batch, before the first optimizer step.
    Later epochs' checks never wait for an accelerator: their flags travel to the host
    without blocking, and a later `verify()` raises once they arrived.
    """

    def __init__(self) -> None:
        self.due = True
        self.active = True
        """Checks are due, or on their way to the host: `verify()` has work to do."""
        self._checks: list[tuple[torch.Tensor, Callable[[], str]]] = []
        self._late: tuple[host.Transfer, list[Callable[[], str]]] | None = None
        self._copies: host.HostCopies | None = None

    def reset(self) -> None:
        """Check the values again on the next update."""
        self.due = self.active = True
        self._checks = []

    def add(self, failed: torch.Tensor, message: Callable[[], str]) -> None:
        """A check: `failed` is a boolean tensor, True when the values are wrong;
        `message()` (called only then) says what is wrong and how to fix it."""
        if self.due:
            self._checks.append((failed.reshape(()), message))

    def verify(self) -> None:
        """Read the checks added since the last reset (once) and raise a `TrainingError`
        with the message of the first that failed."""
        late = self._late
        if late is not None and late[0].ready():
            self._late = None
            self.active = self.due
            _raise_failed(late[0].values()[0], late[1])
        if not self.due:
            return
        checks, self._checks = self._checks, []
        self.due = self.active = False
        if not checks:
            return
        if self._copies is None:
            self._copies = host.HostCopies()
        transfer = self._copies.launch([torch.stack([flag for flag, _ in checks])])
        messages = [message for _, message in checks]
        if host.wanted_at_once() or transfer.ready():
            _raise_failed(transfer.values()[0], messages)
        else:
            self._late = (transfer, messages)
            self.active = True


def _raise_failed(failed: list[bool], messages: list[Callable[[], str]]) -> None:
    for bad, message in zip(failed, messages):
        if bad:
            raise TrainingError(message())


class Probabilities:
    """Reads the scores of a binary or multi-label metric as probabilities.

    With `from_logits=True` the scores are logits and a sigmoid turns them into
    probabilities. Otherwise they must already lie in [0, 1]: thresholding logits at
    0.5 would silently move the decision to a probability of about 0.62. The range is
    one of the metric's first-batch checks (`FirstBatch`): a model whose outputs are
    logits fails on its first batch, before the first optimizer step.
    """

    def __init__(self, from_logits: bool, owner: str) -> None:
        if not isinstance(from_logits, bool):
            raise ConfigError(f"{owner}: from_logits must be True or False, got {from_logits!r}.")
        self.from_logits = from_logits
        self.owner = owner

    def __call__(
        self,
        scores: torch.Tensor,
        metric: str,
        checks: FirstBatch,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`scores` as probabilities: their sigmoid (in at least float32) with
        `from_logits`, else the scores themselves, their range added to `checks`. Rows
        where `keep` [N] is False (padding) are left out of the check."""
        if self.from_logits:
            if scores.dtype in (torch.float16, torch.bfloat16):
                scores = scores.float()  # half precision would round most probabilities
            return scores.sigmoid()
        if checks.due:
            checks.add(
                _masked_any((scores < 0) | (scores > 1), keep),
                lambda: _logits_message(scores, metric, self.owner),
            )
        return scores


def _masked_any(failed: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Whether `failed` holds a True in a row where `keep` [N] is True (all rows: None)."""
    if keep is not None:
        failed = failed & keep.reshape(keep.shape + (1,) * (failed.dim() - keep.dim()))
    return failed.any()


def _logits_message(scores: torch.Tensor, metric: str, owner: str) -> str:
    low, high = float(scores.min()), float(scores.max())
    return (
        f"{metric} reads probabilities in [0, 1], but a batch holds scores from {low:.4g} "
        f"to {high:.4g}: the outputs look like logits (as for BCEWithLogitsLoss). Pass "
        f"from_logits=True to {owner} to apply a sigmoid, or give it probabilities."
    )


# -- input checks ---------------------------------------------------------------------
def dims(shape: Sequence[int]) -> str:
    """A shape as users write it: [32, 4]."""
    return "[" + ", ".join(str(int(size)) for size in shape) + "]"


def who(owner: str, name: str) -> str:
    """How messages name a metric: its constructor, and its name when that differs
    (`HammingScoreMetric ('Hamming Score')`, `AccuracyMetric`)."""
    return owner if name in owner else f"{owner} ({name!r})"


INTEGRAL = frozenset(
    (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
    + tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))
)
"""The integer and boolean dtypes (`is_integral`), for a check without a call."""


def is_integral(tensor: torch.Tensor) -> bool:
    """Integer or boolean dtype: what class ids and token ids are stored as."""
    return not tensor.is_floating_point() and not tensor.is_complex()


def _rows(metric: str, expects: str, output: torch.Tensor, targets: torch.Tensor) -> None:
    if output.shape[0] != targets.shape[0]:
        raise TrainingError(
            f"{metric} reads {expects}; got outputs {dims(output.shape)} and targets "
            f"{dims(targets.shape)}: they must hold one row per sample, but hold "
            f"{output.shape[0]} and {targets.shape[0]} rows."
        )


def check_binary(
    metric: str, expects: str, output: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Targets [N] or [N, 1] for binary outputs of N rows; returns them as [N].

    `expects` says what the metric reads, for the message."""
    if targets.dim() == 2 and targets.shape[1] == 1:
        targets = targets.reshape(-1)
    elif targets.dim() != 1:
        fix = "give one 0/1 target per row, [N]"
        if targets.dim() == 2 and targets.shape[1] > 1:
            fix = (
                "targets of several columns (one-hot or multi-label) need a multiclass or "
                "multi-label metric and outputs of one column per class; binary scores "
                "take one 0/1 target per row, [N]"
            )
        raise TrainingError(
            f"{metric} reads {expects}; got outputs {dims(output.shape)} and targets "
            f"{dims(targets.shape)}: {fix}."
        )
    _rows(metric, expects, output, targets)
    return targets


def check_classes(metric: str, expects: str, output: torch.Tensor, targets: torch.Tensor) -> None:
    """Class-index targets [N], integers, for outputs [N, C]."""
    rows = targets.dim() == 1 and output.shape[0] == targets.shape[0]
    if rows and is_integral(targets) and output.shape[-1] != 0:
        return  # the common case, checked without building any message
    got = f"got outputs {dims(output.shape)} and targets {dims(targets.shape)}"
    if targets.dim() != 1:
        if targets.dim() == 2 and targets.shape[1] == 1:
            fix = "squeeze the targets (targets.view(-1)) to one class index per row"
        elif targets.shape == output.shape:
            fix = (
                "these look like one-hot (or probability) targets: pass class indices, "
                "not one-hot targets (targets.argmax(dim=1)), or, for a multi-label "
                "task, a MultiLabelClassificationOutput and a multi-label metric"
            )
        else:
            fix = "give one class index per row of the outputs"
        raise TrainingError(f"{metric} reads {expects}; {got}: {fix}.")
    _rows(metric, expects, output, targets)
    if not is_integral(targets):
        raise TrainingError(
            f"{metric} reads {expects}; {got} of dtype {dtype_name(targets)}: class indices are "
            "integers, pass targets.long()."
        )
    if output.shape[-1] == 0:
        raise TrainingError(f"{metric} reads {expects}; {got}: the outputs have no class.")


def check_same_shape(
    metric: str, expects: str, output: torch.Tensor, targets: torch.Tensor, dim: int | None = 2
) -> None:
    """Multi-label scores and 0/1 targets of one shape ([N, C] when `dim` is 2)."""
    if output.shape == targets.shape and (output.dim() == dim if dim else output.dim() >= 1):
        return
    got = f"got outputs {dims(output.shape)} and targets {dims(targets.shape)}"
    if output.dim() == 2 and targets.dim() == 1 and targets.shape[0] == output.shape[0]:
        fix = (
            "these look like class indices: use a single-label metric (e.g. "
            "PrecisionMetric.multiclass()), or one-hot targets "
            "(F.one_hot(targets, num_classes))"
        )
    elif output.dim() == 2 and targets.dim() == 2 and output.shape[0] == targets.shape[0]:
        fix = "give one 0/1 target per score: the outputs and targets need as many columns"
    elif output.dim() >= 1 and targets.dim() >= 1 and output.shape[0] != targets.shape[0]:
        fix = (
            f"they must hold one row per sample, but hold {output.shape[0]} and "
            f"{targets.shape[0]} rows"
        )
    else:
        fix = "reshape them to [N, C], one row per sample and one column per label"
    raise TrainingError(f"{metric} reads {expects}; {got}: {fix}.")


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def add_class_range(
    checks: FirstBatch,
    metric: str,
    output: torch.Tensor,
    targets: torch.Tensor,
    keep: torch.Tensor | None,
) -> None:
    """A first-batch check: class indices in [0, C) for outputs [N, C] (rows where
    `keep` is False aside)."""
    if not checks.due:
        return
    classes = int(output.shape[-1])
    shape = dims(output.shape)
    outside = (targets < 0) | (targets >= classes)
    if keep is not None:
        outside = outside & keep

    def message() -> str:
        values = (targets if keep is None else targets[keep]).long()
        low, high = int(values.min()), int(values.max())
        return (
            f"{metric} reads class indices in [0, {classes}) for outputs {shape} "
            f"({classes} classes); a batch holds targets from {low} to {high}. Give the "
            "model one output column per class, or, if some targets are padding, name the "
            "padding id with pad_token."
        )

    checks.add(outside.any(), message)


def add_unit_range(
    checks: FirstBatch,
    metric: str,
    targets: torch.Tensor,
    keep: torch.Tensor | None = None,
    exact: bool = False,
    hint: str = "Targets of more classes need a multiclass metric.",
) -> None:
    """A first-batch check: binary or multi-label targets in [0, 1] (0 or 1 when
    `exact`), rows where `keep` [N] is False aside."""
    if not checks.due:
        return
    outside = ((targets != 0) & (targets != 1)) if exact else ((targets < 0) | (targets > 1))

    def message() -> str:
        values = (targets if keep is None else targets[keep]).double()
        low, high = float(values.min()), float(values.max())
        wanted = "0 or 1" if exact else "in [0, 1] (positive above 0.5)"
        return (
            f"{metric} reads targets {wanted}; a batch holds targets {dims(targets.shape)} "
            f"from {low:g} to {high:g}. {hint}"
        )

    checks.add(_masked_any(outside, keep), message)


class GrowingTensor:
    """Tensors appended along their first dimension into one tensor whose capacity
    doubles when full: what a whole-epoch metric keeps (its scores, its targets) is one
    compact tensor on the device and a few Python objects, however many batches the
    epoch has. Appending costs an amortised copy of the batch; `tensor()` is a view."""

    __slots__ = ("_data", "_size")

    def __init__(self) -> None:
        self._data: torch.Tensor | None = None
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def shape(self) -> torch.Size | None:
        """The shape of one row (None before the first append)."""
        return None if self._data is None else self._data.shape[1:]

    def append(self, rows: torch.Tensor) -> None:
        count = int(rows.shape[0])
        data, size = self._data, self._size
        if data is None or size + count > data.shape[0]:
            capacity = max(64, 2 * (data.shape[0] if data is not None else 0), size + count)
            grown = torch.empty((capacity, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
            if data is not None and size:
                grown[:size] = data[:size]
            data = self._data = grown
        data[size : size + count] = rows
        self._size = size + count

    def tensor(self) -> torch.Tensor | None:
        """The rows appended so far, as one tensor (None when there are none)."""
        return None if self._data is None else self._data[: self._size]


class SummedCounts:
    """The epoch state of a metric scored from count tensors summed over the epoch
    (confusion matrices, per-class true/predicted/actual positives): each batch's counts
    are added on the batch's device, the epoch value scores the sum, and the sums of
    several processes merge by addition.

    A subclass sets `_who` (how messages name it) and defines `_score(counts, dtype)`;
    its `update` computes a batch's counts and returns `self._counted(counts, weight,
    output)`. `_checks` holds its first-batch value checks (reset with the epoch).
    """

    _who: str

    def __init__(self) -> None:
        self._checks = FirstBatch()
        self._total: torch.Tensor | None = None

    def _score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def _counted(self, counts: torch.Tensor, weight: Number, output: torch.Tensor) -> MetricValue:
        """Add a batch's `counts` to the epoch's; the batch's own score, with `weight`.
        `output` (the batch's outputs) names the shape when the class count changes."""
        if self._total is None:
            self._total = counts
        elif self._total.shape == counts.shape:
            self._total = self._total + counts
        else:
            raise TrainingError(
                f"{self._who} counts {self._total.shape[-1]} classes this epoch, but a batch "
                f"has outputs {dims(output.shape)} with {counts.shape[-1]}: every "
                "batch needs the same number of output columns."
            )
        return MetricValue(self._score(counts, torch.float32), weight)

    def epoch_value(self) -> torch.Tensor | float:
        """The value of the whole epoch, from its summed counts."""
        if self._total is None:
            return math.nan
        return self._score(self._total, wide_float(self._total.device))

    def clear(self) -> None:
        self._total = None
        self._checks.reset()

    def epoch_state(self) -> torch.Tensor | None:
        """This process's summed counts (exchanged when training on several processes)."""
        return None if self._total is None else self._total.cpu()

    def merge_epoch_states(self, states: list[torch.Tensor | None]) -> None:
        """Add other processes' counts, so `epoch_value` covers every sample."""
        for counts in states:
            if counts is None:
                continue
            if self._total is None:
                self._total = counts
            else:  # every process has the same classes (the output's width)
                self._total = self._total + counts.to(self._total.device)
