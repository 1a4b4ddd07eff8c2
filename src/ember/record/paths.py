"""Record file names: adding the recorder's extension and finding the file to read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ember.errors import RecordError
from ember.record.problem import record_error


def with_extension(path: str | os.PathLike[str], extension: str) -> Path:
    """`path` ending in ".{extension}", appended if it is not there already."""
    p = Path(path)
    suffix = "." + extension
    return p if p.name.endswith(suffix) else p.with_name(p.name + suffix)


def find_record(path: str | os.PathLike[str], extensions: Sequence[str]) -> Path:
    """The existing file `path` names, trying `path` plus each extension; `RecordError` if none.

    A path already ending in one of the extensions is taken as is; otherwise the extended
    names come first, then the bare path, and more than one extended match is ambiguous.
    """
    p = Path(path)
    if any(p.name.endswith("." + ext) for ext in extensions):
        candidates = [p]
    else:
        extended = [with_extension(p, ext) for ext in extensions]
        found = [c for c in extended if c.is_file()]
        if len(found) > 1:
            names = ", ".join(str(c) for c in found)
            raise RecordError(f"{p} is ambiguous: several records match ({names}); name one")
        candidates = found + [p] + extended
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if p.exists():
        raise RecordError(f"cannot read {p}: it is not a regular file")
    also = [str(c) for c in candidates[1:]]
    tried = f" (also tried {', '.join(also)})" if also else ""
    raise RecordError(f"no record at {p}{tried}")


def read_file(path: Path) -> bytes:
    """All bytes of `path`; any OS error becomes a `RecordError` naming the file."""
    try:
        return path.read_bytes()
    except (OSError, MemoryError) as exc:
        raise record_error(path, exc) from exc
