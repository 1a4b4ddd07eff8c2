"""The `Batcher` protocol: turns a list of dataset items into one batch."""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar, runtime_checkable

from ember.errors import ConfigError

ItemT = TypeVar("ItemT", contravariant=True)
BatchT = TypeVar("BatchT", covariant=True)


@runtime_checkable
class Batcher(Protocol[ItemT, BatchT]):
    """Builds a batch from items; runs in DataLoader workers, so it stays on the CPU.

    ember moves the batch to the training device itself (tensors inside dataclasses,
    named tuples, tuples, lists and dicts are moved with `non_blocking=True`).
    """

    def batch(self, items: Sequence[ItemT]) -> BatchT: ...


def as_collate(batcher: Any) -> Callable[[Sequence[Any]], Any]:
    """A DataLoader `collate_fn` from what a user gives where a batcher goes: a `Batcher`
    (its `batch` method) or any callable from a list of items to a batch (a collate
    function: Hugging Face's `DataCollatorWithPadding`, torch_geometric's
    `Batch.from_data_list`, `torch.utils.data.default_collate`). Anything else is
    refused here, before a loader is built."""
    if callable(getattr(batcher, "batch", None)):
        return _BatcherCollate(batcher)
    if callable(batcher):
        return batcher  # type: ignore[no-any-return]
    raise ConfigError(
        f"DataLoaderBuilder(batcher): a {type(batcher).__name__} is neither a Batcher (an "
        "object with a batch(items) method) nor a callable from a list of items to a batch. "
        "Pass a Batcher, a collate function (e.g. torch.utils.data.default_collate, a "
        "Hugging Face data collator, torch_geometric's Batch.from_data_list), or None."
    )


class _BatcherCollate:
    """Adapts a Batcher to DataLoader's `collate_fn` (picklable for worker processes)."""

    def __init__(self, batcher: Batcher[Any, Any]) -> None:
        self.batcher = batcher

    def __call__(self, items: Sequence[Any]) -> Any:
        return self.batcher.batch(items)
