"""A seeded, epoch-aware, resumable sampler.

The order of epoch `e` depends only on `(seed, e)`: it is the same across runs and
with or without worker processes. A run resumed mid-epoch asks the sampler to skip
the samples already seen, which costs one permutation, not a pass over the data.
"""

from __future__ import annotations

from typing import Iterator, Sized

import numpy as np
import torch


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Yields indices of `data_source`, shuffled per epoch when `seed` is given.

    `set_epoch(e)` chooses the epoch (1-based, as the Learner counts); without it,
    each new iteration moves to the next epoch. `skip(n)` drops the first `n`
    indices of the next iteration only (mid-epoch resume).
    """

    def __init__(self, data_source: Sized, seed: int | None = None) -> None:
        self.data_source = data_source
        self.seed = seed
        self.epoch = 1
        self._epoch_set = False
        self._started = False
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._epoch_set = True

    def skip(self, num_samples: int) -> None:
        self._skip = max(0, int(num_samples))

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
        return iter(self.order(self.epoch)[start:].tolist())

    def __len__(self) -> int:
        return len(self.data_source)
