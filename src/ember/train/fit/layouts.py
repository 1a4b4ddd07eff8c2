"""How a fit deals its training batches: the run's layout on this many processes
(`global_batch.run_layout`), the resumed position counted in its batches, and the
random streams of its columns (`ColumnStreams`)."""

from __future__ import annotations

from typing import Any, Iterable

from ember.train.checkpoint.policy import CheckpointPolicy
from ember.train.checkpoint.resume import Resume
from ember.train.length.batches import BatchPlanner
from ember.train.length.global_batch import describe, resumed_position, run_layout
from ember.train.length.streams import ColumnStreams, saved_streams, stream_state
from ember.train.options import LearnerOptions


def training_plan(
    options: LearnerOptions,
    resume: Resume,
    train: Iterable[Any],
    shard: tuple[int, int] | None,
    checkpoints: CheckpointPolicy,
) -> tuple[BatchPlanner, ColumnStreams | None, list[str]]:
    """The training loader's plan under the run's layout, the streams of the columns
    this process runs when it runs several, and warnings to log. Moves `resume` to
    where the checkpoint stands in this run's batches, and tells `checkpoints` what
    to note."""
    rank, world = shard if shard is not None else (0, 1)
    learner = resume.state["learner"] if resume.state is not None else {}
    saved = learner.get("layout")
    notes: list[str] = []
    layout, noted = run_layout(
        train, world, options.grads_accumulation, options.global_batch, saved, notes
    )
    resume.position = resumed_position(resume.position, saved, noted, world)
    train_limit = options.limit_batches[0]
    stand_ins = options.fsdp is not None  # every forward gathers from every process
    plan = BatchPlanner(
        train, options.grads_accumulation, shard, train_limit, stand_ins, layout=layout
    )
    size = getattr(train, "batch_size", None)
    before = saved.get("processes") if isinstance(saved, dict) else None
    moved = resume.state is not None and before is not None and before != world
    if layout is not None and plan.layout is None:  # a sampler ember does not deal
        if layout.micro == size:  # its batches, accumulated to the global batch
            plan.accumulation = layout.shards // world
        elif moved or options.global_batch is not None:
            notes.append(
                f"The training loader's {type(plan.sampler).__name__} is not one ember "
                f"deals, so the run's global batch of {layout.global_batch} samples per step "
                "is not kept. Build the loader with ember.data.DataLoaderBuilder or a plain "
                "torch DataLoader (shuffled or not) to keep it."
            )
    data = learner.get("data")
    sampler = plan.sampler
    if (
        moved
        and resume.position.iteration
        and isinstance(data, dict)
        and data.get("seed") is None
        and getattr(sampler, "seed", None) is not None
        and sampler is not getattr(train, "sampler", None)
    ):  # a shuffled torch loader read as it is by the launch that wrote the checkpoint
        notes.append(
            f"The training loader shuffled with its own {type(train.sampler).__name__} "  # type: ignore[attr-defined]
            f"on the {before} process(es) that wrote the checkpoint, and ember deals it "
            f"now: the rest of epoch {resume.position.epoch} follows another order, so some "
            "samples are trained twice and others not at all. Build the loader with "
            "ember.data.DataLoaderBuilder, or resume from a checkpoint at an epoch's end."
        )
    checkpoints.layout = (
        {
            **noted.state(),
            "processes": world,
            "batch_size": size if type(size) is int else None,
            "accumulation": options.grads_accumulation,
        }
        if noted is not None
        else None
    )
    moved_note = f"Resumed on {world} process(es) from a checkpoint taken on {before}: " + (
        describe(noted, world) if noted is not None else "the loader's own batches"
    )
    streams = None
    device = options.device
    if plan.layout is None or not plan.layout.streams_kept(world):
        checkpoints.streams = None
        if moved and plan.layout is not None:
            moved_note += (
                f". The run's {plan.layout.columns} random streams (one per process of its "
                f"first launch) cannot be kept apart on {world} processes: the samples of "
                "every step are the same, but random draws in the forward (dropout) differ "
                "from a run never stopped (global_batch(n) gives each micro-batch a stream "
                "of its own)"
            )
        return plan, None, notes + ([moved_note + "."] if moved else [])
    columns = plan.stream_columns
    count = plan.layout.streams
    states = saved_streams(learner, count) if resume.state is not None else None
    differ = (
        f". The checkpoint does not keep the run's {count} random streams: the samples of "
        "every step are the same, but random draws in the forward (dropout) differ from a "
        "run never stopped"
    )
    if columns is None:  # one column, this process's own stream
        checkpoints.streams = lambda: [(rank, stream_state(device))]
        if states is not None:  # resumed where the column ran elsewhere: its stream
            resume.stream = states[rank]
        elif moved:
            moved_note += differ
        return plan, None, notes + ([moved_note + "."] if moved else [])
    if states is None:
        if moved:
            moved_note += differ
        states = [stream_state(device)] * count  # a fresh run: as each process starts
    streams = ColumnStreams(columns, states, device)
    checkpoints.streams = streams.state
    return plan, streams, notes + ([moved_note + "."] if moved else [])
