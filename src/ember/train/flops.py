"""Counting the model's FLOPs once, on the first training batch, for the metrics that
ask for them (`set_flops(batch_flops, device, dtype)`, as `ThroughputMetric("mfu")`,
which divides them by that batch's samples as it counts them).

The count runs during that batch's forward and backward under
`torch.utils.flop_counter.FlopCounterMode`: no extra step is taken, and the counter only
observes the operators (the results, the random state and an exact resume are as
without it). Matrix products, convolutions and attention are counted (the FLOPs that
matter for utilisation); a module recomputed by activation checkpointing is counted
twice, as the device does run it twice.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterable, Iterator

import torch

log = logging.getLogger(__name__)


class FlopCount:
    """Counts the first batch handed to `count` for `metrics` that have `set_flops`."""

    def __init__(
        self,
        metrics: Iterable[Any],
        model: torch.nn.Module,
        device: torch.device,
        mixed: str | None,
    ) -> None:
        self.targets = [m for m in metrics if callable(getattr(m, "set_flops", None))]
        self.model, self.device, self.mixed = model, device, mixed
        self.done = not self.targets
        self.batch_flops: int | None = None
        """The FLOPs of the first batch, once counted."""

    def count(self) -> ContextManager[None]:
        """Around one batch's forward and backward: counted the first time only."""
        if self.done:
            return nullcontext()
        return self._count()

    @contextmanager
    def _count(self) -> Iterator[None]:
        from torch.utils.flop_counter import FlopCounterMode

        from ember.train.metric.throughput import compute_dtype

        self.done = True
        counter = FlopCounterMode(display=False)
        with counter:
            yield
        self.batch_flops = counter.get_total_flops()
        dtype = next(
            (p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32
        )
        for metric in self.targets:
            metric.set_flops(self.batch_flops, self.device, compute_dtype(dtype, self.mixed))
