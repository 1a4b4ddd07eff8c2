"""An epoch's optimizer steps: which batches each one takes, and their weights.

Each `Step` carries what the loop needs to run it: the batches, their iteration
numbers, each batch's share of the step's samples (the gradient of the mean loss over
every process's samples, even when the last batches are uneven), the samples counted
for progress, and whether every process still has batches (so a stop can be agreed
at this step). Under several processes (or a run's layout on one) a `ShardPlan` knows
every process's batches; under a layout whose columns share a process, each batch
names its column, whose random stream its forward draws from.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from ember.data.layout import Layout
from ember.errors import TrainingError
from ember.train.length.position import Position


class Step(NamedTuple):
    """One optimizer step's batches (all of them, even under accumulation). A named
    tuple: one is made per optimizer step, so it must be cheap."""

    batches: list[Any]
    """The batches; a process with fewer than the others may end with `StandIn`s."""
    first: int
    """The iteration number of the first batch (1-based, counted over the epoch)."""
    sizes: list[int]
    """Samples of each batch on this process."""
    shares: list[float]
    """Each batch's factor on its loss: its fraction of the step's samples (all processes)."""
    items: list[int]
    """Samples each batch adds to the epoch's count (all processes)."""
    may_vote: bool
    """Every process has this step's batches: a stop can be agreed on after it."""
    origins: list[int] | None = None
    """Micro-batches (`grads_accumulation("auto")`): the index of each one's batch."""
    columns: list[int] | None = None
    """Under a layout whose columns share this process: each batch's column (the
    random stream its forward draws from, `ColumnStreams`); None: the process's own."""


class StandIn(NamedTuple):
    """A batch a process runs only to take part in the others' collectives, when it has
    fewer batches than they have (under FSDP every forward gathers parameters from
    every process): a batch of its own again, whose loss weighs nothing and whose
    outputs are not counted."""

    batch: Any


class ShardPlan:
    """How many samples every process has in each batch of an epoch, known to every
    process without communication (the dealing is deterministic, `Layout`). It lets
    each process weight its loss so the synchronised gradient is the gradient of the
    global mean loss, even when the last batches are uneven."""

    def __init__(self, layout: Layout, world: int, samples: int, whole_steps: bool) -> None:
        self.layout = layout
        self.world = world
        step = layout.global_batch
        self.full = (samples // step) * (layout.shards // world)
        """Batches of every process in the epoch's full steps."""
        tail = 0 if whole_steps else samples % step
        self.tails = [layout.tail_sizes(rank, world, tail) for rank in range(world)]
        """Each process's batches in a last step that is not full."""
        self.min_batches = min(self.counts())

    def counts(self) -> list[int]:
        """Batches of each process."""
        return [self.full + len(tail) for tail in self.tails]

    def size(self, rank: int, step: int) -> int:
        """Samples of `rank` in its `step`-th batch (0-based) of this epoch's run."""
        if step < self.full:
            return self.layout.micro
        tail, index = self.tails[rank], step - self.full
        return tail[index] if index < len(tail) else 0

    def global_items(self, first: int, count: int = 1) -> int:
        """Samples of all processes in batches `first` .. `first + count - 1`."""
        if first + count <= self.full:
            return count * self.layout.micro * self.world
        return sum(
            self.size(rank, step)
            for rank in range(self.world)
            for step in range(first, first + count)
        )


class EpochPlan:
    """The steps of one epoch of one loader, from where a resumed run stands."""

    def __init__(
        self,
        opened: Callable[[], Iterator[Any]],
        accumulation: int,
        start: Position,
        total: int | None,
        count: Callable[[Any], int],
        shards: ShardPlan | None,
        world: int,
        limit: int | None = None,
        longest: int | None = None,
        columns: list[int] | None = None,
    ) -> None:
        self._opened = opened
        """The epoch's batches from where a resumed run stands."""
        self.count = count
        """The items of each batch, in the order they come (the loader's count)."""
        self.accumulation = accumulation
        self.start = start
        self.total = total
        """Batches in the epoch, those done before a resume included (None: unknown)."""
        self._shards = shards
        self._world = world
        self._limit = limit
        self._longest = longest
        """Batches (from the start) of the process with the most: this one's are padded
        with stand-ins up to them (FSDP); None: no padding."""
        self._columns = columns
        """The column of each batch of a step, in order (None: one stream)."""

    def batches(self) -> Iterator[Any]:
        """The epoch's batches from where a resumed run stands, up to the batch limit
        (then stand-ins, up to the batches of the process with the most)."""
        batches = self._opened()
        if self._limit is not None:
            batches = itertools.islice(batches, max(0, self._limit - self.start.iteration))
        if self._longest is not None:
            return self._padded(batches, self._longest)
        return batches

    def _padded(self, batches: Iterator[Any], longest: int) -> Iterator[Any]:
        count, batch = 0, None
        for batch in batches:
            count += 1
            yield batch
        if count == 0 < longest:
            raise TrainingError(
                f"In epoch {self.start.epoch} this process has no batch of its own left "
                f"(after iteration {self.start.iteration}), while another has "
                f"{longest}: it has none to run as a stand-in for them. Resume on fewer "
                "processes, or from a checkpoint at an epoch's end."
            )
        for _ in range(longest - count):
            yield StandIn(batch)

    def __iter__(self) -> Iterator[Step]:
        return self.steps(self.batches())

    @property
    def uneven(self) -> bool:
        """Processes have different numbers of batches left in this epoch (without
        stand-ins): DDP must then keep answering the others' reductions (`join`)."""
        shards = self._shards
        if shards is None or self._longest is not None:
            return False
        left = None if self._limit is None else self._limit - self.start.iteration
        counts = {count if left is None else min(left, count) for count in shards.counts()}
        return len(counts) > 1

    @property
    def single(self) -> bool:
        """Each step is one batch of this process alone (`steps` yields a step per
        item of `batches()`, in order)."""
        return self.accumulation == 1 and self._shards is None

    def steps(self, batches: Iterator[Any]) -> Iterator[Step]:
        """The steps of `batches` (from `batches()`)."""
        done = 0  # batches of this run so far
        shards, world = self._shards, self._world
        if self.accumulation == 1 and shards is None:  # a step per batch, weighing all of it
            first, shares, count = self.start.iteration + 1, [float(world)], self.count
            for done, batch in enumerate(batches):
                sizes = [count(batch)]  # the samples of the batch, and of the step's count
                step = ([batch], first + done, sizes, shares, sizes, True, None, None)
                yield tuple.__new__(Step, step)
            return
        # with stand-ins, a stop is agreed on only while every process has a batch of its
        # own after it, which a run resumed there repeats as its stand-in
        votes = 0 if shards is None else shards.min_batches
        if shards is not None and self._longest is not None and votes < self._longest:
            votes -= 1
        while True:
            group = list(itertools.islice(batches, self.accumulation))
            if not group:
                return
            sizes = [0 if type(batch) is StandIn else self.count(batch) for batch in group]
            if shards is None:
                total = sum(sizes) or len(group)
                items = sizes
                may_vote = True
            else:
                total = shards.global_items(done, len(group))
                items = [shards.global_items(done + index) for index in range(len(group))]
                may_vote = done + self.accumulation <= votes
            shares = [
                0.0 if type(batch) is StandIn else (size or 1) * world / total
                for batch, size in zip(group, sizes)
            ]
            columns = None if self._columns is None else self._columns[: len(group)]
            first = self.start.iteration + done + 1
            yield Step(group, first, sizes, shares, items, may_vote, None, columns)
            done += len(group)


def steps_to_reach(samples: int, per_step: Sequence[int]) -> tuple[int, int] | None:
    """`(steps, epochs)`: the optimizer steps (and the epochs they span) from an epoch's
    start until `samples` samples are done, each epoch's steps taking `per_step`; None
    when an epoch has no samples."""
    per_epoch = sum(per_step)
    if per_epoch <= 0:
        return None
    if samples <= 0:
        return 0, 0
    whole = (samples - 1) // per_epoch  # epochs done before the one where it ends
    left, steps = samples - whole * per_epoch, 0
    for count in per_step:
        steps += 1
        left -= count
        if left <= 0:
            break
    return whole * len(per_step) + steps, whole + 1
