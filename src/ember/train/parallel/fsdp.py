"""FSDP: each process holds a shard of the parameters, gradients and optimizer state.

`fully_shard` (FSDP2) is applied to the chosen submodules, then to the root; the
optimizer, bound to the model's parameters when the learner was built, is rebound to
the sharded parameters (its state is created at the first step, so it is sharded too).
`train_step` and `valid_step` are registered as forward methods, so the parameters
are gathered around them as around `forward`.

Checkpoints hold the whole model and optimizer states, gathered to rank 0 on the CPU
(`get_model_state_dict`/`get_optimizer_state_dict` with `full_state_dict=True`), in
the same format as one process or DDP writes: the optimizer state keyed by parameter
index, as `torch.optim.Optimizer.state_dict()` keys it. Such a checkpoint loads into a
plain module, and resumes with any number of processes under either strategy; rank 0
reads it and broadcasts it to the others' shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ember.errors import ConfigError, TrainingError
from ember.train.distributed import name_wait

if TYPE_CHECKING:
    from ember.train.distributed import Distributed

_PRECISIONS = {"bf16": torch.bfloat16}


@dataclass(frozen=True)
class FsdpOptions:
    """How `devices([...], strategy="fsdp")` shards the model.

    - `modules`: module classes sharded as units of their own (e.g. a transformer's
      block class): their parameters are gathered just before their forward and freed
      after it, so the whole model is never gathered at once.
    - `min_params`: also a unit, any submodule with at least this many parameters
      that are not already in a smaller unit.
    - The root module is always a unit: it holds every parameter left.
    - `reshard_after_forward`: free gathered parameters after the forward (default;
      less memory) or keep them until the backward (less communication).
    - `mixed_precision="bf16"`: compute with bfloat16 copies of the parameters and
      reduce gradients in float32 (`MixedPrecisionPolicy`); the shards, the optimizer
      state and the checkpoints stay float32.
    - `cpu_offload`: keep the shards, their gradients and the optimizer step in host
      memory (`CPUOffloadPolicy`), for models whose shards do not fit on the GPUs.
    - `sharded_checkpoints`: each process writes its own shards of the model and
      optimizer states (with the run's recorder) and rank 0 an index, instead of
      gathering the whole states on rank 0; for models whose whole state does not fit
      one host. Such a checkpoint resumes on as many processes, under FSDP.
    """

    modules: Sequence[type[nn.Module]] = ()
    min_params: int | None = None
    reshard_after_forward: bool = True
    mixed_precision: str | None = None
    cpu_offload: bool = False
    sharded_checkpoints: bool = False
    _units: tuple[type[nn.Module], ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        given: Any = self.modules
        modules = (given,) if isinstance(given, type) else tuple(given)
        bad = [m for m in modules if not (isinstance(m, type) and issubclass(m, nn.Module))]
        if bad:
            raise ConfigError(
                f"FsdpOptions(modules=...) takes torch.nn.Module classes (e.g. [Block]), got "
                f"{bad[0]!r}."
            )
        object.__setattr__(self, "modules", tuple(modules))
        object.__setattr__(self, "_units", tuple(modules))
        minimum = self.min_params
        if minimum is not None and (
            not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 1
        ):
            raise ConfigError(f"FsdpOptions(min_params=...) must be an int >= 1, got {minimum!r}.")
        if self.mixed_precision is not None and self.mixed_precision not in _PRECISIONS:
            raise ConfigError(
                "FsdpOptions(mixed_precision=...) takes 'bf16' (bfloat16 parameters for the "
                f"compute, float32 gradient reduction) or None, got {self.mixed_precision!r}."
            )
        for name in ("reshard_after_forward", "cpu_offload", "sharded_checkpoints"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"FsdpOptions({name}=...) takes True or False, got {getattr(self, name)!r}."
                )

    @classmethod
    def from_keywords(cls, options: dict[str, Any]) -> FsdpOptions:
        """The options given as keywords of `devices(...)`; an unknown name is refused."""
        known = [f.name for f in fields(cls) if f.init]
        unknown = [name for name in options if name not in known]
        if unknown:
            raise ConfigError(
                f"devices(strategy='fsdp') got the unknown option {unknown[0]!r}. FSDP options: "
                f"{', '.join(known)}."
            )
        return cls(**options)

    def describe(self) -> str:
        parts = [f"units: {', '.join(m.__name__ for m in self.modules) or 'the root'}"]
        if self.min_params is not None:
            parts.append(f"submodules of {self.min_params:,}+ parameters")
        if not self.reshard_after_forward:
            parts.append("kept gathered until the backward")
        if self.mixed_precision:
            parts.append(f"{self.mixed_precision} compute, float32 reduction")
        if self.cpu_offload:
            parts.append("shards offloaded to the CPU")
        if self.sharded_checkpoints:
            parts.append("checkpoints written in shards")
        return "; ".join(parts)


def units(model: nn.Module, options: FsdpOptions) -> list[nn.Module]:
    """The submodules sharded as units of their own, innermost first (the root is not
    among them)."""
    chosen: list[nn.Module] = []
    owned: set[int] = set()
    for module in reversed(list(model.modules())):  # every submodule before its parents
        if module is model:
            continue
        free = [p for p in module.parameters() if id(p) not in owned]
        if not free:
            continue
        wanted = isinstance(module, options._units) or (
            options.min_params is not None and sum(p.numel() for p in free) >= options.min_params
        )
        if wanted:
            chosen.append(module)
            owned.update(id(p) for p in module.parameters())
    return chosen


class FsdpParallel:
    """The model sharded over the process group; the loop calls it for `train_step`."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        context: Distributed,
        options: FsdpOptions,
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
            register_fsdp_forward_method,
        )

        context.progress += 1
        _broadcast_from_rank0(model)  # every rank starts from rank 0's weights, as under DDP
        names = {id(p): name for name, p in model.named_parameters()}
        dtype = _PRECISIONS.get(options.mixed_precision or "")
        settings: dict[str, Any] = {
            "mesh": init_device_mesh(context.device.type, (context.world,)),
            "reshard_after_forward": options.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            if dtype is not None
            else MixedPrecisionPolicy(),
            "offload_policy": CPUOffloadPolicy() if options.cpu_offload else OffloadPolicy(),
        }
        self.units = units(model, options)
        for unit in self.units:
            fully_shard(unit, **settings)
        fully_shard(model, **settings)
        for method in ("train_step", "valid_step"):
            if callable(getattr(model, method, None)):
                register_fsdp_forward_method(model, method)
        _rebind(optimizer, model, names)
        context.progress += 1
        self.model = model
        self.context = context
        context.sharding = Sharding(model, optimizer, context, options.sharded_checkpoints)

    def __call__(self, batch: Any) -> Any:
        output = self.model.train_step(batch)  # type: ignore[operator]
        self.context.progress += 1
        return output

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Keep the gradients of this batch local (all but the last batch of a group):
        they are reduced, summed with the others, after the group's last backward."""
        model: Any = self.model
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def join(self) -> contextlib.AbstractContextManager[Any]:
        """Nothing to do: every rank has the same number of batches (checked before)."""
        return contextlib.nullcontext()

    evaluation = staticmethod(torch.no_grad)
    """The context of validation (see `ember.train.parallel.evaluation`)."""


name_wait(FsdpParallel.__init__.__code__, "the setup of FSDP (the sharding of the model)")


def _broadcast_from_rank0(model: nn.Module) -> None:
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.detach(), src=0)


def _rebind(optimizer: torch.optim.Optimizer, model: nn.Module, names: dict[int, str]) -> None:
    """Point the optimizer at the sharded parameters that replaced the ones it was
    built with (it has taken no step yet, so it holds no state)."""
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(p)]] for p in group["params"]]


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
