"""How a fit reads a user's data loader: the items of each batch, and where a resumed
epoch starts.

A batch is whatever the loader yields (tensors, lists of images of different sizes, a
graph library's batch object, a collator's dict), so its items are counted from what
the loader knows, never guessed from the batch:

- a torch `DataLoader` over a map-style dataset (ours, a plain one, a subclass) is read
  through a copy whose batch sampler notes the length of each list of indices it hands
  out: that is the batch's item count, whatever the collate function makes of it. A
  resume inside an epoch skips the indices of the batches already trained (the epoch's
  order is drawn again from the random state the epoch started with, then the state of
  the checkpoint is put back), so no batch is read twice and no random draw is used up.
  With worker processes, each batch brings back its worker's random state, and a
  resumed epoch's workers start from the states of the workers that would have made
  their batches;
- a loader with `state_dict`/`load_state_dict` (torchdata's `StatefulDataLoader`)
  resumes from its own state, noted in every checkpoint;
- anything else (a list of batches, an iterable dataset, a generator) counts a batch by
  its `num_items`, else the first dimension of its first tensor (a list of tensors
  counts its length); a resume inside an epoch reads the batches already trained
  again and drops them, which is exact only when the loader repeats its order and
  draws nothing at random: the resume says so.
"""

from __future__ import annotations

import copy
import itertools
import logging
import random
from collections import deque
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from ember.data.device import first_dim
from ember.errors import TrainingError

log = logging.getLogger("ember.train.learner")  # the run's own log: it reaches experiment.log


# --- the items of a batch ------------------------------------------------------------------


def own_count(batch: Any) -> int:
    """The items a batch says it holds: its `num_items` (an int), else the first
    dimension of its first tensor; a list of tensors (images of different sizes) counts
    its length. 0 when it cannot be told."""
    head = batch[0] if type(batch) in (tuple, list) and batch else None
    if type(head) is Tensor and head.dim() > 0:  # the common case, read once per step
        return int(head.shape[0])
    told = getattr(batch, "num_items", None)
    if isinstance(told, int) and not isinstance(told, bool):
        return told
    if isinstance(batch, dict) and batch:
        head = next(iter(batch.values()))
    if isinstance(head, (list, tuple)) and head and isinstance(head[0], Tensor):
        return len(head)
    return first_dim(batch) or 0


class Count:
    """The items of each batch of one loader, in the order the batches come: from the
    loader's own count where it has one, else from the batch (`own_count`). Told once,
    at the first batch, when the two disagree or neither can count; `needs` names what
    of the run cannot go on without a count (it is refused then)."""

    def __init__(self, loader_sizes: Callable[[], int] | None, what: str) -> None:
        self.sizes = loader_sizes
        """The next batch's items as the loader counts them (None: it does not)."""
        self._what = what
        self.needs: str | None = None
        """What of the run needs the items counted (None: nothing)."""
        self._checked = False

    def __call__(self, batch: Any) -> int:
        sizes = self.sizes
        if self._checked:
            return sizes() if sizes is not None else own_count(batch)
        self._checked = True
        told = own_count(batch)
        if sizes is None:
            if told == 0:
                self._uncounted(batch)
            return told
        size = sizes()
        if told != size:
            log.info(
                "The %s loader handed %d item(s) to make its first batch, which a %s "
                "counts as %s: ember counts the loader's %d (progress, samples, the "
                "weights of accumulated batches, the resume position).",
                self._what,
                size,
                type(batch).__name__,
                told or "nothing",
                size,
            )
        return size

    def _uncounted(self, batch: Any) -> None:
        message = (
            f"ember cannot count the items of the {self._what} loader's batches: a "
            f"{type(batch).__name__} has no `num_items` and no tensor whose first dimension "
            "is its batch size, and the loader is not a torch DataLoader over a map-style "
            "dataset (whose sampler would count them)."
        )
        fix = (
            "Give the batch an int attribute `num_items`, or load it with a torch "
            "DataLoader (or ember.data.DataLoaderBuilder) over a dataset with __len__."
        )
        if self.needs is not None:
            raise TrainingError(f"{message} {self.needs} needs that count. {fix}")
        log.warning("%s Progress shows 0 items. %s", message, fix)


# --- a torch DataLoader read through a copy ----------------------------------------------------


class _Opening(NamedTuple):
    """What the next epoch's first index does before it is handed out (once)."""

    skip: int
    """Lists of indices to draw and drop: the batches a resumed epoch already trained."""
    states: dict[str, Any] | None
    """Random states to put back first (the epoch's start, or before an extra seed draw)."""
    after: Tensor | None
    """torch's random state to put back once skipped: the checkpoint's."""


class _NotedBatches:
    """The loader's batch sampler, noting the length of each list of indices it hands
    out (the batch's items) and the random states the epoch's order draws from, and
    opening a resumed epoch (`_Opening`)."""

    def __init__(self, inner: Any, view: TorchLoaderView) -> None:
        self.inner = inner
        self.view = view
        self.sizes: deque[int] = deque()

    def __iter__(self) -> Iterator[Any]:
        sizes, view = self.sizes, self.view
        sizes.clear()
        opening, view.opening = view.opening, None
        if opening is not None and opening.states is not None:
            view.put_states(opening.states)
        view.epoch_states = view.states()
        indices = iter(self.inner)
        if opening is not None:
            for _ in itertools.islice(indices, opening.skip):
                pass
            if opening.after is not None:
                torch.set_rng_state(opening.after.cpu().to(torch.uint8))
        append = sizes.append
        for batch in indices:
            append(len(batch))
            yield batch

    def __len__(self) -> int:
        return len(self.inner)


class WorkerBatch(NamedTuple):
    """A batch as a worker process sends it: with the worker and its random states after
    making it (bytes, ints and floats: nothing for shared memory to carry)."""

    batch: Any
    worker: int
    states: tuple[Any, ...]


def _worker_states() -> tuple[Any, ...]:
    """torch's, Python's and NumPy's random states in this process."""
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    version, internal, gauss = random.getstate()
    return (
        torch.get_rng_state().numpy().tobytes(),
        (version, np.asarray(internal, dtype=np.uint32).tobytes(), gauss),
        (np.asarray(keys, dtype=np.uint32).tobytes(), int(pos), int(has_gauss), float(cached)),
    )


def _put_worker_states(states: Sequence[Any]) -> None:
    torch_state, python, numpy = states
    torch.set_rng_state(torch.frombuffer(bytearray(torch_state), dtype=torch.uint8))
    internal = np.frombuffer(python[1], dtype=np.uint32).tolist()
    random.setstate((int(python[0]), tuple(internal), python[2]))
    keys = np.frombuffer(numpy[0], dtype=np.uint32).copy()
    np.random.set_state(("MT19937", keys, int(numpy[1]), int(numpy[2]), float(numpy[3])))


class _CollateWithStates:
    """The loader's collate function, in a worker: the batch comes back with the
    worker's random states after it (`WorkerBatch`)."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, items: Any) -> WorkerBatch:
        batch = self.collate(items)
        info = torch.utils.data.get_worker_info()
        return WorkerBatch(batch, info.id if info is not None else 0, _worker_states())


class _WorkerStart:
    """The loader's `worker_init_fn`, then, in a resumed epoch, the random states of the
    worker that would have made this worker's batches (`states[(offset + id) % n]`);
    one that had made none yet is seeded as torch seeds that worker."""

    def __init__(
        self, init: Callable[[int], Any] | None, states: list[Any], offset: int, base: Any
    ) -> None:
        self.init, self.states, self.offset = init, states, offset
        self.base = base if isinstance(base, int) else None
        """The seed the workers of the run never stopped were given (None: unknown)."""

    def __call__(self, worker: int) -> None:
        logical = (self.offset + worker) % len(self.states)
        saved = self.states[logical]
        if saved is None:  # seeded as torch seeded worker `logical` in the run never stopped
            base = torch.initial_seed() - worker if self.base is None else self.base
            if (base, logical) != (torch.initial_seed() - worker, worker):
                from torch.utils.data._utils.worker import _generate_state

                random.seed(base + logical)
                torch.manual_seed(base + logical)
                np.random.seed(_generate_state(base, logical))
        if self.init is not None:
            self.init(worker)
        if saved is not None:
            _put_worker_states(saved)


def _generators(loader: DataLoader[Any]) -> dict[str, torch.Generator]:
    """The random generators a loader's order and seeds draw from, besides torch's own."""
    found: dict[str, torch.Generator] = {}
    candidates = {
        "loader": getattr(loader, "generator", None),
        "sampler": getattr(loader.sampler, "generator", None),
        "batch_sampler": getattr(getattr(loader.batch_sampler, "sampler", None), "generator", None),
    }
    seen: set[int] = set()
    for name, generator in candidates.items():
        if isinstance(generator, torch.Generator) and id(generator) not in seen:
            seen.add(id(generator))
            found[name] = generator
    return found


class TorchLoaderView:
    """A torch DataLoader over a map-style dataset, read through a copy that counts
    each batch's items and opens a resumed epoch at its next batch (see the module)."""

    def __init__(self, loader: DataLoader[Any], exact: bool, batch_sampler: Any = None) -> None:
        self.loader = loader
        self.opening: _Opening | None = None
        view = copy.copy(loader)
        view.__dict__["_iterator"] = None
        inner = batch_sampler if batch_sampler is not None else loader.batch_sampler
        self.noted = _NotedBatches(inner, self)
        """The batch sampler read (the loader's, or one giving this process its share)."""
        object.__setattr__(view, "batch_sampler", self.noted)
        self.workers = loader.num_workers if exact else 0
        """Worker processes whose random states are followed (training loaders)."""
        if self.workers:
            view.collate_fn = _CollateWithStates(loader.collate_fn)
        self.view = view
        self.sizes = self.noted.sizes.popleft
        self.worker_states: list[Any] = [None] * self.workers
        """Each worker's random states after its last batch trained (by the worker that
        made it in a run never stopped)."""
        self.offset = 0
        """In a resumed epoch, worker `i` makes the batches worker `(offset + i) % n`
        made in the run never stopped."""
        self.epoch_states: dict[str, Any] | None = None
        """The random states the current epoch's order and worker seeds drew from."""
        self.base_seed: int | None = None
        """The seed torch gave this epoch's workers."""
        self.persistent_started = False
        self._resume: dict[str, Any] | None = None
        self._resumed_epoch = 0

    @property
    def skips_itself(self) -> bool:
        """Its sampler skips the samples a resumed epoch already trained (ours)."""
        sampler = getattr(self.noted.inner, "sampler", None)
        return callable(getattr(sampler, "skip", None))

    def states(self) -> dict[str, Any]:
        """torch's random state and the loader's generators' states, now."""
        states: dict[str, Any] = {"torch": torch.get_rng_state()}
        for name, generator in _generators(self.loader).items():
            states[name] = generator.get_state()
        return states

    def put_states(self, states: dict[str, Any]) -> None:
        generators = _generators(self.loader)
        for name, state in states.items():
            if name == "torch":
                torch.set_rng_state(state.cpu().to(torch.uint8))
            elif name in generators:
                generators[name].set_state(state.cpu().to(torch.uint8))

    # what a checkpoint keeps, and a resume puts back --------------------------------------------
    def state(self, complete: bool) -> dict[str, Any]:
        """What a checkpoint notes: the workers' random states; inside an epoch, the
        random states its order drew from and its workers' seed; at its end, the
        loader's generators' states now."""
        state: dict[str, Any] = {"workers": list(self.worker_states)}
        if complete:
            state["generators"] = {k: v for k, v in self.states().items() if k != "torch"}
        elif self.epoch_states is not None:
            state["epoch"] = {"states": dict(self.epoch_states), "base": self.base_seed}
        return state

    def resume(self, saved: Any, epoch: int) -> None:
        """The next `batches` resume `epoch` (inside it, or at its start) from what a
        checkpoint noted (`state`)."""
        saved = saved if isinstance(saved, dict) else {}
        self._resume, self._resumed_epoch = saved, epoch
        workers = saved.get("workers")
        if isinstance(workers, list) and len(workers) == self.workers:
            self.worker_states = list(workers)
        generators = saved.get("generators")
        if isinstance(generators, dict):
            self.put_states(generators)

    # an epoch's batches ----------------------------------------------------------------
    def batches(self, epoch: int, skip: int, after: Tensor | None) -> Iterator[Any]:
        """The batches of `epoch` after the `skip` a resumed epoch already trained
        (`after`: torch's random state to go on from then, the checkpoint's)."""
        loader, source = self.loader, self.view
        resume, self._resume = self._resume, None
        persistent = bool(getattr(loader, "persistent_workers", False)) and self.workers > 0
        opening: dict[str, Any] | None = None
        states: list[Any] | None = None
        offset, base = 0, None
        if skip and resume is not None and self._resumed_epoch == epoch:
            saved = resume.get("epoch")
            if isinstance(saved, dict):
                opening, base = saved.get("states"), saved.get("base")
            if persistent:  # for this epoch only: the next starts workers of its own
                source = copy.copy(source)
                source.__dict__["_iterator"] = None
                object.__setattr__(source, "persistent_workers", False)
            states = self.worker_states
            offset = skip % self.workers if self.workers else 0
        elif persistent and not self.persistent_started and epoch > 1:
            # a run never stopped made these workers in an earlier epoch: they go on from
            # their last batches' states, and drew no seed for them this epoch
            opening, states = self.states(), self.worker_states
        self.offset = offset
        if self.workers:
            init = loader.worker_init_fn
            source.worker_init_fn = (
                init if states is None else _WorkerStart(init, states, offset, base)
            )
        if skip or opening is not None or after is not None:
            self.opening = _Opening(0 if self.skips_itself else skip, opening, after)
        if source is self.view and persistent:
            self.persistent_started = True
        batches = iter(source)
        self.base_seed = getattr(batches, "_base_seed", None)
        return self._unwrapped(batches) if self.workers else batches

    def _unwrapped(self, batches: Iterator[WorkerBatch]) -> Iterator[Any]:
        saved, workers, offset = self.worker_states, self.workers, self.offset
        for batch, worker, states in batches:
            saved[(offset + worker) % workers] = states
            yield batch


def is_indexed(loader: Any) -> bool:
    """A torch DataLoader batching a map-style dataset with a batch sampler."""
    return (
        isinstance(loader, DataLoader)
        and not isinstance(loader.dataset, IterableDataset)
        and loader.batch_sampler is not None
    )


def is_stateful(loader: Any) -> bool:
    """A loader that saves and restores its own position (`state_dict`/`load_state_dict`)."""
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def arithmetic_sizes(loader: Any, skip: int) -> Iterator[int] | None:
    """The items of each batch of a torch DataLoader with a plain batch size, from its
    sampler's length: every batch full but the last (None when it cannot be told)."""
    size = getattr(loader, "batch_size", None)
    try:
        samples = len(loader.sampler)
    except (TypeError, AttributeError):
        return None
    if not isinstance(size, int) or size < 1 or isinstance(loader.dataset, IterableDataset):
        return None
    whole, rest = divmod(samples, size)
    last = (rest,) if rest and not getattr(loader, "drop_last", False) else ()
    return itertools.islice(itertools.chain(itertools.repeat(size, whole), last), skip, None)
