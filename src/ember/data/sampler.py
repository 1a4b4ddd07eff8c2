"""A seeded, epoch-aware, resumable, shardable sampler.

The order of epoch `e` depends only on `(seed, e)`: it is the same across runs and
with or without worker processes. A run resumed mid-epoch asks the sampler to skip
the samples already seen, which costs one permutation, not a pass over the data.
The epoch's order is one int64 array (8 bytes a sample); indices become Python ints
a chunk at a time as the loader asks for them, never a list of the whole epoch.
Under several processes each one takes every `world`-th index of what is left
(`shard`), so global step k covers the same samples as step k of one process with a
`world` times larger batch. A `Layout` (`deal`) deals each optimizer step's samples
to micro-batches and processes the same way on any number of processes.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sized

import numpy as np
import torch

from ember.data.layout import Layout


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Yields indices of `data_source`, shuffled per epoch when `seed` is given.

    `set_epoch(e)` chooses the epoch (1-based, as the Learner counts); without it,
    each new iteration moves to the next epoch. `skip(n)` drops the first `n`
    indices of the epoch order for the next iteration only (mid-epoch resume), before
    sharding. `shard(rank, world)` makes this process read its part.
    """

    def __init__(self, data_source: Sized, seed: int | None = None) -> None:
        self.data_source = data_source
        self.seed = seed
        self.epoch = 1
        self._epoch_set = False
        self._started = False
        self._skip = 0
        self.rank = 0
        self.world = 1
        self.layout: Layout | None = None
        """How each step's samples are dealt (`deal`); None: `world`-th indices."""
        self.whole_steps = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._epoch_set = True

    def skip(self, num_samples: int) -> None:
        self._skip = max(0, int(num_samples))

    def shard(self, rank: int, world: int) -> None:
        """Read indices `rank`, `rank + world`, ... of the (remaining) epoch order."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a world of {world} processes")
        self.rank, self.world = int(rank), int(world)

    def deal(self, layout: Layout, rank: int, world: int, whole_steps: bool = False) -> None:
        """Read the samples `layout` deals to process `rank` of `world`, micro-batch by
        micro-batch (`batches`); `whole_steps`: an epoch ends with its last full step
        (the loader's `drop_last`)."""
        self.shard(rank, world)
        self.layout, self.whole_steps = layout, bool(whole_steps)

    def _remaining(self) -> int:
        """Samples of the epoch left after the skip, in whole steps under `whole_steps`."""
        total = len(self.data_source)
        if self.layout is not None and self.whole_steps:
            total -= total % self.layout.global_batch
        return max(0, total - self._skip)

    def batches(self) -> Iterator[list[int]]:
        """The indices of each of this process's micro-batches in the next iteration
        (under a layout, see `deal`)."""
        if self.layout is None:
            raise ValueError("batches() reads the micro-batches of a layout: call deal() first")
        start, order = self._skip, self._next_order()
        positions, sizes = self.layout.positions(self.rank, self.world, self._remaining())
        self._skip = 0
        return _lists(order, positions + start if order is None else positions, sizes)

    def batch_count(self) -> int:
        """Micro-batches this process reads in the next iteration (under a layout)."""
        assert self.layout is not None
        return len(self.layout.positions(self.rank, self.world, self._remaining())[1])

    def _next_order(self) -> np.ndarray | None:
        """Move to the next epoch unless one was set; the remaining order (None: in
        order, from the skip)."""
        if not self._epoch_set and self._started:
            self.epoch += 1
        self._started = True
        self._epoch_set = False
        if self.seed is None:
            return None
        return self.order(self.epoch)[self._skip :]

    def shard_lengths(self) -> list[int]:
        """How many samples each process reads in the next iteration."""
        remaining = self._remaining()
        if self.layout is not None:
            return [
                sum(self.layout.positions(rank, self.world, remaining)[1])
                for rank in range(self.world)
            ]
        return [len(range(rank, remaining, self.world)) for rank in range(self.world)]

    def order(self, epoch: int) -> np.ndarray:
        """The full index order of `epoch`."""
        n = len(self.data_source)
        if self.seed is None:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([int(self.seed), int(epoch)])
        return rng.permutation(n)

    def __iter__(self) -> Iterator[int]:
        if self.layout is not None:
            return itertools.chain.from_iterable(self.batches())
        start = self._skip
        order = self._next_order()
        self._skip = 0
        if order is None:  # in order: nothing to hold
            return iter(range(start + self.rank, len(self.data_source), self.world))
        return _chunks(order[self.rank :: self.world])

    def __len__(self) -> int:
        return self.shard_lengths()[self.rank]


class DealtBatches(torch.utils.data.Sampler[list[int]]):
    """The batch sampler of a `ResumableSampler` under a layout (`deal`): the indices
    of each of this process's micro-batches."""

    def __init__(self, sampler: ResumableSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler.batches()

    def __len__(self) -> int:
        return self.sampler.batch_count()


CHUNK = 1024
"""Indices turned into Python ints at a time."""


def _chunks(order: np.ndarray) -> Iterator[int]:
    """The indices of `order` as Python ints, `CHUNK` at a time (each index is then
    handed on by C code: no Python frame resumes per sample)."""
    return itertools.chain.from_iterable(
        order[begin : begin + CHUNK].tolist() for begin in range(0, len(order), CHUNK)
    )


def _lists(
    order: np.ndarray | None, positions: np.ndarray, sizes: list[int]
) -> Iterator[list[int]]:
    """Each micro-batch's indices: `order` at `positions` (the positions themselves
    when `order` is None: the epoch in order), `sizes[i]` of them for the i-th."""
    begin = chunk_end = offset = 0
    chunk: list[int] = []
    for size in sizes:  # indices become Python ints a chunk of micro-batches at a time
        if begin + size > chunk_end:
            stop = min(len(positions), begin + max(CHUNK, size))
            picked = positions[begin:stop]
            chunk = (picked if order is None else order[picked]).tolist()
            chunk_end, offset = stop, begin
        yield chunk[begin - offset : begin - offset + size]
        begin += size
