"""Counting the model's FLOPs once, on the first training batch, for the metrics that
ask for them (`set_flops(flops_per_sample, device, dtype)`, as `ThroughputMetric("mfu")`).

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
        self.flops_per_sample: float | None = None

    def count(self, samples: int) -> ContextManager[None]:
        """Around one batch's forward and backward: counted the first time only."""
        if self.done:
            return nullcontext()
        return self._count(samples)

    @contextmanager
    def _count(self, samples: int) -> Iterator[None]:
        from torch.utils.flop_counter import FlopCounterMode

        from ember.train.metric.throughput import compute_dtype

        self.done = True
        counter = FlopCounterMode(display=False)
        with counter:
            yield
        flops = counter.get_total_flops()
        self.flops_per_sample = flops / samples if flops and samples else None
        dtype = next(
            (p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32
        )
        for metric in self.targets:
            metric.set_flops(self.flops_per_sample, self.device, compute_dtype(dtype, self.mixed))
