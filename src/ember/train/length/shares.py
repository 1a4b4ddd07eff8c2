"""Each process's share of a torch DataLoader's epochs, when several train.

A loader from `DataLoaderBuilder` shares itself (its sampler deals the epoch's order
in turn). A `DistributedSampler` made for the process is kept as users of other
trainers expect (`DistributedShares`). A plain or shuffled loader, or a subclass, gets
one of ember's samplers, which gives every process its exact share; any other sampler
is refused, naming the fix (`process_share`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ember.data.layout import Layout
from ember.data.sampler import DealtBatches, ResumableSampler
from ember.errors import TrainingError


class DistributedShares:
    """A torch `DistributedSampler` seen as ember's samplers are: every process reads
    as many samples (it pads, or drops, to make them equal)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.seed = getattr(sampler, "seed", None) if getattr(sampler, "shuffle", False) else None

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def shard(self, rank: int, world: int) -> None:
        """Nothing to do: the sampler was made for this process."""

    def shard_lengths(self) -> list[int]:
        return [len(self.sampler)] * int(self.sampler.num_replicas)


def dealable(loader: Any) -> bool:
    """A torch DataLoader whose samples ember can deal by a `Layout` (its sampler is
    ours, or torch's plain or shuffled one under a plain batch sampler)."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    sampler = loader.sampler
    if isinstance(sampler, ResumableSampler):
        return True
    return (
        type(sampler) in (SequentialSampler, RandomSampler)
        and type(loader.batch_sampler) is BatchSampler
        and not (type(sampler) is RandomSampler and sampler.replacement)
    )


def process_share(
    loader: Any, name: str, rank: int, world: int, layout: Layout | None = None
) -> tuple[Any, Any]:
    """The sampler that gives this process its share of a torch DataLoader's epochs,
    and the batch sampler to read it with (None: the loader's own). A
    `DistributedSampler` made for this process is used as it is; a plain or shuffled
    loader gets one of ember's, which gives every process its exact share (the
    epoch's order dealt out in turn, no sample padded or dropped), shuffling with a
    seed rank 0 chooses (`BatchPlanner.share_order`); another sampler is refused.
    Under a `layout` ember's sampler deals each step's samples by it (`DealtBatches`)."""
    sampler = loader.sampler
    if callable(getattr(sampler, "shard", None)):  # DataLoaderBuilder's
        if layout is None:
            return sampler, None
        shared = copy.copy(sampler)  # the loader's own stays as it is, for other uses
        shared.deal(layout, rank, world, bool(loader.drop_last))
        return shared, DealtBatches(shared)
    if hasattr(sampler, "num_replicas") and hasattr(sampler, "rank"):
        if (int(sampler.num_replicas), int(sampler.rank)) != (world, rank):
            raise TrainingError(
                f"The {name} data loader's {type(sampler).__name__} was made for process "
                f"{sampler.rank} of {sampler.num_replicas}, and this is process {rank} of "
                f"{world}. Make it with num_replicas={world} and rank={rank} (the defaults, "
                "once the process group exists), or leave the sampler out: ember gives "
                "each process its share."
            )
        return DistributedShares(sampler), None
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    plain = type(sampler) in (SequentialSampler, RandomSampler)
    if not plain or type(loader.batch_sampler) is not BatchSampler:
        raise TrainingError(
            f"The {name} data loader orders its samples with a {type(sampler).__name__} "
            f"(batched by a {type(loader.batch_sampler).__name__}), which ember cannot "
            "split between the processes. Give the loader a "
            "torch.utils.data.DistributedSampler made for each process, or build it "
            "with ember.data.DataLoaderBuilder."
        )
    seed = None
    if type(sampler) is RandomSampler:
        if sampler.replacement or sampler._num_samples is not None:
            raise TrainingError(
                f"The {name} data loader draws samples with replacement or a number of "
                "samples of its own, which ember cannot split between the processes. "
                "Give it a torch.utils.data.DistributedSampler made for each process."
            )
        generator = sampler.generator  # read, not drawn from: planning changes no stream
        before = torch.get_rng_state() if generator is None else generator.get_state()
        draw = torch.empty((), dtype=torch.int64)
        seed = int(draw.random_(generator=generator).item()) & 0x7FFFFFFF
        if generator is None:
            torch.set_rng_state(before)
        else:
            generator.set_state(before)
    shared = ResumableSampler(loader.dataset, seed)
    if layout is not None:
        shared.deal(layout, rank, world, bool(loader.drop_last))
        return shared, DealtBatches(shared)
    shared.shard(rank, world)
    return shared, BatchSampler(shared, int(loader.batch_size), bool(loader.drop_last))
