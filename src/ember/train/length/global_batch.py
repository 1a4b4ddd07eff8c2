"""A run's global batch: the samples of each optimizer step over every process, fixed
when the run starts (`global_batch(n)`, or the first launch's batch size x processes
x accumulation) and kept when it resumes on another number of processes (`Layout`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ember.data.layout import Layout
from ember.errors import ConfigError, TrainingError
from ember.train.length.position import Position


def _counts(layout: Layout, limit: int = 64) -> str:
    """The numbers of processes (up to `limit`) the layout's steps divide among."""
    fits = [n for n in range(1, limit + 1) if layout.for_processes(n) is not None]
    return ", ".join(map(str, fits[:8])) + (", ..." if len(fits) > 8 else "")


def run_layout(
    loader: Any, world: int, accumulation: int, asked: int | None, saved: Any, notes: list[str]
) -> tuple[Layout | None, Layout | None]:
    """The layout the run's steps take (None: the loader's own batches, one process)
    and the one its checkpoints note (the run's, on `world` processes). `asked`: the
    global batch of `global_batch(n)`; `saved`: what the resumed checkpoint noted;
    warnings for the run's log are added to `notes`."""
    size = getattr(loader, "batch_size", None)
    size = size if type(size) is int and size > 0 else None
    before = Layout.from_state(saved)
    base: Layout | None
    if asked is not None:
        if size is None:
            raise ConfigError(
                f"global_batch({asked}) deals each step's samples into batches no larger "
                "than the training loader's batch size, and this loader has none. Give "
                "the loader a batch_size (torch's DataLoader(batch_size=...) or "
                "DataLoaderBuilder().batch_size(...))."
            )
        if before is not None and before.global_batch == asked:
            base = before
        else:
            base = Layout.for_global_batch(asked, world, size)
            if base is None:
                raise TrainingError(
                    f"global_batch({asked}) cannot be shared by {world} processes: each "
                    f"would take {asked / world:g} samples a step. Give a global batch "
                    f"that {world} divides, or run on a number of processes that divides "
                    f"{asked}."
                )
            if before is not None:
                notes.append(
                    f"The run's global batch changes at this resume, from "
                    f"{before.global_batch} to {asked} samples per optimizer step "
                    f"(global_batch({asked}))."
                )
    elif before is not None and _launched_alike(saved, size, accumulation):
        base = before
    elif size is not None:
        base = Layout(size, world, accumulation)
    else:
        return None, None
    layout = base.for_processes(world, size)
    if layout is None:
        raise TrainingError(
            f"The run's steps take {base.global_batch} samples in {base.shards} "
            f"micro-batches of {base.micro}, which cannot be shared by {world} processes. "
            f"Resume on {_counts(base)} processes, or give the run another global batch "
            "with global_batch(n) (the rest of the epoch then takes other steps)."
        )
    if before is not None and asked is None and before.global_batch != layout.global_batch:
        notes.append(
            f"The run's global batch changes at this resume, from {before.global_batch} "
            f"to {layout.global_batch} samples per optimizer step: the training loader's "
            f"batch size and accumulation are {size} and {accumulation} now, "
            f"{saved.get('batch_size')} and {saved.get('accumulation')} when the "
            f"checkpoint was written. To keep {before.global_batch}, give "
            f"global_batch({before.global_batch})."
        )
    if world == 1 and size is not None and layout == Layout(size, 1, accumulation):
        return None, layout  # the loader's own batches, which this layout describes
    return layout, layout


def _launched_alike(saved: dict[str, Any], size: int | None, accumulation: int) -> bool:
    """The training loader's batch size and the accumulation are those of the launch
    that wrote the checkpoint (or it did not note them)."""
    then = (saved.get("batch_size", size), saved.get("accumulation", accumulation))
    return then == (size, accumulation)


def resumed_position(position: Position, saved: Any, layout: Layout | None, world: int) -> Position:
    """A checkpoint inside an epoch, taken on another number of processes or layout:
    the batches of this process done, counted as this run's `layout` counts them (the
    samples done are the same)."""
    before = Layout.from_state(saved)
    if not position.iteration or before is None or layout is None:
        return position
    processes = saved.get("processes") if isinstance(saved, dict) else None
    if (before, processes) == (layout, world):
        return position
    steps, rest = divmod(position.items, layout.global_batch)
    if rest or before.global_batch != layout.global_batch:
        return position  # other steps from here on: the batches done stay as counted
    return replace(position, iteration=steps * (layout.shards // world))


def describe(layout: Layout, world: int) -> str:
    """The layout in words, for the run's log."""
    per = layout.shards // world
    return (
        f"global batch {layout.global_batch} samples per optimizer step: {per} "
        f"micro-batch{'es' if per > 1 else ''} of up to {layout.micro} on each of {world} "
        f"process{'es' if world > 1 else ''}"
    )
