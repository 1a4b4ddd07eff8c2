"""An evaluation or a prediction on several processes, after an FSDP fit: the model
stays sharded over them, and they share the loader's batches.

The batches are dealt whole, in turn: the loader's k-th batch goes to process
k % N. Each batch is the one a single process reads, so every metric gets the rows
of a one-process evaluation (in another order), and the predictions, gathered, are
put back in the loader's order. A torch DataLoader reads only the batches of its
process. Every forward of a sharded model gathers parameters from every process, so
a process with fewer batches runs stand-ins (a batch of its own again, not counted)
until the others are done.

After an FSDP fit the learner keeps its process group open for these verbs (`hold`);
it is left when the script ends, or when another fit starts (`release`).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import itertools
from typing import Any, Callable, ContextManager, Iterable, Iterator

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from ember.data.device import to_device
from ember.data.sampler import ResumableSampler
from ember.errors import TrainingError
from ember.train.distributed import Distributed
from ember.train.length.epoch_plan import StandIn
from ember.train.length.loader_view import is_indexed
from ember.train.prediction import concat_outputs, prediction_step
from ember.train.step import start_split

_HELD: list[Distributed] = []


def hold(dist: Distributed) -> None:
    """Keep `dist`'s process group open after fit, until the script ends or another fit
    starts. Its watchdog stops: a process whose script ends first is no failure, and
    the group's own timeout bounds the collectives of an evaluation."""
    dist.health.stop.set()
    if not _HELD:
        atexit.register(release)
    _HELD.append(dist)


def release() -> None:
    """Leave the groups `hold` kept (every process does, at its exit or next fit)."""
    while _HELD:
        dist = _HELD.pop()
        if not dist.finished:
            dist.close(failed=False)
    atexit.unregister(release)


class _EveryNth:
    """The items k of `inner` (batches, or the index lists of a batch sampler) with
    k % world == rank."""

    def __init__(self, inner: Any, rank: int, world: int) -> None:
        self.inner, self.rank, self.world = inner, rank, world

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.inner), self.rank, None, self.world)

    def __len__(self) -> int:
        return len(range(self.rank, len(self.inner), self.world))


def dealt(loader: Any, rank: int, world: int) -> Any:
    """The loader's batches k with k % world == rank; a torch DataLoader over a
    map-style dataset reads only those (its copy gets a batch sampler of them)."""
    if not is_indexed(loader):
        return _EveryNth(loader, rank, world)
    view = copy.copy(loader)
    view.__dict__["_iterator"] = None
    object.__setattr__(view, "batch_sampler", _EveryNth(whole(loader), rank, world))
    return view


def whole(loader: Any) -> Any:
    """The whole loader's batches (a torch DataLoader's: its lists of indices), in
    order. The sampler of `DataLoaderBuilder`, which a fit leaves dealing one
    process's share, is read whole."""
    if not is_indexed(loader):
        return loader
    if isinstance(loader.sampler, ResumableSampler):
        sampler = SequentialSampler(loader.dataset)
        return BatchSampler(sampler, loader.batch_size, loader.drop_last)
    return loader.batch_sampler


class RankShare:
    """This process's share of an evaluation's (or a prediction's) batches."""

    def __init__(self, loader: Iterable[Any], dist: Distributed, what: str) -> None:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "num_replicas"):
            raise TrainingError(
                f"{what}() on several processes deals the loader's batches to them, and this "
                f"loader's {type(sampler).__name__} gives each process a share already. Give "
                f"{what}() the whole data set: a loader without it."
            )
        shuffled = isinstance(sampler, ResumableSampler) and sampler.seed is not None
        if isinstance(sampler, RandomSampler) or shuffled:
            raise TrainingError(
                f"{what}() on several processes deals the loader's batches to them in its "
                "order, and this loader shuffles: each process would draw an order of its "
                f"own. Give {what}() a loader that does not shuffle."
            )
        try:
            total = len(whole(loader))
        except TypeError:
            raise TrainingError(
                f"{what}() on several processes deals the loader's batches to them and needs "
                "their number: give it a loader with len() (a torch DataLoader over a "
                "dataset with __len__, a list of batches)."
            ) from None
        if total == 0:
            raise TrainingError(
                f"The {what}() data loader yielded no batch: check that its dataset is not empty."
            )
        self.dist, self.total, self.world = dist, total, dist.world
        self.loader = dealt(loader, dist.rank, dist.world)
        """This process's batches, read as a loader."""
        self.longest = -(-total // dist.world)
        """The batches of the process with the most: every process runs as many."""
        self._first = None if len(self.loader) else dealt(loader, 0, dist.world)

    def padded(self, batches: Iterable[Any]) -> Iterator[Any]:
        """`batches` (read from `loader`), then stand-ins (`StandIn`) up to `longest`:
        the last of them again, or, for a process with none, the loader's first."""
        count, last = 0, None
        for last in batches:
            count += 1
            yield last
        if last is None and self._first is not None:
            last = next(iter(self._first))
        for _ in range(self.longest - count):
            yield StandIn(last)

    def totals(self, items: int, batches: int, tokens: int | None) -> tuple[int, int, int | None]:
        """The items, batches and tokens (None if a process counted none) of every process."""
        everyone = self.dist.all_gather((items, batches, tokens))
        told = [t for _, _, t in everyone]
        whole = None if any(t is None for t in told) else sum(t for t in told if t is not None)
        return sum(i for i, _, _ in everyone), sum(b for _, b, _ in everyone), whole

    def predict(
        self,
        model: torch.nn.Module,
        device: torch.device,
        autocast: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
    ) -> Any:
        """The model's outputs over every batch of the loader, as `predict` returns them
        on one process, on every process: each runs its batches (and stand-ins), then
        the outputs are gathered and put in the loader's order."""
        step = prediction_step(model)
        own: list[Any] = []
        training = model.training
        model.eval()
        try:
            start_split(model, "predict")
            with torch.no_grad(), autocast():
                for batch in self.padded(self.loader):
                    stand_in = type(batch) is StandIn
                    batch = batch.batch if stand_in else batch
                    if device.type != "cpu":
                        batch = to_device(batch, device)
                    output = step(batch)
                    if not stand_in:
                        own.append(to_device(output, torch.device("cpu"), non_blocking=False))
        finally:
            model.train(training)
        everyone = self.dist.all_gather(own)
        world = self.world
        return concat_outputs([everyone[k % world][k // world] for k in range(self.total)])
