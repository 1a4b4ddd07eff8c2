"""How several processes share one model: whole copies (DDP, the default) or shards of
it (FSDP). `devices([...], strategy=...)` chooses; the learner calls `parallelize` once
the processes have joined, and runs each step through what it returns."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ember.errors import ConfigError
from ember.train.parallel.fsdp import FsdpOptions

if TYPE_CHECKING:
    from ember.train.distributed import Distributed

__all__ = [
    "STRATEGIES",
    "FsdpOptions",
    "choose",
    "evaluation",
    "join",
    "no_sync",
    "parallelize",
]

STRATEGIES = ("ddp", "fsdp", "hsdp")


def choose(strategy: Any, options: dict[str, Any], world: int) -> FsdpOptions | None:
    """The FSDP options of `devices(..., strategy=strategy, **options)` (None for DDP),
    for a run of `world` processes; anything that cannot work is refused here."""
    if isinstance(strategy, FsdpOptions):
        if options:
            raise ConfigError(
                "devices(strategy=FsdpOptions(...)) takes the FSDP options inside "
                f"FsdpOptions; got {', '.join(options)} as keywords too. Give them in one place."
            )
        fsdp: FsdpOptions | None = strategy
    elif strategy in ("fsdp", "hsdp"):
        fsdp = FsdpOptions.from_keywords(options, strategy)
    elif strategy == "ddp":
        if options:
            raise ConfigError(
                f"devices() got {', '.join(sorted(options))}, which are options of the FSDP "
                "strategy: add strategy='fsdp' or 'hsdp' (DDP has no options)."
            )
        fsdp = None
    else:
        raise ConfigError(
            f"devices(strategy=...) takes 'ddp' (a whole copy of the model per process), "
            f"'fsdp' (each process holds a shard) or 'hsdp' (shards within groups of "
            f"processes, a copy per group), got {strategy!r}."
        )
    if fsdp is None:
        return None
    named = fsdp.name.lower()
    if world < 2:
        raise ConfigError(
            f"devices(strategy='{named}') shards the model over several processes, but this "
            f"run has one. List several devices (e.g. devices(['cuda:0', 'cuda:1'], "
            f"strategy='{named}')), launch with torchrun, or drop strategy='{named}'."
        )
    if fsdp.shard_size is not None and world % fsdp.shard_size:
        raise ConfigError(
            f"shard_size={fsdp.shard_size} does not divide the {world} processes into shard "
            "groups: choose a shard_size that divides the number of processes."
        )
    return fsdp


def parallelize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    context: Distributed,
    fsdp: FsdpOptions | None,
    share_batchnorm: bool = False,
) -> Any:
    """The model as the processes share it: called with a batch it runs `train_step`;
    `no_sync()` and `join()` are the contexts the loop needs. `share_batchnorm`
    (`sync_batchnorm()`): SyncBatchNorm on GPUs, rank 0's buffers after each training
    forward on the CPU."""
    from ember.train.parallel.batchnorm import sync_batchnorm

    broadcast = share_batchnorm and not sync_batchnorm(model, context.device)
    if fsdp is not None:
        from ember.train.parallel.fsdp import FsdpParallel

        return FsdpParallel(model, optimizer, context, fsdp, broadcast)
    from ember.train.parallel.ddp import DdpParallel

    return DdpParallel(model, context, broadcast)


_NULL = contextlib.nullcontext()


def join(parallel: Any) -> Any:
    """The context of an epoch's batches: under DDP, ranks with fewer batches keep
    answering the others' reductions."""
    return parallel.join() if parallel is not None else _NULL


def no_sync(parallel: Any, accumulate: bool) -> Any:
    """Skip the gradient reduction on all but the last batch of a group."""
    return parallel.no_sync() if parallel is not None and accumulate else _NULL


def evaluation(parallel: Any) -> Any:
    """The context validation runs in: `torch.inference_mode`, or `torch.no_grad` for a
    sharded model (FSDP keeps the buffers it gathers parameters into, which tensors made
    under inference mode could not be reused for training)."""
    return getattr(parallel, "evaluation", torch.inference_mode)
