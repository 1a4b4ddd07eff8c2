"""What a run does with the memory estimate: `learner_estimate` (the run's options,
one FSDP process's share), `start_estimate` (a fit's first step on an accelerator: a
line in the log and, under `grads_accumulation("auto")`, the split whose estimate fits
the free memory), `check_states_fit` (`build()` on an accelerator: the parameters,
gradients and optimizer state against the device's memory) and `check_host_fit`
(`build()` on the CPU: the same against the memory the machine has available)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch

from ember.errors import ConfigError
from ember.train import memory
from ember.train.distributed import world_size
from ember.train.manual import ManualOptimization
from ember.train.memory import size_text
from ember.train.memory_estimate.fake import (
    estimate_step,
    fake_optimizer,
    fake_tensor,
    make_state,
    state_bytes,
)
from ember.train.memory_estimate.figures import MemoryEstimate, MemoryEstimateError
from ember.train.parallel.fsdp import units

if TYPE_CHECKING:
    from ember.train.length.epoch_plan import Step
    from ember.train.options import LearnerOptions
    from ember.train.parallel import FsdpOptions

log = logging.getLogger("ember.train.learner")  # the run's own log

MARGIN = 0.1
"""The share of a device's memory the estimate leaves free (the allocator's
fragmentation, the kernels' workspaces, what the estimate misses)."""


def learner_estimate(
    options: LearnerOptions, batch: Any, split: int | None = None, device: Any = None
) -> MemoryEstimate:
    """`Learner.memory_estimate`: one step on `batch` as the run would take it."""
    optim, model = options.optimization, options.model
    if isinstance(optim, ManualOptimization):
        raise MemoryEstimateError(
            "The memory estimate runs the step ember runs (forward, backward, the optimizer "
            "step); with custom optimization the model's train_step runs its own backward "
            "and steps, which the estimate cannot follow."
        )
    if any(type(param).__name__ == "DTensor" for param in model.parameters()):
        raise MemoryEstimateError(
            "The model is sharded (FSDP) by the fit that ran: estimate before fit(), when "
            "the figures of one process are computed from the whole model."
        )
    where = torch.device(device) if device is not None else options.device
    estimate = estimate_step(
        model,
        optim.optimizer,
        batch,
        where,
        optim.mixed_precision,
        split if split is not None else (optim.micro_split or 1),
        options.grads_accumulation,
        optim.clip_norm,
    )
    if options.fsdp is None:
        return estimate
    return per_process(estimate, model, options.fsdp, world_size(options.devices))


def per_process(
    estimate: MemoryEstimate, model: torch.nn.Module, fsdp: FsdpOptions, world: int
) -> MemoryEstimate:
    """One FSDP process's share of an unsharded step's estimate, computed: the
    parameters, gradients and optimizer state divided over the `world` processes
    (HSDP: over one group); the root's own parameters, gathered for the whole step; the
    largest unit's, gathered twice (the one computing and the next one, prefetched), in
    the compute dtype; that unit's unsharded gradients before their reduce-scatter; the
    activations and temporaries of the process's batch as the unsharded step's."""
    shards = fsdp.shard_group(world) if fsdp.hybrid else world
    owner: dict[int, int] = {}
    for number, unit in enumerate(units(model, fsdp)):  # innermost first
        for param in unit.parameters():
            owner.setdefault(id(param), number)
    sizes: dict[int, int] = {}
    for param in model.parameters():
        key = owner.get(id(param), -1)
        sizes[key] = sizes.get(key, 0) + param.numel()
    root, largest = sizes.pop(-1, 0), max(sizes.values(), default=0)
    width = 2 if fsdp.mixed_precision == "bf16" else 4
    gathered, unsharded_grads = (root + 2 * largest) * width, largest * 4
    parameters = math.ceil(estimate.parameters / shards) + gathered
    gradients = math.ceil(estimate.gradients / shards) + unsharded_grads
    state = math.ceil(estimate.optimizer_state / shards)
    peak = parameters + gradients + state + estimate.activations + estimate.temporaries
    return dataclasses.replace(
        estimate,
        peak=peak,
        parameters=parameters,
        gradients=gradients,
        optimizer_state=state,
        processes=shards,
    )


def resident_bytes(model: torch.nn.Module, optimizer: Any, device: torch.device) -> int:
    """The bytes on `device` that a step's estimate counts and that are there already:
    the parameters, the buffers, the optimizer state made so far."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    storages = {
        id(tensor.untyped_storage()): tensor.untyped_storage().nbytes()
        for tensor in tensors
        if isinstance(tensor, torch.Tensor) and tensor.device.type == device.type
    }
    return sum(storages.values())


def fitting_split(
    estimate_for: Callable[[int], MemoryEstimate], room: float, largest: int
) -> tuple[int, MemoryEstimate]:
    """The smallest split (1, 2, 4, ... up to `largest`: micro-batches of one sample)
    whose estimate fits in `room` bytes, and that estimate (the last one tried when
    none fits)."""
    factor = 1
    while True:
        estimate = estimate_for(factor)
        if estimate.peak <= room or factor >= largest:
            return factor, estimate
        factor = min(factor * 2, largest)


def start_estimate(options: LearnerOptions, step: Step) -> None:
    """A fit's first step, on an accelerator: log one step's estimate and, under
    `grads_accumulation("auto")` with no split yet, start from the smallest split whose
    estimate fits the device's free memory with a margin (the out-of-memory retry stays
    for what the estimate misses). A model the estimate cannot run is trained as
    before, with a line saying why."""
    optim, device = options.optimization, options.device
    batch = step.batches[0]
    batch = getattr(batch, "batch", batch) if type(batch).__name__ == "StandIn" else batch
    try:
        estimate = learner_estimate(options, batch)
    except Exception as error:  # the estimate is advice: the run goes on without it
        log.info("No memory estimate of the training step: %s", error)
        return
    found = memory.device_memory(device)
    free = f" ({size_text(found[0])} free of {size_text(found[1])})" if found else ""
    log.info("Memory estimate of one training step on %s%s: %s", device, free, estimate)
    if optim.micro_split != 1 or found is None:
        return
    resident = resident_bytes(options.model, optim.optimizer, device)
    room = found[0] * (1 - MARGIN) + resident
    largest = max(step.sizes, default=1)
    try:
        split, chosen = fitting_split(lambda k: learner_estimate(options, batch, k), room, largest)
    except Exception as error:
        log.info("grads_accumulation('auto') starts unsplit: %s", error)
        return
    if split == 1:
        return
    optim.micro_split = split
    log.info(
        "grads_accumulation('auto'): a whole batch's step is estimated at %s, more than the "
        "%s free on %s with %d%% kept free: every batch is split into %d micro-batches from "
        "the start (estimated peak %s; gradients accumulated: the same update). A step that "
        "still runs out of memory is split further.",
        size_text(estimate.peak),
        size_text(found[0]),
        device,
        round(MARGIN * 100),
        split,
        size_text(chosen.peak),
    )


def state_figures(
    model: torch.nn.Module, optimizer: Any, device: torch.device
) -> tuple[int, int, int]:
    """The bytes of the parameters (with the buffers), of their gradients, and of the
    optimizer state after a step (one optimizer step on fake copies of the parameters on
    `device`; 0 when the optimizer cannot be stepped so)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _disable_current_modes

    tensors = [*model.parameters(), *model.buffers()]
    params = sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    optimizers = list(optimizer.values()) if isinstance(optimizer, Mapping) else [optimizer]
    state = 0
    with _disable_current_modes():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = {
            id(p): torch.nn.Parameter(fake_tensor(mode, p.detach(), device), p.requires_grad)
            for p in model.parameters()
        }
        with mode:
            for each in optimizers:
                try:
                    fake = fake_optimizer(each, fakes)
                    make_state([p for g in fake.param_groups for p in g["params"]], fake)
                except Exception:  # an optimizer that cannot be copied: its state not counted
                    continue
                state += state_bytes(fake, device)
    return params, grads, state


def check_states_fit(
    model: torch.nn.Module,
    optimizer: Any,
    device: torch.device,
    fsdp: FsdpOptions | None,
    world: int,
) -> None:
    """Refuse a model whose parameters, gradients and optimizer state alone (one
    process's share under FSDP) exceed `device`'s memory, naming the figures and what
    would fit."""
    found = memory.device_memory(device)
    if found is None:
        return
    total = found[1]
    params, grads, state = state_figures(model, optimizer, device)
    whole = params + grads + state
    shards = world if fsdp is not None else 1
    share = math.ceil(whole / shards)
    if share <= total:
        return
    processes = math.ceil(whole / (total * (1 - MARGIN)))
    each = "per process" if shards > 1 else ""
    fixes = [
        f"FSDP over {processes} processes (devices([...{processes} devices], strategy='fsdp')): "
        f"{size_text(whole / processes)} per process"
    ]
    if any(p.dtype == torch.float32 for p in model.parameters()):
        half = size_text(share / 2)
        fixes.insert(
            0,
            f"the weights in bfloat16 (model.to(torch.bfloat16)): {half}{' ' + each if each else ''}"
            " (mixed_precision('bf16') alone keeps float32 weights: it halves the activations, "
            "not these)",
        )
    listing = "".join(f"\n  - {fix}" for fix in fixes)
    raise ConfigError(
        f"{type(model).__name__} does not fit {device} ({size_text(total)}): its parameters "
        f"({size_text(params)}), their gradients ({size_text(grads)}) and the optimizer state "
        f"({size_text(state)}) take {size_text(share)}{' ' + each if each else ''} before any "
        f"activation. What would fit:{listing}\nA smaller batch does not help here: none of "
        "these depend on it (it shrinks the activations, once these fit)."
    )


def check_host_fit(
    model: torch.nn.Module,
    optimizer: Any,
    fsdp: FsdpOptions | None,
    world: int,
    found: tuple[int, int],
) -> None:
    """On the CPU, before the model is moved there: refuse a model whose parameters,
    gradients and optimizer state (one process's share under FSDP) need more than the
    memory the machine has available (`found`: its available and total bytes; what the
    model holds in host memory already counts as available to it), naming the figures
    and what would fit."""
    available, total = found
    params, grads, state = state_figures(model, optimizer, torch.device("cpu"))
    tensors = [*model.parameters(), *model.buffers()]
    held = sum(
        {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in tensors
            if t.device.type == "cpu"
        }.values()
    )
    whole = params + grads + state
    shards = world if fsdp is not None else 1
    share = math.ceil(whole / shards)
    room = available + held
    if share <= room:
        return
    each = " per process" if shards > 1 else ""
    fixes = []
    if any(p.dtype == torch.float32 for p in model.parameters()) and share / 2 <= room:
        fixes.append(
            f"the weights in bfloat16 (model.to(torch.bfloat16)): {size_text(share / 2)}{each} "
            "(mixed_precision('bf16') alone keeps float32 weights: it halves the activations, "
            "not these)"
        )
    plain = math.ceil((params + grads) / shards)
    if state and plain <= room:
        fixes.append(
            f"an optimizer that keeps no state (SgdConfig() without momentum): "
            f"{size_text(plain)}{each}"
        )
    machines = max(2, math.ceil(whole / max(1.0, available * (1 - MARGIN))))
    fixes.append(
        f"FSDP over {machines} machines like this one (one process each, "
        f"devices(['cpu'], strategy='fsdp') under torchrun --nnodes {machines}): "
        f"{size_text(whole / machines)} per machine"
    )
    already = f", {size_text(held)} of it in memory already" if held else ""
    listing = "".join(f"\n  - {fix}" for fix in fixes)
    raise ConfigError(
        f"{type(model).__name__} does not fit in the CPU's memory: its parameters "
        f"({size_text(params)}), their gradients ({size_text(grads)}) and the optimizer "
        f"state ({size_text(state)}) take {size_text(share)}{each} before any activation"
        f"{already}, and the machine has {size_text(available)} available (of "
        f"{size_text(total)}). What would fit:{listing}\nA smaller batch does not help "
        "here: none of these depend on it (it shrinks the activations, once these fit)."
    )
