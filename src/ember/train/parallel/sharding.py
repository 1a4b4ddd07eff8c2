"""The checkpoints of a model sharded with FSDP: `Sharding` reads and writes them.

Checkpoints hold the whole model and optimizer states, gathered to rank 0 on the CPU
(`get_model_state_dict`/`get_optimizer_state_dict` with `full_state_dict=True`), in
the same format as one process or DDP writes: the optimizer state keyed by parameter
index, as `torch.optim.Optimizer.state_dict()` keys it. Such a checkpoint loads into a
plain module, and resumes with any number of processes under either strategy; rank 0
reads it and broadcasts it to the others' shards.

With `FsdpOptions(sharded_checkpoints=True)`, each process writes its own shards
instead and rank 0 an index; such a checkpoint resumes on as many processes, under FSDP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.errors import TrainingError


class Held:
    """A state gathered on rank 0, offered to a checkpointer in place of the module or
    optimizer it came from (a checkpointer reads `state_dict()`)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


class Sharding:
    """Reads and writes the whole model and optimizer states of a sharded model. Every
    rank calls each method: they gather to, or broadcast from, rank 0."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        context: Any,
        per_rank: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.context = context
        self.per_rank = per_rank
        """Checkpoints are written in shards, one file per process and part."""
        self.notes: list[str] = []
        """How the units were chosen around tied parameters, for the run's description."""

    def states(self, checkpointer: Any, epoch: int) -> tuple[Held, Held, int | None]:
        """What rank 0 writes as the model and optimizer parts of the checkpoint of
        `epoch`, and the number of processes that wrote it in shards (None: the parts
        hold the whole states)."""
        if not self.per_rank:
            drop = getattr(checkpointer, "drop_shards", None)
            if self.context.main and callable(drop):
                drop(epoch)  # shards of a run that wrote this epoch in shards before
            return (*self.gathered(), None)
        return (*self.write_shards(checkpointer, epoch), self.context.world)

    def write_shards(self, checkpointer: Any, epoch: int) -> tuple[Held, Held]:
        """Every rank writes its shards of the model and optimizer states of `epoch` now;
        returns the index that rank 0 writes as each part (rank 0 removes the
        checkpoint's last part first, so it is incomplete until rank 0 rewrites it)."""
        from ember.train.checkpoint.writer import Snapshots

        context = self.context
        if context.main:
            checkpointer.wait()
            checkpointer.path("scheduler", epoch).unlink(missing_ok=True)
        context.barrier()
        model = {key: _local(value) for key, value in self.model.state_dict().items()}
        optimizer = self.optimizer.state_dict()
        optimizer["state"] = {
            key: {name: _local(value) for name, value in values.items()}
            for key, values in optimizer["state"].items()
        }
        context.progress += 1
        snapshots = Snapshots()
        shard = {
            "model": snapshots.take("model", model),
            "optim": snapshots.take("optim", optimizer),
        }
        snapshots.wait()
        checkpointer.save_shard(epoch, context.rank, shard)
        context.progress += 1
        shapes = {key: list(value.shape) for key, value in self.model.state_dict().items()}
        index = {SHARDED: {"processes": context.world, "shapes": shapes}}
        return Held(index), Held(index)

    def load_shards(self, checkpointer: Any, epoch: int, with_optimizer: bool = True) -> None:
        """Every rank loads its own shards of the checkpoint of `epoch`, written by as
        many processes."""
        context, problem = self.context, None
        try:
            saved = checkpointer.load_shard(epoch, "model", context.rank)
            optim = (
                checkpointer.load_shard(epoch, "optim", context.rank) if with_optimizer else None
            )
            with torch.no_grad():
                for key, value in self.model.state_dict().items():
                    local, stored = _local(value), saved.get(key)
                    if not isinstance(stored, torch.Tensor) or stored.shape != local.shape:
                        raise TrainingError(f"the shard of {key!r} does not fit this model")
                    local.copy_(stored)
            if optim is not None:
                params = [p for group in self.optimizer.param_groups for p in group["params"]]
                optim["state"] = {
                    int(key): {
                        name: _shard_of(value, params[int(key)]) for name, value in v.items()
                    }
                    for key, v in optim["state"].items()
                }
                self.optimizer.load_state_dict(optim)
        except Exception as error:
            problem = f"rank {context.rank}: {type(error).__name__}: {error}"
        problems = [p for p in context.all_gather(problem) if p is not None]
        if problems:
            raise TrainingError(
                f"The sharded checkpoint of epoch {epoch} cannot be loaded: {problems[0]}"
            )

    def gathered(self) -> tuple[Held, Held]:
        """The whole model and optimizer states, on the CPU of rank 0 (empty elsewhere)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model = self.gathered_model()
        self.context.progress += 1
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=_gathering())
        self.context.progress += 1
        return Held(model), Held(_by_index(optim) if optim else {})

    def gathered_model(self) -> dict[str, Any]:
        """The whole model state on the CPU of rank 0 (empty elsewhere)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        self.context.progress += 1
        state = get_model_state_dict(self.model, options=_gathering())
        self.context.progress += 1
        return state

    def load(self, read: Any, epoch: int, with_optimizer: bool = True) -> None:
        """Load the checkpoint of `epoch` that rank 0 reads with `read(epoch, part)` into
        every rank's shards: the model, and the optimizer unless `with_optimizer` is
        False. A checkpoint that does not fit fails on every rank with one message."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        context = self.context
        model_state: dict[str, Any] = {}
        optim_state: dict[str, Any] = {}
        problem = None
        if context.main:
            try:
                model_state = read(epoch, "model")
                problem = _mismatch(self.model, model_state)
                if problem is None and with_optimizer:
                    optim_state = _by_name(read(epoch, "optim"), self.optimizer, self.model)
            except Exception as error:
                problem = f"{type(error).__name__}: {error}"
        problem = context.broadcast(problem)
        if problem is not None:
            raise TrainingError(
                f"The checkpoint of epoch {epoch} cannot be loaded into the sharded model: "
                f"{problem}"
            )
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        context.progress += 1
        set_model_state_dict(self.model, model_state, options=options)
        if with_optimizer:
            set_optimizer_state_dict(self.model, self.optimizer, optim_state, options=options)
        context.progress += 1


SHARDED = "ember.sharded_checkpoint"
"""The key of the index that stands for the model and optimizer parts of a checkpoint
written in shards (`FsdpOptions(sharded_checkpoints=True)`)."""


def _local(tensor: Any) -> Any:
    """This process's shard of a sharded tensor (a DTensor); any other value as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _shard_of(value: Any, param: Any) -> Any:
    """A saved optimizer state value, as the sharded tensor of `param`'s placement when
    it is the shard of a tensor shaped like the parameter."""
    if not (isinstance(value, torch.Tensor) and hasattr(param, "device_mesh")):
        return value
    if value.dim() == 0 or value.shape != param.to_local().shape:
        return value
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        value.to(param.device),
        param.device_mesh,
        param.placements,
        shape=param.shape,
        stride=param.stride(),
        run_check=False,
    )


def _gathering() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _mismatch(model: nn.Module, state: Any) -> str | None:
    """What keeps `state` (a whole model state) from loading into `model`, or None."""
    if not isinstance(state, dict):
        return f"the model part holds a {type(state).__name__}, not a module state"
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    problems = [f"missing key {key!r}" for key in expected if key not in state]
    problems += [f"unexpected key {key!r}" for key in state if key not in expected]
    problems += [
        f"shape mismatch for {key!r}: the record has {tuple(value.shape)}, the model has "
        f"{expected[key]}"
        for key, value in state.items()
        if key in expected
        and isinstance(value, torch.Tensor)
        and tuple(value.shape) != expected[key]
    ]
    if not problems:
        return None
    more = f" ... and {len(problems) - 10} more" if len(problems) > 10 else ""
    return "; ".join(problems[:10]) + more


def _by_index(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (as torch's state-dict helpers give
    it) keyed by parameter index instead, as `Optimizer.state_dict()` keys it."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": groups,
    }


def _by_name(state: Any, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, Any]:
    """The reverse of `_by_index`, for `optimizer` over `model`'s parameters."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = [i for group in state["param_groups"] for i in group["params"]]
    if len(saved) != len(order) or len(state["param_groups"]) != len(optimizer.param_groups):
        raise TrainingError(
            f"the optimizer part has {len(saved)} parameters in {len(state['param_groups'])} "
            f"groups; this run's optimizer has {len(order)} in {len(optimizer.param_groups)}"
        )
    return {
        "state": {order[int(key)]: value for key, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [order[int(i)] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }
