"""`load`: read any ember record, choosing the reader from the file's contents."""

from __future__ import annotations

import os
from typing import Any

from ember.record.paths import find_record
from ember.record.reader import read_record
from ember.record.target import Device, restore

EXTENSIONS: tuple[str, ...] = ("mpk", "mpk.gz", "bin", "bin.gz", "json", "json.gz", "safetensors")
"""Extensions tried, in order, when `path` names no existing file."""


def load(target: Any, path: str | os.PathLike[str], *, device: Device = None) -> Any:
    """Load the ember record at `path` into `target`, whatever recorder wrote it.

    The format is recognised from the content (gzip and format magic), not the name; the
    extension may be left out. Returns the target, or the decoded state tree (tensors on the
    CPU or `device`) when `target` is None or a dict. Every failure is a `RecordError`.
    """
    file = find_record(path, EXTENSIONS)
    return restore(read_record(file), target, file, device)
