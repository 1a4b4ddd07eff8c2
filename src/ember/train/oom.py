"""Micro-batches on demand: a training step that runs out of memory is run again split.

With `grads_accumulation("auto")`, a training step that raises `torch.OutOfMemoryError`
is not the end of the run: its gradients are cleared, what can be freed is freed, and
every batch is split along its first dimension into twice as many micro-batches, until
the step fits. The micro-batches' losses are weighted by their share of the step's
samples and their gradients accumulated, so the update is the one of the unsplit batch.
The split factor stays for the rest of the run and is kept in the checkpoints.

Several processes (DDP) agree on every attempt, and no attempt can leave a process
waiting in a collective that another one will never join (`RankSplit`):

- an attempt runs its micro-batches' forward and backward with no collective at all:
  the model is called directly, not through DDP (whose forward may broadcast buffers
  and whose backward hooks all-reduce gradients), so the gradients stay local;
- then every process, whether its attempt finished or raised out of memory, makes the
  same single call: one all-gather of a row of four numbers (taking part, the split it
  needs or 0, a non-finite loss, its tokens). A process that ran out of memory makes
  that call from its error handler instead of from the end of its micro-batches, so
  the call count per attempt is one on every process whatever happened;
- every process reads the same table: when any process needs a larger split, all of
  them drop the attempt (no gradient all-reduce, no optimizer step) and run it again
  with the largest split asked for; otherwise all of them all-reduce the gradients
  (buckets of a fixed layout, the same on every process), take the buffers of the
  first rank that ran the attempt (DDP broadcasts rank 0's) and step;
- a process whose data ran out before the others' (uneven shards) keeps answering
  with a row that takes no part, and joins their gradient all-reduces and buffer
  broadcasts, until a table shows nobody taking part: every process leaves the epoch
  on that same call, and those whose data ran out first take the weights of one that
  ran to the end (as DDP's join does).
- a process that runs out of memory with micro-batches of one sample raises its
  error; the others wait for it in a barrier it never joins, which the group's failure
  handling ends, reporting that process's error.

An error that is not out of memory (or out of memory once the attempt's table was
agreed) ends the run as any failure of one rank does (`train/distributed/`). Runs
without "auto" keep DDP's own reduction: nothing here runs for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import torch

from ember.errors import TrainingError
from ember.train.distributed import name_wait
from ember.train.memory import largest_allocations as largest_allocations
from ember.train.memory import memory_post_mortem as memory_post_mortem

if TYPE_CHECKING:
    from ember.train.length.epoch_plan import Step

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
        told = [name for name in ("num_items", "num_tokens") if hasattr(batch, name)]
        if told:
            raise TrainingError(
                f"grads_accumulation('auto') cannot split a {type(batch).__name__} batch: it "
                f"says its own {' and '.join(told)}, which a split along the first dimension "
                "would not keep. Give a step's tokens as its output's tokens= (counted for "
                "each micro-batch), or set grads_accumulation(n) with a smaller batch size."
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


class Retry(Exception):
    """Another process ran out of memory: this attempt is dropped on every process."""


@dataclasses.dataclass
class Verdict:
    """What the processes agreed on after one attempt (the same on every process)."""

    active: int
    """Processes that ran the attempt (the others' data ran out: they only take part)."""
    split: int
    """The split the next attempt uses (0: no process ran out of memory)."""
    short: list[int]
    """The ranks that ran out of memory."""
    spent: list[int]
    """The ranks that ran out of memory with micro-batches of one sample."""
    finite: bool
    """No process saw a non-finite loss."""
    tokens: float
    """The attempt's tokens over every process (losses that are means over tokens)."""
    source: int
    """The first rank that ran the attempt: the others take its buffers."""

    @property
    def proceeds(self) -> bool:
        return self.active > 0 and not self.short


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class RankSplit:
    """grads_accumulation("auto") on several processes: the model's gradients stay
    local during an attempt; `agree` is the attempt's one collective, `reduce` averages
    the gradients once every process fitted, and `join` keeps a process whose data ran
    out answering the others (the module's docstring tells why this cannot hang)."""

    BUCKET_BYTES = 25 * 1024 * 1024  # as DDP's buckets: bounded extra memory

    def __init__(self, dist: Any, model: torch.nn.Module) -> None:
        self.dist = dist
        self.model = model
        self.verdict: Verdict | None = None
        self.last_active: list[int] = []
        """The ranks that ran the latest attempt of the epoch."""
        self._device = dist.device if dist.backend == "nccl" else torch.device("cpu")

    def agree(self, active: bool, need: int = 0, finite: bool = True, tokens: Any = 0) -> Verdict:
        """One all-gather of every process's row; the verdict every process reads."""
        import torch.distributed as tdist

        dist = self.dist
        dist.progress += 1
        row = torch.tensor(
            [float(active), float(need), float(not finite), float(tokens)],
            dtype=torch.float64,
            device=self._device,
        )
        table = [torch.empty_like(row) for _ in range(dist.world)]
        tdist.all_gather(table, row)
        rows = torch.stack(table).cpu().tolist()
        dist.progress += 1
        needs = [int(needed) for _, needed, _, _ in rows]
        taking = [rank for rank, row in enumerate(rows) if row[0]]
        if taking:
            self.last_active = taking
        self.verdict = Verdict(
            active=sum(int(taking) for taking, _, _, _ in rows),
            split=max(needs),
            short=[rank for rank, needed in enumerate(needs) if needed != 0],
            spent=[rank for rank, needed in enumerate(needs) if needed < 0],
            finite=not any(bad for _, _, bad, _ in rows),
            tokens=sum(count for _, _, _, count in rows),
            source=taking[0] if taking else 0,
        )
        return self.verdict

    def settle(self, finite: bool, tokens: Any) -> Verdict:
        """The end of an attempt whose micro-batches all ran here: agree; raise `Retry`
        when another process ran out of memory, else average the gradients."""
        verdict = self.agree(True, 0, finite, tokens)
        if verdict.spent:
            self.spent(verdict)
        if not verdict.proceeds:
            raise Retry
        self.reduce(verdict)
        return verdict

    def spent(self, verdict: Verdict) -> NoReturn:
        """Another rank cannot split further: its error ends the run. Wait for it in a
        collective it never joins (the group's failure handling ends the wait and says
        which rank failed and why), so the run reports that rank's error."""
        self.dist.barrier()
        raise TrainingError(  # not reached while the ranks' failure handling works
            f"Out of memory on {_ranks_text(verdict.spent)} with micro-batches of one "
            "sample: grads_accumulation('auto') cannot split further."
        )

    def reduce(self, verdict: Verdict, shadow: bool = False) -> None:
        """Average the gradients over the processes (sums divided by the world), then
        give every process the buffers (e.g. BatchNorm's running statistics) of the
        first one that ran the attempt, as DDP gives rank 0's: the replicas stay equal.
        A parameter without a gradient sends zeros; `shadow`: this process only takes
        part (its data ran out) and keeps no gradient."""
        import torch.distributed as tdist

        dist = self.dist
        dist.progress += 1
        params = [param for param in self.model.parameters() if param.requires_grad]
        for bucket in self._buckets(params):
            first = bucket[0]
            size = sum(param.numel() for param in bucket)
            flat = torch.zeros(size, dtype=first.dtype, device=first.device)
            if not shadow:
                for piece, param in zip(self._pieces(flat, bucket), bucket):
                    if param.grad is not None:
                        piece.copy_(param.grad)
            tdist.all_reduce(flat, op=tdist.ReduceOp.SUM)
            if shadow:
                continue
            flat.div_(dist.world)
            for piece, param in zip(self._pieces(flat, bucket), bucket):
                if param.grad is None:
                    param.grad = piece.clone()
                else:
                    param.grad.copy_(piece)
        self._share(list(self.model.buffers()), verdict.source)
        dist.progress += 1

    def _share(self, tensors: list[torch.Tensor], source: int) -> None:
        """Every process takes rank `source`'s values of `tensors` (in buckets)."""
        import torch.distributed as tdist

        with torch.no_grad():
            for bucket in self._buckets(tensors):
                flat = torch.cat([tensor.detach().reshape(-1) for tensor in bucket])
                tdist.broadcast(flat, src=source)
                for piece, tensor in zip(self._pieces(flat, bucket), bucket):
                    tensor.copy_(piece)

    def _buckets(self, tensors: list[Any]) -> Iterator[list[Any]]:
        """`tensors` in buckets of one dtype and device, of about `BUCKET_BYTES` each,
        in an order that is the same on every process."""
        groups: dict[tuple[torch.dtype, torch.device], list[Any]] = {}
        for tensor in tensors:
            groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
        for members in groups.values():
            bucket: list[Any] = []
            size = 0
            for tensor in members:
                bucket.append(tensor)
                size += tensor.numel() * tensor.element_size()
                if size >= self.BUCKET_BYTES:
                    yield bucket
                    bucket, size = [], 0
            if bucket:
                yield bucket

    @staticmethod
    def _pieces(flat: torch.Tensor, bucket: list[Any]) -> Iterator[torch.Tensor]:
        offset = 0
        for tensor in bucket:
            yield flat[offset : offset + tensor.numel()].view_as(tensor)
            offset += tensor.numel()

    @contextlib.contextmanager
    def join(self) -> Iterator[None]:
        """An epoch's steps; after the last one of this process, answer the others'
        attempts (a row that takes no part, zeros in their gradient all-reduces) until
        no process takes part; then the processes whose data ran out first receive the
        weights of one that ran to the end (as under DDP's join). Not after an error:
        that ends the run."""
        self.last_active = []
        yield
        while True:
            verdict = self.agree(False)
            if verdict.active == 0:
                break
            if verdict.spent:
                self.spent(verdict)
            if verdict.proceeds:
                self.reduce(verdict, shadow=True)
        if self.last_active and len(self.last_active) < self.dist.world:
            self.dist.progress += 1
            self._share([*self.model.parameters(), *self.model.buffers()], self.last_active[0])
            self.dist.progress += 1


name_wait(
    RankSplit.agree.__code__, "the processes' agreement after a step of grads_accumulation('auto')"
)
name_wait(RankSplit.reduce.__code__, "the average of the gradients of grads_accumulation('auto')")


def run_split_ranks(
    optim: Any, step: Step, run_step: Callable[[Step], bool], ranks: RankSplit
) -> bool:
    """`run_split` on several processes: `run_step` ends with `ranks.settle` (the
    agreement and the gradient average); a process that runs out of memory agrees from
    here instead, and every process runs the attempt again with the largest split any
    of them asked for. Rank 0 logs the new split, naming the ranks that needed it."""
    while True:
        factor = optim.micro_split
        largest = max(step.sizes, default=1)
        ranks.verdict = None
        spent: BaseException | None = None
        message = ""
        try:
            return run_step(split_step(step, factor))
        except Retry:
            pass
        except torch.OutOfMemoryError as error:
            if ranks.verdict is not None:  # after the agreement: the run cannot go on
                raise
            if factor >= largest:
                error.add_note(  # type: ignore[attr-defined]
                    "ember: grads_accumulation('auto') already splits every batch into "
                    f"micro-batches of one sample ({factor} per batch) on this process: "
                    "the model does not fit for a single sample."
                )
                spent = error
            else:
                message = str(error).splitlines()[0] if str(error) else "out of memory"
        freed = ranks.verdict is None
        if freed:  # ran out of memory here: free what the attempt held, then agree
            optim.skip()
            free_memory()
            ranks.agree(True, -1 if spent is not None else min(factor * 2, largest))
        verdict = ranks.verdict
        assert verdict is not None
        if spent is not None:
            raise spent
        if verdict.spent:
            ranks.spent(verdict)
        if not freed:  # another rank ran out of memory: drop this attempt too
            optim.skip()
            free_memory()
        optim.micro_split = max(factor, verdict.split)
        if ranks.dist.main:
            log.warning(
                "Out of memory at iteration %d on %s%s: every batch is now split into %d "
                "micro-batches on every process (gradients accumulated: the same update), "
                "for the rest of the run.",
                step.first,
                _ranks_text(verdict.short),
                f" ({message})" if message else "",
                optim.micro_split,
            )


def free_memory() -> None:
    """Collect the garbage of the failed step and give the cached CUDA memory back."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
