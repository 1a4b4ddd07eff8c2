"""The batch plan of each epoch of one data loader (`BatchPlanner`).

It finds the epoch-aware sampler once, then for each epoch seeds it, makes it skip
what a resumed run has already done, gives each process its share (dealt by the run's
`Layout` where ember's sampler reads the loader) and groups the batches by gradient
accumulation into the steps of an `EpochPlan`.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor

from ember.data.layout import Layout
from ember.data.sampler import DealtBatches, ResumableSampler
from ember.errors import ConfigError, TrainingError
from ember.train.length.epoch_plan import EpochPlan, ShardPlan
from ember.train.length.loader_view import (
    Count,
    TorchLoaderView,
    arithmetic_sizes,
    is_indexed,
    is_stateful,
)
from ember.train.length.position import Position
from ember.train.length.shares import dealable, process_share

log = logging.getLogger(__name__)


def find_sampler(loader: Any) -> Any:
    """The epoch-aware sampler of a loader (ours, or one with `set_epoch`), if any."""
    for owner in (loader, getattr(loader, "batch_sampler", None)):
        sampler = getattr(owner, "sampler", None)
        if callable(getattr(sampler, "set_epoch", None)):
            return sampler
    return None


class BatchPlanner:
    """Plans the epochs of one data loader (`shard`: this process's rank and the
    number of processes, when there are several)."""

    def __init__(
        self,
        loader: Iterable[Any],
        accumulation: int = 1,
        shard: tuple[int, int] | None = None,
        limit: int | float | None = None,
        stand_ins: bool = False,
        name: str = "training",
        exact: bool = True,
        layout: Layout | None = None,
    ) -> None:
        self.loader = loader
        self.name = name
        self.sampler = find_sampler(loader)
        batch_sampler = None
        rank, world = shard if shard is not None else (0, 1)
        size = getattr(loader, "batch_size", None)
        if layout is None and shard is not None and type(size) is int and size > 0:
            layout = Layout(size, world, accumulation)  # as the processes start the run
        if is_indexed(loader) and (shard is not None or (layout and dealable(loader))):
            self.sampler, batch_sampler = process_share(loader, name, rank, world, layout)
        self.layout = layout if isinstance(batch_sampler, DealtBatches) else None
        """How each step's samples are dealt, where ember's sampler deals them."""
        if self.layout is not None:
            accumulation = self.layout.shards // world
        if callable(getattr(self.sampler, "skip", None)):
            self.sampler.skip(0)  # a skip an earlier fit set and never read is not this one's
        self.view = (
            TorchLoaderView(loader, exact, batch_sampler)  # type: ignore[arg-type]
            if is_indexed(loader) and not is_stateful(loader)
            else None
        )
        """The loader read through a copy that counts and skips by indices (torch's)."""
        self.count = Count(self.view.sizes if self.view is not None else None, name)
        """The items of each batch, in the order they come."""
        self._stateful: Any = None
        """A stateful loader's state to resume the next epoch from (`resume`)."""
        self._after: Tensor | None = None
        """torch's random state a resumed epoch goes on from once positioned."""
        self.accumulation = accumulation
        self.shard = shard
        self.stand_ins = stand_ins
        """Several processes: one with fewer batches runs stand-ins (`StandIn`) up to
        the others' count (FSDP, whose every forward needs every process)."""
        self.limit = limit
        """At most this many batches per epoch (an int), or this fraction of the
        loader's batches (a float in (0, 1]); None: every batch."""

    def check_limit(self, name: str, option: str) -> None:
        """A fraction needs the loader's length: refused at once when it has none."""
        if isinstance(self.limit, float) and self._length() is None:
            raise ConfigError(
                f"limit_batches({option}={self.limit!r}): a fraction of the {name} loader's "
                "batches needs its length, and this loader has no len(). Give a number of "
                f"batches instead, e.g. limit_batches({option}=10)."
            )

    def limited(self, batches: int | None) -> int | None:
        """The batches an epoch takes out of `batches` (None: unknown) under the limit."""
        limit = self.limit
        if limit is None:
            return batches
        if isinstance(limit, float):
            if batches is None:
                return None
            return max(1, int(limit * batches)) if batches else 0
        return limit if batches is None else min(limit, batches)

    def _length(self) -> int | None:
        """Batches of an epoch of this process (its share, under several)."""
        try:
            if self.view is not None:
                return len(self.view.view)
            return len(self.loader)  # type: ignore[arg-type]
        except TypeError:
            return None

    def share_order(self, dist: Any, saved: Any) -> None:
        """A shuffled loader given a sampler of ember's (`process_share`) shuffles with
        rank 0's seed on every process (`saved`: the seed a resumed run's checkpoint
        noted, which it keeps; `dist` None: one process)."""
        sampler = self.sampler
        if not isinstance(sampler, ResumableSampler) or sampler.seed is None:
            return
        if isinstance(self.loader.sampler, ResumableSampler):  # type: ignore[attr-defined]
            return  # DataLoaderBuilder's: the user's seed
        seed = saved if type(saved) is int else sampler.seed
        sampler.seed = dist.broadcast(seed) if dist is not None else seed

    @property
    def stream_columns(self) -> list[int] | None:
        """The random stream of each of this process's micro-batches in a step, when it
        runs several of the layout's streams and they can be kept apart (None: the
        process's own stream serves them)."""
        layout = self.layout
        rank, world = self.shard if self.shard is not None else (0, 1)
        if layout is None or not layout.streams_kept(world) or layout.streams == world:
            return None
        return [layout.stream(shard) for shard in layout.own(rank, world)]

    def _dealt_plan(self, world: int, done: int) -> ShardPlan:
        """The batches of `world` processes dealt by the layout, `done` samples into the
        epoch (in whole steps under drop_last)."""
        sampler, layout = self.sampler, self.layout
        assert layout is not None
        total = len(sampler.data_source)
        total -= total % layout.global_batch if sampler.whole_steps else 0
        return ShardPlan(layout, world, max(0, total - done), sampler.whole_steps)

    def _shard_plan(self, start: Position | None = None) -> ShardPlan | None:
        """Every process's batches of an epoch, from `start` (None: the whole epoch)."""
        sampler, loader = self.sampler, self.loader
        if self.shard is None or sampler is None:
            return None
        world = self.shard[1]
        if self.layout is not None:
            return self._dealt_plan(world, start.items if start is not None else 0)
        size = int(loader.batch_size)  # type: ignore[attr-defined]
        sampler.shard(*self.shard)  # a sampler made for each process: as many each
        length = sampler.shard_lengths()[self.shard[0]]
        if loader.drop_last:  # type: ignore[attr-defined]
            length -= length % size
        if start is not None:
            length = max(0, length - start.iteration * size)
        return ShardPlan(Layout(size, world, self.accumulation), world, world * length, False)

    @property
    def uneven(self) -> bool:
        """Several processes may have different numbers of batches in an epoch."""
        counts = self._batch_counts()
        return counts is not None and len(set(counts)) > 1

    def data_state(self) -> dict[str, int | None]:
        """What a checkpoint notes of the data: the dataset's samples and the sampler's
        shuffle seed (None where the loader does not tell them)."""
        seed = getattr(self.sampler, "seed", None)
        return {
            "samples": _sized(getattr(self.loader, "dataset", None)),
            "seed": seed if type(seed) is int else None,
        }

    def loader_state(self, complete: bool) -> dict[str, Any] | None:
        """What a checkpoint notes of the loader's position and random states (at an
        epoch's end when `complete`); None when it needs nothing."""
        if self.view is not None:
            return {"view": self.view.state(complete)}
        if not complete and is_stateful(self.loader):
            return {"stateful": self.loader.state_dict()}  # type: ignore[attr-defined]
        return None

    def resume(self, saved: Any, torch_state: Tensor | None, start: Position) -> None:
        """The first epoch planned resumes from a checkpoint: `saved` is what it noted of
        the loader (`loader_state`), `torch_state` its torch random state."""
        saved = saved if isinstance(saved, dict) else {}
        if self.view is not None:
            self.view.resume(saved.get("view"), start.epoch)
        elif start.iteration and "stateful" in saved:
            self._stateful = saved["stateful"]
        self._after = torch_state if start.iteration else None

    def data_changes(self, saved: Any, where: str) -> str | None:
        """A warning when this loader's data is not the data a mid-epoch checkpoint
        (`where`) was taken on, as its `data_state` noted it: the rest of the epoch is
        then not the epoch the run was in. None when nothing differs or nothing is known."""
        if not isinstance(saved, dict):
            return None
        now = self.data_state()
        changed = [
            f"{what} {saved[key]!r} then, {now[key]!r} now"
            for key, what in (("samples", "training samples"), ("seed", "shuffle seed"))
            if saved.get(key) is not None and now[key] is not None and saved[key] != now[key]
        ]
        if not changed:
            return None
        return (
            f"The training data differs from the data the checkpoint of {where} was taken on "
            f"({'; '.join(changed)}): the rest of this epoch does not continue its order, so "
            "some samples may be seen twice and others not at all, and the resume is not "
            "exact. Resume with the same data, or from a checkpoint at an epoch's end."
        )

    def check_shardable(self, name: str) -> None:
        """Several processes need a sampler that gives each one its share."""
        if self.sampler is None or not callable(getattr(self.sampler, "shard", None)):
            raise TrainingError(
                f"Training on several processes needs the {name} data loader to give each "
                f"process its share of every epoch, and a {type(self.loader).__name__} "
                "cannot be split. Use a torch DataLoader over a dataset with __len__ (with "
                "a DistributedSampler, or a plain or shuffled one, which ember shards), or "
                "ember.data.DataLoaderBuilder."
            )

    def check_whole_steps(self, name: str) -> None:
        """Under drop_last, an epoch of the dealt loader has at least one full step."""
        layout, sampler = self.layout, self.sampler
        if layout is None or not sampler.whole_steps:
            return
        samples = len(sampler.data_source)
        if samples < layout.global_batch:
            raise TrainingError(
                f"The {name} data loader drops an epoch's last incomplete step (drop_last), "
                f"and its {samples} samples make no full step of {layout.global_batch} (the "
                "global batch): no batch is left to train. Use a smaller batch size, fewer "
                "processes, or drop_last=False."
            )

    def check_even(self, name: str, why: str, fix: str) -> None:
        """Every process runs the same number of batches (`why` says what needs it)."""
        counts = self._batch_counts()
        if counts is not None and len(set(counts)) > 1:
            loader: Any = self.loader
            raise TrainingError(
                f"The {name} data loader gives the {len(counts)} processes {min(counts)} or "
                f"{max(counts)} batches per epoch ({len(loader.dataset)} samples, batch size "
                f"{loader.batch_size}); {why} needs the same number on every process. {fix}"
            )

    def check_stand_ins(self, name: str) -> None:
        """With stand-ins, every process needs a batch of its own to repeat."""
        counts = self._batch_counts()
        if counts is not None and min(counts) == 0 < max(counts):
            loader: Any = self.loader
            raise TrainingError(
                f"The {name} data loader gives {counts.count(0)} of the {len(counts)} processes "
                f"no batch ({len(loader.dataset)} samples, batch size {loader.batch_size}"
                f"{', drop_last' if loader.drop_last else ''}); under FSDP a process with "
                "fewer batches runs stand-ins for the others' (a batch of its own again, "
                "weighing nothing), so each needs one. Use fewer processes, a smaller batch "
                "size, or more data."
            )

    def _batch_counts(self) -> list[int] | None:
        """Batches of an epoch on each process, when there are several."""
        plan = self._shard_plan()
        if plan is None:
            return None
        counts = plan.counts()
        if self.limit is None:
            return counts
        limit = self.limited(max(counts))  # the batch limit, the same for every process
        return [count if limit is None else min(count, limit) for count in counts]

    def batches_per_epoch(self) -> int | None:
        """Batches of an epoch on the process that has the most (None when the loader
        has no length)."""
        counts = self._batch_counts()
        if counts is not None:
            return max(counts)
        return self.limited(self._length())

    def steps_per_epoch(self) -> int | None:
        """Optimizer steps of an epoch: its batches in groups of `accumulation`."""
        batches = self.batches_per_epoch()
        return None if batches is None else -(-batches // self.accumulation)

    def step_samples(self) -> list[int] | None:
        """Samples (every process's) of each optimizer step of a whole epoch, under the
        batch limit; None when the loader does not tell them (no batch size, dataset
        or sampler length)."""
        loader: Any = self.loader
        size, drop_last = getattr(loader, "batch_size", None), getattr(loader, "drop_last", False)
        plan = self._shard_plan()
        if plan is None and self.layout is not None:  # one process dealt by a layout
            plan = self._dealt_plan(1, 0)
        if plan is None:
            if not isinstance(size, int) or size < 1:
                return None
            length = _sized(getattr(loader, "sampler", None))
            if length is None:
                length = _sized(getattr(loader, "dataset", None))
            if length is None:
                return None
            length -= length % size if drop_last else 0
            plan = ShardPlan(Layout(size, 1, self.accumulation), 1, length, False)
        batches = self.limited(max(plan.counts())) or 0
        return [
            plan.global_items(first, min(self.accumulation, batches - first))
            for first in range(0, batches, self.accumulation)
        ]

    def single_pass(self) -> Iterator[Any]:
        """The loader's batches once, as it is (no epoch set: an evaluation), counted by
        `count`."""
        if self.view is not None:
            return self.view.batches(0, 0, None)
        sizes = arithmetic_sizes(self.loader, 0)
        if sizes is not None:
            self.count.sizes = sizes.__next__
        return iter(self.loader)

    def epoch(self, epoch: int, start: Position | None = None) -> EpochPlan:
        """Set the sampler up for `epoch` (from `start` when resuming mid-epoch)."""
        start = start if start is not None and start.epoch == epoch else Position(epoch)
        sampler, skipped = self.sampler, False
        if sampler is not None:
            sampler.set_epoch(epoch)
        # the batch limit of this epoch, counted on the whole epoch (before any skip)
        limit = self.limit if isinstance(self.limit, int) else None
        if isinstance(self.limit, float):
            limit = self.batches_per_epoch()
        if sampler is not None:
            if start.items and callable(getattr(sampler, "skip", None)):
                sampler.skip(start.items)
                skipped = True
            if self.shard is not None:
                sampler.shard(*self.shard)
        total = self._length()
        if total is not None and skipped:
            total += start.iteration
        opened, count = self._opening(epoch, start)
        if limit is not None:  # a loader without length counts as long as the limit
            total = limit if total is None else min(total, limit)
        shards = self._shard_plan(start)
        if shards is not None and limit is not None:
            shards.min_batches = min(shards.min_batches, limit - start.iteration)
        longest = None
        if shards is not None and self.stand_ins:
            longest = max(shards.counts())
            if limit is not None:
                longest = min(longest, limit - start.iteration)
        world = self.shard[1] if self.shard is not None else 1
        return EpochPlan(
            opened,
            self.accumulation,
            start,
            total,
            count,
            shards,
            world,
            limit,
            longest,
            self.stream_columns,
        )

    def _opening(
        self, epoch: int, start: Position
    ) -> tuple[Callable[[], Iterator[Any]], Callable[[Any], int]]:
        """How `epoch`'s batches are opened from `start`, and counted."""
        loader, skip, view, count = self.loader, start.iteration, self.view, self.count
        after, self._after = self._after, None
        if view is not None:  # skips the indices of the batches already trained
            return (lambda: view.batches(epoch, skip, after)), count
        stateful, self._stateful = self._stateful, None
        if stateful is not None:  # the loader's own position
            loader.load_state_dict(stateful)  # type: ignore[attr-defined]
            skip = 0
        else:
            after = None
        sizes = arithmetic_sizes(loader, start.iteration)
        if sizes is not None:
            count.sizes = sizes.__next__
        if skip:
            log.warning(
                "Resuming inside epoch %d: the %s loader (a %s) cannot skip to where the "
                "epoch stopped, so its %d batch(es) already trained are read again and "
                "dropped. The rest of the epoch is the one the run was in only if the loader "
                "yields the same batches in the same order and draws no random numbers "
                "(shuffling, augmentation); otherwise some samples are trained twice and "
                "others not at all. For an exact resume use a torch DataLoader over a "
                "map-style dataset, a loader with state_dict()/load_state_dict() "
                "(torchdata's StatefulDataLoader), or resume from a checkpoint at an "
                "epoch's end.",
                epoch,
                self.name,
                type(loader).__name__,
                skip,
            )

        def opened() -> Iterator[Any]:
            batches = iter(loader)
            if after is not None:  # what starting its iterator drew is drawn again
                torch.set_rng_state(after.cpu().to(torch.uint8))
            for _ in itertools.islice(batches, skip):
                pass
            return batches

        return opened, count


def _sized(value: Any) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None
