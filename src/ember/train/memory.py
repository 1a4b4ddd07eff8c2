"""The out-of-memory post-mortem of `LearnerBuilder.memory_history()`.

A run on CUDA records its allocations; when an out-of-memory error ends it anyway,
PyTorch's memory snapshot is written to the artifact directory and the error names the
largest live allocations.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

MEMORY_VIZ = "https://pytorch.org/memory_viz"


def start_memory_history(max_entries: int) -> None:
    """Record the CUDA allocations and their stacks (the last `max_entries` events)."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries)


def stop_memory_history() -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def largest_allocations(segments: list[dict[str, Any]], count: int = 5) -> list[str]:
    """The `count` largest live blocks of a `torch.cuda.memory_snapshot()`, largest first,
    each with its size and where it was allocated (the innermost frame outside torch,
    when the history recorded stacks)."""
    blocks = [
        block
        for segment in segments
        for block in segment.get("blocks", ())
        if block.get("state") == "active_allocated"
    ]
    blocks.sort(key=lambda block: int(block.get("size", 0)), reverse=True)
    lines = []
    for block in blocks[:count]:
        frames = block.get("frames") or []
        ours = [frame for frame in frames if "/torch/" not in str(frame.get("filename", ""))]
        frame = (ours or frames or [None])[0]
        where = "(no stack recorded)"
        if frame is not None:
            where = f"at {frame.get('filename')}:{frame.get('line')} ({frame.get('name')})"
        lines.append(f"{_size(int(block.get('size', 0)))} {where}")
    return lines


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def memory_post_mortem(error: BaseException, path: Path) -> None:
    """After an out-of-memory error ended a run: write PyTorch's memory snapshot to
    `path` (atomically; opened at https://pytorch.org/memory_viz, never by ember) and add
    a note to `error` naming the largest live allocations and the file."""
    partial = path.with_name(path.name + ".partial")
    try:
        torch.cuda.memory._dump_snapshot(str(partial))
        os.replace(partial, path)
        largest = largest_allocations(torch.cuda.memory_snapshot())
    except Exception as failure:  # the run's own error matters more: say why, go on
        partial.unlink(missing_ok=True)
        error.add_note(f"ember: the memory snapshot could not be written: {failure}")  # type: ignore[attr-defined]
        return
    listing = "".join(f"\n  {line}" for line in largest) or "\n  (none)"
    error.add_note(  # type: ignore[attr-defined]
        f"ember: the largest live CUDA allocations:{listing}\n"
        f"The allocation history is in {path}: open it at {MEMORY_VIZ}."
    )
