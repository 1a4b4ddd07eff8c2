"""Ready-made datasets, loaded from local caches that are verified before use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["MnistDataset", "MnistItem"]

if TYPE_CHECKING:
    from ember.data.datasets.mnist import MnistDataset, MnistItem


# Imported on first use rather than here: an eager import would make
# `python -m ember.data.datasets.mnist` load that module twice (runpy warns about it).
def __getattr__(name: str) -> Any:
    """Resolve `MnistDataset` and `MnistItem` from `ember.data.datasets.mnist` on first use."""
    if name in __all__:
        value = getattr(importlib.import_module("ember.data.datasets.mnist"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """List the lazy names too, so completion and `dir()` show them."""
    return sorted(set(globals()) | set(__all__))
