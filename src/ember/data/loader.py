"""`DataLoaderBuilder`: a torch DataLoader configured the way training needs it."""

from __future__ import annotations

import signal
from typing import Any, Callable, Sequence, Sized

import torch
from torch.utils.data import DataLoader, Dataset

from ember.data.batcher import Batcher, as_collate
from ember.data.sampler import ResumableSampler
from ember.errors import ConfigError, DatasetError


def _ignore_sigint(worker_id: int) -> None:
    """Workers leave Ctrl-C to the main process, which stops training gracefully."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class DataLoaderBuilder:
    """Chained options, then `build(dataset)` returns a plain `torch.utils.data.DataLoader`.

    `batcher` turns a list of dataset items into a batch: a `Batcher`, or any collate
    function (a callable from the list to the batch); None: torch's default collation.

    Shuffling is seeded per epoch (see `ResumableSampler`); the loader gets its own
    random generator so building or iterating it never disturbs the global RNG.
    """

    def __init__(
        self, batcher: Batcher[Any, Any] | Callable[[Sequence[Any]], Any] | None = None
    ) -> None:
        self._collate = as_collate(batcher) if batcher is not None else None
        self._batch_size = 1
        self._seed: int | None = None
        self._num_workers = 0
        self._drop_last = False
        self._pin_memory: bool | None = None
        self._device: torch.device | None = None
        self._persistent_workers = True
        self._prefetch_factor: int | None = None

    def batch_size(self, size: int) -> DataLoaderBuilder:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {size!r}.")
        self._batch_size = size
        return self

    def shuffle(self, seed: int) -> DataLoaderBuilder:
        """Shuffle every epoch, in an order fixed by `seed` and the epoch number."""
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"shuffle() takes an int seed, got {seed!r}.")
        self._seed = seed
        return self

    def num_workers(self, workers: int) -> DataLoaderBuilder:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ConfigError(f"num_workers must be an int >= 0, got {workers!r}.")
        self._num_workers = workers
        return self

    def drop_last(self, drop: bool = True) -> DataLoaderBuilder:
        self._drop_last = bool(drop)
        return self

    def pin_memory(self, pin: bool = True) -> DataLoaderBuilder:
        """Pin host memory for faster copies to CUDA (default: on when the batches are
        for a CUDA device, see `device()`; without `device()`, when CUDA is available)."""
        self._pin_memory = bool(pin)
        return self

    def device(self, device: str | torch.device) -> DataLoaderBuilder:
        """The device the batches are trained on. For a CUDA device the loader builds
        them in pinned host memory (unless `pin_memory(False)`), so that the learner's
        copies to the device (always `non_blocking=True`) overlap with the work queued
        on it; for any other device, in ordinary memory."""
        try:
            parsed = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"device(): {error}. Pass e.g. 'cuda', 'cuda:1' or 'cpu'.") from None
        if parsed.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device({str(device)!r}): CUDA is not available on this machine (torch "
                f"{torch.__version__}). Pass the device the model trains on, e.g. 'cpu'."
            )
        self._device = parsed
        return self

    def persistent_workers(self, keep: bool = True) -> DataLoaderBuilder:
        """Keep worker processes alive between epochs (default: on)."""
        self._persistent_workers = bool(keep)
        return self

    def prefetch_factor(self, factor: int) -> DataLoaderBuilder:
        self._prefetch_factor = int(factor)
        return self

    def build(self, dataset: Dataset[Any]) -> DataLoader[Any]:
        if not isinstance(dataset, Sized):
            raise DatasetError(
                f"{type(dataset).__name__} has no __len__: DataLoaderBuilder needs a "
                "map-style dataset. Use torch.utils.data.DataLoader directly for iterable datasets."
            )
        if len(dataset) == 0:
            raise DatasetError(
                f"The dataset {type(dataset).__name__} is empty (length 0): there is nothing to "
                "train on. Check the path or the filter that produced it."
            )
        generator = torch.Generator()
        generator.manual_seed(self._seed if self._seed is not None else 0)
        pin = self._pin_memory
        if pin is None:
            cuda = self._device.type == "cuda" if self._device is not None else None
            pin = torch.cuda.is_available() if cuda is None else cuda
        workers = self._num_workers
        extra: dict[str, Any] = {}
        if workers > 0:
            extra["persistent_workers"] = self._persistent_workers
            extra["worker_init_fn"] = _ignore_sigint
            if self._prefetch_factor is not None:
                extra["prefetch_factor"] = self._prefetch_factor
        return DataLoader(
            dataset,
            batch_size=self._batch_size,
            sampler=ResumableSampler(dataset, self._seed),
            num_workers=workers,
            collate_fn=self._collate,
            drop_last=self._drop_last,
            pin_memory=pin,
            generator=generator,
            **extra,
        )
