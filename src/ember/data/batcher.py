"""The `Batcher` protocol: turns a list of dataset items into one batch."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, TypeVar, runtime_checkable

ItemT = TypeVar("ItemT", contravariant=True)
BatchT = TypeVar("BatchT", covariant=True)


@runtime_checkable
class Batcher(Protocol[ItemT, BatchT]):
    """Builds a batch from items; runs in DataLoader workers, so it stays on the CPU.

    ember moves the batch to the training device itself (tensors inside dataclasses,
    named tuples, tuples, lists and dicts are moved with `non_blocking=True`).
    """

    def batch(self, items: Sequence[ItemT]) -> BatchT: ...


class _BatcherCollate:
    """Adapts a Batcher to DataLoader's `collate_fn` (picklable for worker processes)."""

    def __init__(self, batcher: Batcher[Any, Any]) -> None:
        self.batcher = batcher

    def __call__(self, items: Sequence[Any]) -> Any:
        return self.batcher.batch(items)
