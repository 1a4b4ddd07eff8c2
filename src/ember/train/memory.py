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


def accelerator(device: torch.device) -> bool:
    """`device` is an accelerator (CUDA, XPU, MPS...), where a run's memory is scarce and
    the memory estimate runs; not the CPU."""
    return device.type not in ("cpu", "meta")


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """`(free, total)` bytes of `device`; None where torch does not tell (the CPU, MPS)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    xpu = getattr(torch, "xpu", None)
    if device.type == "xpu" and xpu is not None and hasattr(xpu, "mem_get_info"):
        return xpu.mem_get_info(device)  # type: ignore[no-any-return]
    return None


def host_memory() -> tuple[int, int] | None:
    """`(available, total)` bytes of the machine's memory (psutil's figures, else Linux's
    `/proc/meminfo`); None where neither tells."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        figures = psutil.virtual_memory()
        return int(figures.available), int(figures.total)
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            fields = dict(line.split(":", 1) for line in file if ":" in line)
        available, total = (
            int(fields[key].split()[0]) * 1024 for key in ("MemAvailable", "MemTotal")
        )
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return available, total


def start_memory_history(max_entries: int) -> None:
    """Record the CUDA allocations and their Python stacks (the last `max_entries`
    events): the post-mortem names the Python line that allocated each block."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")


def stop_memory_history() -> None:
    torch.cuda.memory._record_memory_history(enabled=None)


def largest_allocations(segments: list[dict[str, Any]], count: int = 5) -> list[str]:
    """The `count` largest live blocks of a `torch.cuda.memory_snapshot()`, largest first,
    each with its size and the Python line that allocated it (`user_frame`), when the
    history recorded stacks."""
    blocks = [
        block
        for segment in segments
        for block in segment.get("blocks", ())
        if block.get("state") == "active_allocated"
    ]
    blocks.sort(key=lambda block: int(block.get("size", 0)), reverse=True)
    lines = []
    for block in blocks[:count]:
        frame = user_frame(block.get("frames") or [])
        where = "(no stack recorded)"
        if frame is not None:
            where = f"at {frame.get('filename')}:{frame.get('line')} ({frame.get('name')})"
        lines.append(f"{size_text(int(block.get('size', 0)))} {where}")
    return lines


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The frame that names where a block was allocated, innermost first: the first
    Python frame outside torch and ember (the user's model or script); else the first
    Python frame; else the first frame (C++ only: `??:0 (torch::unwind::unwind())`
    says nothing, so a Python frame always wins over it)."""
    python = [frame for frame in frames if str(frame.get("filename", "")).endswith(".py")]
    for frame in python:
        path = str(frame.get("filename", "")).replace("\\", "/")
        if not any(part in path for part in _LIBRARY_PATHS):
            return frame
    first = python or frames
    return first[0] if first else None


_LIBRARY_PATHS = ("/torch/", "/ember/", "/contextlib.py", "/functools.py")


def size_text(size: float) -> str:
    """`size` bytes in B, KiB, MiB or GiB."""
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


# Where in a step memory ran out -----------------------------------------------------
_PHASES = (  # (a path the frame's file contains, its function names, the phase)
    ("/ember/train/optimization.py", ("backward",), "the backward pass"),
    ("/ember/train/manual.py", ("backward",), "the backward pass"),
    (
        "/ember/train/optimization.py",
        ("step", "apply", "bare_step", "_update"),
        "the optimizer step",
    ),
    ("/ember/train/manual.py", ("step",), "the optimizer step"),
    ("/ember/train/processor.py", ("update", "check", "end_split", "flush"), "a metric update"),
    ("/ember/train/fit/evaluation.py", ("run_pass", "check_validation"), "validation"),
    ("/ember/train/checkpoint/", ("save", "_write", "write"), "writing a checkpoint"),
)


def out_of_memory_phase(error: BaseException) -> str:
    """Which part of a training step an out-of-memory error came from, read off its
    traceback (the innermost part that names one): the forward pass (a model's
    `train_step`), the backward pass, the optimizer step, a metric update, validation
    or a checkpoint write."""
    phase = "the forward pass (train_step)"
    trace = error.__traceback__
    while trace is not None:
        code = trace.tb_frame.f_code
        path = code.co_filename.replace("\\", "/")
        for part, names, name in _PHASES:
            if part in path and code.co_name in names:
                phase = name
        if code.co_name == "train_step" and "/ember/" not in path:
            phase = "the forward pass (train_step)"
        trace = trace.tb_next
    return phase


def note_out_of_memory(
    error: BaseException, epoch: int, iteration: int, micro_split: int | None
) -> None:
    """Add to an out-of-memory error that ends a run where it came from."""
    split = (
        f"; grads_accumulation('auto') split every batch into {micro_split} micro-batches"
        if micro_split is not None
        else ""
    )
    error.add_note(  # type: ignore[attr-defined]
        f"ember: out of memory in {out_of_memory_phase(error)} at epoch {epoch}, "
        f"iteration {iteration}{split}."
    )
