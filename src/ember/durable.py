"""Crash-safe file replacement: the final name only ever holds a complete file.

A module of its own, importing nothing but the standard library, so that writing a
run's small records (history, sessions, metric summaries) costs no import of the
record formats.

`together()` makes the writes of one phase of a run (its start, its end) durable as
one: each file is still written whole under a temporary name, fsynced and renamed, but
the renames wait for the end of the phase, and each directory is fsynced once for all
of them, as are the files appended to in the phase (`sync_later`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


class _Phase:
    """The writes of a `together()` block, made durable at its end."""

    def __init__(self) -> None:
        self.renames: dict[Path, Path] = {}  # target: its complete, fsynced temporary
        self.appended: set[Path] = set()

    def finish(self) -> None:
        directories: dict[Path, None] = {}
        for path in self.appended:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        try:
            while self.renames:
                target, temp = next(iter(self.renames.items()))
                os.replace(temp, target)
                del self.renames[target]
                directories[target.parent] = None
        finally:
            self.drop()  # the temporaries a failed rename left
        for directory in directories:
            fsync_directory(directory)

    def drop(self) -> None:
        for temp in self.renames.values():
            with contextlib.suppress(OSError):
                os.unlink(temp)
        self.renames.clear()


_phase: _Phase | None = None


@contextlib.contextmanager
def together() -> Iterator[None]:
    """Inside the block, `atomic_write_bytes` leaves each new file complete and fsynced
    under its temporary name; at the end of the block they replace their targets and
    every directory touched is fsynced once. An error inside the block leaves every
    target as it was (the temporaries are removed). Blocks do not nest: an inner one
    joins the outer. Reading a target inside the block reads its old contents."""
    global _phase
    if _phase is not None:
        yield
        return
    phase = _phase = _Phase()
    try:
        yield
    except BaseException:
        phase.drop()
        raise
    finally:
        _phase = None
    phase.finish()


def sync_later(path: Path, fd: int) -> None:
    """Make what was appended to `path` (open as `fd`) durable: at once, or at the end
    of the `together()` block around it."""
    if _phase is None:
        os.fsync(fd)
    else:
        _phase.appended.add(path)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes | bytearray | memoryview) -> None:
    """Write `data` to `path` so that a crash leaves either the old file or the new one, whole.

    The bytes go to a temporary file in the same directory, which is flushed, fsynced and
    renamed over `path` (then the directory is fsynced so the rename itself is durable;
    inside `together()`, both wait for the end of the block). The temporary file is
    removed if anything fails. The parent directory must exist.
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
        if _phase is not None:
            earlier = _phase.renames.pop(target, None)
            _phase.renames[target] = temp
            if earlier is not None:
                os.unlink(earlier)
            return
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
