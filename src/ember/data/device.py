"""Moving a batch (tensors inside any common container) to a device."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


def to_device(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Return `batch` with every tensor on `device`: tensors, dataclasses, named
    tuples, tuples, lists and dicts are walked; objects with a `.to()` method are moved."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            field.name: to_device(getattr(batch, field.name), device, non_blocking)
            for field in dataclasses.fields(batch)
            if field.init
        }
        return dataclasses.replace(batch, **changes)
    if isinstance(batch, tuple):
        moved = [to_device(value, device, non_blocking) for value in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else tuple(moved)
    if isinstance(batch, list):
        return [to_device(value, device, non_blocking) for value in batch]
    if isinstance(batch, dict):
        return type(batch)(
            (key, to_device(value, device, non_blocking)) for key, value in batch.items()
        )
    mover = getattr(batch, "to", None)
    if callable(mover) and not isinstance(batch, (str, bytes)):
        return mover(device)
    return batch


def first_dim(batch: Any) -> int | None:
    """The leading size of the first tensor found in `batch` (its batch size), if any."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor):
        first = batch[0]
        return int(first.shape[0]) if first.dim() > 0 else None
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        values: Any = (getattr(batch, field.name) for field in dataclasses.fields(batch))
    elif isinstance(batch, (tuple, list)):
        values = iter(batch)
    elif isinstance(batch, dict):
        values = iter(batch.values())
    else:
        return None
    for value in values:
        size = first_dim(value)
        if size is not None:
            return size
    return None


def describe(batch: Any, depth: int = 0) -> str:
    """A short structural description of a batch: types, shapes, dtypes, devices."""
    if isinstance(batch, torch.Tensor):
        return f"Tensor{list(batch.shape)} {str(batch.dtype).replace('torch.', '')} {batch.device}"
    if depth > 3:
        return type(batch).__name__
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        inner = ", ".join(
            f"{f.name}={describe(getattr(batch, f.name), depth + 1)}"
            for f in dataclasses.fields(batch)
        )
        return f"{type(batch).__name__}({inner})"
    if isinstance(batch, dict):
        inner = ", ".join(f"{k!r}: {describe(v, depth + 1)}" for k, v in list(batch.items())[:8])
        return "{" + inner + "}"
    if isinstance(batch, (list, tuple)):
        inner = ", ".join(describe(v, depth + 1) for v in list(batch)[:8])
        more = ", ..." if len(batch) > 8 else ""
        return f"{type(batch).__name__}({inner}{more})"
    return type(batch).__name__
