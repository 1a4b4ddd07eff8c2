"""A seeded, epoch-aware, resumable, shardable sampler.

The order of epoch `e` depends only on `(seed, e)`: it is the same across runs and
with or without worker processes. A run resumed mid-epoch asks the sampler to skip
the samples already seen, which costs one permutation, not a pass over the data.
The epoch's order is one int64 array (8 bytes a sample); indices become Python ints
a chunk at a time as the loader asks for them, never a list of the whole epoch.
Under several processes each one takes every `world`-th index of what is left
(`shard`), so global step k covers the same samples as step k of one process with a
`world` times larger batch.
"""

from __future__ import annotations

import itertools
from typing import Iterator, Sized

import numpy as np
import torch


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

    def shard_lengths(self) -> list[int]:
        """How many samples each process reads in the next iteration."""
        remaining = max(0, len(self.data_source) - self._skip)
        return [len(range(rank, remaining, self.world)) for rank in range(self.world)]

    def order(self, epoch: int) -> np.ndarray:
        """The full index order of `epoch`."""
        n = len(self.data_source)
        if self.seed is None:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([int(self.seed), int(epoch)])
        return rng.permutation(n)

    def __iter__(self) -> Iterator[int]:
        if not self._epoch_set and self._started:
            self.epoch += 1
        self._started = True
        self._epoch_set = False
        start, self._skip = self._skip, 0
        if self.seed is None:  # in order: nothing to hold
            return iter(range(start + self.rank, len(self.data_source), self.world))
        return _chunks(self.order(self.epoch)[start:][self.rank :: self.world])

    def __len__(self) -> int:
        return self.shard_lengths()[self.rank]


CHUNK = 1024
"""Indices turned into Python ints at a time."""


def _chunks(order: np.ndarray) -> Iterator[int]:
    """The indices of `order` as Python ints, `CHUNK` at a time (each index is then
    handed on by C code: no Python frame resumes per sample)."""
    return itertools.chain.from_iterable(
        order[begin : begin + CHUNK].tolist() for begin in range(0, len(order), CHUNK)
    )
