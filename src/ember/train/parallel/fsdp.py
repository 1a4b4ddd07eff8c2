"""FSDP: each process holds a shard of the parameters, gradients and optimizer state.

`fully_shard` (FSDP2) is applied to the chosen submodules, then to the root; the
optimizer, bound to the model's parameters when the learner was built, is rebound to
the sharded parameters (its state is created at the first step, so it is sharded too).
The step methods (`train_step`, `valid_step`, and `test_step` and `predict_step` when
the model has them) are registered as forward methods, so the root unit's parameters
are gathered around them as around `forward`: a step may call the submodules directly
(`self.encoder(x)`) without calling the model itself. FSDP gathers them again for the
backward from the loss of the step's `TrainOutput`.

The checkpoints of the sharded model are read and written by `Sharding`
(`sharding.py`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ember.errors import ConfigError, TrainingError
from ember.train.distributed import name_wait
from ember.train.parallel.batchnorm import broadcast_buffers
from ember.train.parallel.sharding import Sharding
from ember.train.parallel.sharding import _by_index as _by_index
from ember.train.parallel.sharding import _by_name as _by_name
from ember.train.parallel.ties import unit_groups

if TYPE_CHECKING:
    from ember.train.distributed import Distributed

_PRECISIONS = {"bf16": torch.bfloat16}
STEP_METHODS = ("train_step", "valid_step", "test_step", "predict_step")
"""The model's methods that run like its forward: FSDP gathers the parameters around them."""


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
      one host. Such a checkpoint resumes on any number of processes: each reads the
      rows it needs from the files, by the index rank 0 writes.
    - `hybrid` (`strategy="hsdp"`): HSDP, sharded within groups of processes and
      replicated across the groups: each group holds one copy of the model, sharded
      over its processes, and the groups average their gradients as DDP does. The
      groups are `shard_size` processes each, by default the processes of one machine
      (torchrun's LOCAL_WORLD_SIZE): gathers stay inside a machine, and only the
      gradient average crosses machines.
    """

    modules: Sequence[type[nn.Module]] = ()
    min_params: int | None = None
    reshard_after_forward: bool = True
    mixed_precision: str | None = None
    cpu_offload: bool = False
    sharded_checkpoints: bool = False
    hybrid: bool = False
    shard_size: int | None = None
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
        size = self.shard_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise ConfigError(f"FsdpOptions(shard_size=...) must be an int >= 1, got {size!r}.")
        if size is not None and not self.hybrid:
            raise ConfigError(
                f"shard_size={size} is the size of HSDP's shard groups: use "
                f"devices(..., strategy='hsdp', shard_size={size}) (or FsdpOptions(hybrid=True, "
                f"shard_size={size})), or drop shard_size to shard over every process (FSDP)."
            )
        for name in ("reshard_after_forward", "cpu_offload", "sharded_checkpoints", "hybrid"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"FsdpOptions({name}=...) takes True or False, got {getattr(self, name)!r}."
                )

    @classmethod
    def from_keywords(cls, options: dict[str, Any], strategy: str = "fsdp") -> FsdpOptions:
        """The options given as keywords of `devices(..., strategy=strategy)` ("fsdp" or
        "hsdp"); an unknown name is refused."""
        known = [f.name for f in fields(cls) if f.init and f.name != "hybrid"]
        unknown = [name for name in options if name not in known]
        if unknown:
            raise ConfigError(
                f"devices(strategy={strategy!r}) got the unknown option {unknown[0]!r}. FSDP "
                f"options: {', '.join(known)}."
            )
        return cls(**options, hybrid=strategy == "hsdp")

    @property
    def name(self) -> str:
        return "HSDP" if self.hybrid else "FSDP"

    def shard_group(self, world: int) -> int:
        """The processes each copy of the model is sharded over: all of them under FSDP;
        under HSDP `shard_size`, or those of one machine (torchrun's LOCAL_WORLD_SIZE)."""
        if not self.hybrid:
            return world
        if self.shard_size is not None:
            return self.shard_size
        return int(os.environ.get("LOCAL_WORLD_SIZE", world))

    def describe(self) -> str:
        parts = [f"units: {', '.join(m.__name__ for m in self.modules) or 'the root'}"]
        if self.hybrid:
            size = self.shard_size
            parts.append(
                f"shard groups of {size} processes" if size else "a shard group per machine"
            )
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
        broadcast: bool = False,
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
        shard = options.shard_group(context.world)
        if context.world % shard:
            raise TrainingError(
                f"HSDP shards each copy of the model over {shard} processes (one machine's, "
                f"LOCAL_WORLD_SIZE), but {context.world} processes do not form groups of "
                f"{shard}: give every machine as many processes, or FsdpOptions(shard_size=...)."
            )
        mesh = (
            init_device_mesh(
                context.device.type,
                (context.world // shard, shard),
                mesh_dim_names=("replicate", "shard"),
            )
            if options.hybrid
            else init_device_mesh(context.device.type, (context.world,))
        )
        settings: dict[str, Any] = {
            "mesh": mesh,  # 2-D under HSDP: replicated over the first, sharded over the second
            "reshard_after_forward": options.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            if dtype is not None
            else MixedPrecisionPolicy(),
            "offload_policy": CPUOffloadPolicy() if options.cpu_offload else OffloadPolicy(),
        }
        groups = unit_groups(model, units(model, options))
        for group in groups.units:  # tied parameters: their modules in one unit
            fully_shard(group[0] if len(group) == 1 else list(group), **settings)
        fully_shard(model, **settings)
        for method in STEP_METHODS:
            if callable(getattr(model, method, None)):
                register_fsdp_forward_method(model, method)
        _rebind(optimizer, model, names)
        context.progress += 1
        self.model = model
        self.context = context
        self.broadcast = broadcast
        """sync_batchnorm() on the CPU: rank 0's buffers after each training forward."""
        context.sharding = Sharding(model, optimizer, context, options.sharded_checkpoints)
        context.sharding.notes = groups.notes

    def __call__(self, batch: Any) -> Any:
        output = self.model.train_step(batch)  # type: ignore[operator]
        if self.broadcast:
            broadcast_buffers(self.model)
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
        """Nothing to do: every rank runs as many batches (one with fewer runs stand-ins,
        `ember.train.length.batches.StandIn`)."""
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
