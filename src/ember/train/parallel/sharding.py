"""The checkpoints of a model sharded with FSDP: `Sharding` reads and writes them.

Checkpoints hold the whole model and optimizer states, gathered to rank 0 on the CPU
(`get_model_state_dict`/`get_optimizer_state_dict` with `full_state_dict=True`), in
the same format as one process or DDP writes: the optimizer state keyed by parameter
index, as `torch.optim.Optimizer.state_dict()` keys it. Such a checkpoint loads into a
plain module, and resumes with any number of processes under either strategy; rank 0
reads it and broadcasts it to the others' shards.

With `FsdpOptions(sharded_checkpoints=True)`, each process writes its own shards
instead and rank 0 an index of the rows each file holds (`checkpoint/shards.py`); such
a checkpoint resumes on any number of processes: each reads the rows it needs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ember.errors import TrainingError
from ember.train.checkpoint.shards import ShardIndex, index_record


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
        """Every rank writes its shards of the model and optimizer states of `epoch` now
        (under HSDP, the ranks of the first replica: the others hold the same shards);
        returns the index that rank 0 writes as each part (rank 0 removes the
        checkpoint's last part first, so it is incomplete until rank 0 rewrites it)."""
        from ember.train.checkpoint.writer import Snapshots

        context = self.context
        if context.main:  # shards of this epoch written before, by as many processes or more
            checkpointer.wait()
            checkpointer.drop_shards(epoch)
            checkpointer.path("scheduler", epoch).unlink(missing_ok=True)
        context.barrier()
        model_state, optim_state = self.model.state_dict(), self.optimizer.state_dict()
        states = optim_state["state"]
        split = {  # the values split between the processes: each one's shape and rows here
            "model": _split(((key,), value) for key, value in model_state.items()),
            "optim": _split(
                (("state", key, name), value)
                for key, values in states.items()
                for name, value in values.items()
            ),
        }
        writes = _first_replica(model_state.values())
        context.progress += 1
        if writes:
            snapshots = Snapshots()
            model = {key: _local(value) for key, value in model_state.items()}
            optimizer = {
                **optim_state,
                "state": {
                    key: {name: _local(value) for name, value in values.items()}
                    for key, values in states.items()
                },
            }
            shard = {
                "model": snapshots.take("model", model),
                "optim": snapshots.take("optim", optimizer),
            }
            snapshots.wait()
            checkpointer.save_shard(epoch, context.rank, shard)
        context.progress += 1
        every = context.all_gather((writes, split))  # every shard is on disk after this
        files = [rank for rank, (wrote, _) in enumerate(every) if wrote]
        parts = {
            part: [
                [list(path), list(shape), [list(every[rank][1][part][path][1]) for rank in files]]
                for path, (shape, _) in entries.items()
            ]
            for part, entries in split.items()
        }
        index = index_record(context.world, files, parts)
        return Held(index), Held(index)

    def load_shards(self, checkpointer: Any, epoch: int, with_optimizer: bool = True) -> None:
        """Every rank reads the rows of its shards of the checkpoint of `epoch`, written in
        shards by any number of processes, from the files that hold them."""
        context, problem = self.context, None
        try:
            self._load_model_shards(ShardIndex(checkpointer, epoch, "model"))
            if with_optimizer:
                self._load_optimizer_shards(ShardIndex(checkpointer, epoch, "optim"))
        except Exception as error:
            problem = f"rank {context.rank}: {type(error).__name__}: {error}"
        problems = [p for p in context.all_gather(problem) if p is not None]
        if problems:
            raise TrainingError(
                f"The sharded checkpoint of epoch {epoch} cannot be loaded: {problems[0]}"
            )

    def _load_model_shards(self, index: ShardIndex) -> None:
        state = self.model.state_dict()

        def wanted(path: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[int, int] | None:
            value = state.get(path[0])
            if value is None:
                raise TrainingError(f"unexpected key {path[0]!r} (this model has none)")
            if tuple(value.shape) != shape:
                raise TrainingError(
                    f"shape mismatch for {path[0]!r}: the checkpoint has {shape}, the model "
                    f"has {tuple(value.shape)}"
                )
            return _rows(value)

        saved = index.read(wanted)
        problems = [f"missing key {key!r}" for key in state if key not in saved]
        problems += [f"unexpected key {key!r}" for key in saved if key not in state]
        if problems:
            raise TrainingError("; ".join(problems[:10]))
        with torch.no_grad():
            for key, value in state.items():
                local, stored = _local(value), saved[key]
                if not isinstance(stored, torch.Tensor) or stored.shape != local.shape:
                    raise TrainingError(f"the shard of {key!r} does not fit this model")
                local.copy_(stored)

    def _load_optimizer_shards(self, index: ShardIndex) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]

        def wanted(path: tuple[Any, ...], shape: tuple[int, ...]) -> tuple[int, int] | None:
            param = params[int(path[1])] if int(path[1]) < len(params) else None
            if param is None or tuple(param.shape) != shape:
                raise TrainingError(
                    f"the optimizer state {'/'.join(map(str, path[1:]))} does not fit the "
                    "parameters of this run's optimizer"
                )
            return _rows(param)

        optim = index.read(wanted)
        optim["state"] = {
            int(key): {name: _shard_of(value, params[int(key)]) for name, value in v.items()}
            for key, v in optim["state"].items()
        }
        self.optimizer.load_state_dict(optim)

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


def _local(tensor: Any) -> Any:
    """This process's shard of a sharded tensor (a DTensor); any other value as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _rows(tensor: Any) -> tuple[int, int] | None:
    """The rows (first dimension) of the whole tensor that this process's shard of a
    sharded tensor holds; None for a tensor that is not split (a plain tensor, or one
    replicated on every process). FSDP splits the first dimension in equal chunks (the
    last ones shorter or empty), as `torch.chunk` does."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return None
    split = [(dim, placement) for dim, placement in enumerate(placements) if placement.is_shard()]
    if not split:
        return None
    if len(split) > 1 or getattr(split[0][1], "dim", None) != 0:
        raise TrainingError(
            f"a tensor sharded as {placements} cannot be written in shards: ember's sharded "
            "checkpoints split the first dimension over one dimension of the device mesh"
        )
    mesh, dim = tensor.device_mesh, split[0][0]
    count, size = tensor.shape[0], mesh.size(dim)
    chunk = -(-count // size)
    start = min(mesh.get_local_rank(dim) * chunk, count)
    stop = min(start + chunk, count)
    if tensor.to_local().shape[0] != stop - start:
        raise TrainingError(
            f"the shard of a tensor of {count} rows holds {tensor.to_local().shape[0]} rows, "
            f"not rows {start} to {stop} as chunks over {size} processes would"
        )
    return start, stop


def _split(values: Any) -> dict[tuple[Any, ...], tuple[list[int], tuple[int, int]]]:
    """Of `(path, value)` pairs, the values split between the processes: each one's
    whole shape and the rows this process holds."""
    split = {}
    for path, value in values:
        rows = _rows(value)
        if rows is not None:
            split[path] = (list(value.shape), rows)
    return split


def _first_replica(values: Any) -> bool:
    """Whether this process is in the first replica of the sharded tensors (all of them
    under FSDP; under HSDP, the first group of processes that shard one copy)."""
    for value in values:
        placements = getattr(value, "placements", None)
        if placements is not None:
            mesh = value.device_mesh
            return all(
                mesh.get_local_rank(dim) == 0
                for dim, placement in enumerate(placements)
                if placement.is_replicate()
            )
    return True


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
