"""Micro-batches on demand: a training step that runs out of memory is run again split.

With `grads_accumulation("auto")`, a training step that raises `torch.OutOfMemoryError`
is not the end of the run: its gradients are cleared, what can be freed is freed, and
every batch is split along its first dimension into twice as many micro-batches, until
the step fits. The micro-batches' losses are weighted by their share of the step's
samples and their gradients accumulated, so the update is the one of the unsplit batch.
The split factor stays for the rest of the run and is kept in the checkpoints.

With `LearnerBuilder.memory_history()`, a run on CUDA records its allocations; when an
out-of-memory error ends it anyway, PyTorch's memory snapshot is written to the artifact
directory and the error names the largest live allocations.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ember.errors import TrainingError

if TYPE_CHECKING:
    from ember.train.batches import Step

log = logging.getLogger(__name__)


def split_batch(batch: Any, parts: int) -> list[Any]:
    """`batch` cut into `parts` micro-batches along the first dimension of its tensors
    (in dicts, lists, tuples, named tuples and dataclasses; other plain values are
    repeated in each part).
    Sizes differ by at most one: `torch.tensor_split`."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return [batch] * parts
        return list(torch.tensor_split(batch, parts))
    if isinstance(batch, Mapping):
        pieces = {key: split_batch(value, parts) for key, value in batch.items()}
        rebuild: Any = type(batch)
        return [rebuild({key: pieces[key][i] for key in batch}) for i in range(parts)]
    if isinstance(batch, (list, tuple)):
        columns = [split_batch(value, parts) for value in batch]
        rows = [[column[i] for column in columns] for i in range(parts)]
        if hasattr(batch, "_fields"):  # a named tuple
            return [type(batch)(*row) for row in rows]
        return [type(batch)(row) for row in rows]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        if hasattr(batch, "num_items"):
            raise TrainingError(
                f"grads_accumulation('auto') cannot split a {type(batch).__name__} batch: it "
                "says its own num_items, which a split along the first dimension would not "
                "keep. Set grads_accumulation(n) with a smaller batch size instead."
            )
        names = [field.name for field in dataclasses.fields(batch) if field.init]
        pieces = {name: split_batch(getattr(batch, name), parts) for name in names}
        return [
            dataclasses.replace(batch, **{name: pieces[name][i] for name in names})
            for i in range(parts)
        ]
    if hasattr(batch, "num_items") or hasattr(batch, "__dict__"):
        raise TrainingError(
            f"grads_accumulation('auto') cannot split a {type(batch).__name__} batch into "
            "micro-batches: it splits tensors, and dicts, lists, tuples and dataclasses of "
            "tensors, along their first dimension. Give batches as such structures, or set "
            "grads_accumulation(n) with a smaller batch size."
        )
    return [batch] * parts  # a plain value (a number, a string): every part has it


def split_step(step: Step, factor: int) -> Step:
    """`step` with every batch cut into `factor` micro-batches (at most one a sample);
    `origins` maps each back to its batch (its iteration), whose samples count once, on
    its first micro-batch, and each loss share is the micro-batch's part of its batch's."""
    if factor == 1:
        return step
    batches: list[Any] = []
    sizes: list[int] = []
    shares: list[float] = []
    items: list[int] = []
    origins: list[int] = []
    for index, batch in enumerate(step.batches):
        size = step.sizes[index]
        parts = max(1, min(factor, size))
        for number, piece in enumerate(split_batch(batch, parts)):
            piece_size = size // parts + (number < size % parts)  # as tensor_split cuts
            batches.append(piece)
            sizes.append(piece_size)
            shares.append(step.shares[index] * piece_size / size if size else step.shares[index])
            items.append(step.items[index] if number == 0 else 0)
            origins.append(index)
    return step._replace(batches=batches, sizes=sizes, shares=shares, items=items, origins=origins)


def run_split(optim: Any, step: Step, run_step: Callable[[Step], bool]) -> bool:
    """Run `step` split by `optim.micro_split`; on out-of-memory, drop the gradients of
    the half-done step (`optim.skip()`), free memory, double the split and run it again.
    The error is raised when the batches cannot be split further (one sample each)."""
    while True:
        factor = optim.micro_split
        try:
            return run_step(split_step(step, factor))
        except torch.OutOfMemoryError as error:
            largest = max(step.sizes, default=1)
            if factor >= largest:
                error.add_note(  # type: ignore[attr-defined]
                    "ember: grads_accumulation('auto') already splits every batch into "
                    f"micro-batches of one sample ({factor} per batch): the model does not "
                    "fit for a single sample."
                )
                raise
            message = str(error).splitlines()[0] if str(error) else "out of memory"
        # out of the except block: the error and its frames (the step's tensors) are gone
        optim.skip()
        free_memory()
        optim.micro_split = min(factor * 2, largest)
        log.warning(
            "Out of memory at iteration %d (%s): every batch is now split into %d "
            "micro-batches (gradients accumulated: the same update), for the rest of the run.",
            step.first,
            message,
            optim.micro_split,
        )


def free_memory() -> None:
    """Collect the garbage of the failed step and give the cached CUDA memory back."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# Out-of-memory post-mortem (LearnerBuilder.memory_history) ----------------------------
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
