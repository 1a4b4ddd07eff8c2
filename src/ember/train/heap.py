"""The objects a process holds before a fit stay out of the garbage collector's passes
during it.

A process that imported torch holds hundreds of thousands of objects that live as long
as it does. A full pass of Python's cycle collector walks all of them (100-200 ms on a
CPU), and when one falls inside a fit, its time is the fit's: one such pass is 20% of an
epoch of a small MLP. Which step it falls on depends on how many objects the imports
left behind (a process without byte-code caches compiles its modules and leaves many
more) and on what the loop allocates. During a fit those objects are frozen
(`gc.freeze()`): the collector's passes walk only what the fit made, and they are given
back to it when the fit ends (`gc.unfreeze()`).

On an accelerator the collector makes one full pass first: the cycles of an earlier run
(a learner of the previous trial of a search, say) give their device memory back before
this one allocates its own. On the CPU it does not; such cycles are collected after the
fit. A process whose collector is disabled, or that froze objects itself, is left as it
is.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch

from ember.train.memory import accelerator


@contextlib.contextmanager
def frozen_heap(device: torch.device) -> Iterator[None]:
    """Freeze what the process holds for the time of the block (see the module's text)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    if accelerator(device):
        gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
