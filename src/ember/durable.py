"""Crash-safe file replacement: the final name only ever holds a complete file.

A module of its own, importing nothing but the standard library, so that writing a
run's small records (history, sessions, metric summaries) costs no import of the
record formats."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, whole.

    The bytes go to a temporary file in the same directory, which is flushed, fsynced and
    renamed over `path` (then the directory is fsynced so the rename itself is durable).
    The temporary file is removed if anything fails. The parent directory must exist.
    """
    target = Path(path)
    directory = target.parent
    temp = directory / f".{target.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(temp, flags, 0o666)
    try:
        try:
            view = memoryview(data).cast("B")
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    fsync_directory(directory)


def fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    if os.name == "nt":
        return
    fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
