"""The `Recorder` protocol: what every recorder offers, so callers can take any of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ember.record.header import Kind
from ember.record.precision import Precision
from ember.record.target import Device


@runtime_checkable
class Recorder(Protocol):
    """Saves items (modules, optimizers, stateful objects, state trees) to files and back."""

    file_extension: str
    precision: Precision

    def save(self, item: Any, path: str | os.PathLike[str], *, kind: Kind | None = None) -> Path:
        """Record `item` at `path` (extension appended if missing) and return the final path."""
        ...

    def load(self, target: Any, path: str | os.PathLike[str], *, device: Device = None) -> Any:
        """Read the record at `path` into `target` (or return the state tree if it is None)."""
        ...
