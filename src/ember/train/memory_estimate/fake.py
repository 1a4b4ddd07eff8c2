"""One training step run on fake tensors: the model, its optimizer and the batch are
copied as `FakeTensorMode` tensors of the run's device (shapes, dtypes and devices,
no data, no memory), and PyTorch's memory tracker (`MemTracker`) counts every storage
the step's ops create until it is freed, by category, at its peak. The real model,
optimizer and batch are only read. Everything torch-internal is imported here, when an
estimate is asked for: `import ember` does not pay for it."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable

import torch

from ember.train.memory_estimate.figures import MemoryEstimate, MemoryEstimateError
from ember.train.oom import split_batch

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16}

_WHY = (
    "Shapes that depend on the data's values (boolean masks, nonzero(), .item() in the "
    "step) and custom kernels without a meta implementation cannot run on fake tensors."
)


def same_device(tensor: torch.Tensor, device: torch.device) -> bool:
    return tensor.device.type == device.type and (
        device.index is None or tensor.device.index == device.index
    )


def fake_tensor(mode: Any, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` as a fake tensor on `device` (its shape, strides and dtype; no data)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if same_device(tensor, device):
        return mode.from_tensor(tensor)  # type: ignore[no-any-return]
    meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
    return FakeTensor(mode, meta, device)


def fake_model(mode: Any, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of `model` whose parameters, buffers and tensor attributes are fake."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        tensors = [*module._parameters.values(), *module._buffers.values()]
        tensors += [value for value in vars(module).values() if isinstance(value, torch.Tensor)]
        for tensor in tensors:
            if tensor is None or id(tensor) in memo:
                continue
            fake = fake_tensor(mode, tensor.detach(), device)
            if isinstance(tensor, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = fake
    try:
        copy_ = copy.deepcopy(model, memo)
    except Exception as error:
        raise MemoryEstimateError(
            f"The memory estimate runs the step on a copy of the model, and "
            f"{type(model).__name__} cannot be copied (copy.deepcopy: {error}). Make its "
            "attributes copyable, or estimate a model without them."
        ) from error
    copy_.train()
    return copy_


def fake_optimizer(optimizer: Any, fakes: dict[int, Any]) -> torch.optim.Optimizer:
    """An optimizer of `optimizer`'s type and settings over the fake parameters (`fakes`:
    the real parameters' ids to them); an ember optimizer config's is bound to them."""
    if hasattr(optimizer, "bind") and not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer.bind(list(fakes.values()), 1e-3)  # type: ignore[no-any-return]
    try:
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}}
            | {"params": [fakes[id(param)] for param in group["params"]]}
            for group in optimizer.param_groups
        ]
        return type(optimizer)(groups, **optimizer.defaults)
    except Exception as error:
        raise MemoryEstimateError(
            f"The memory estimate steps a copy of the optimizer, and {type(optimizer).__name__} "
            f"could not be made again from its param_groups and defaults ({error}). Estimate "
            "with a torch optimizer, or one whose constructor takes its defaults."
        ) from error


def fake_batch(mode: Any, batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor fake, on `device` (in dicts, lists, tuples, dataclasses)."""
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: fake_tensor(mode, t, device), batch)


def autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    """Autocast on `device` to `dtype` (mixed precision), or nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def check_device(device: torch.device) -> torch.device:
    """`device` with its index; refused where this torch cannot run it: autograd on
    fake tensors of a device needs that device's backend (not its memory)."""
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and not (backend is not None and backend.is_available()):
        raise MemoryEstimateError(
            f"The memory estimate runs the step on fake {device.type} tensors, and this torch "
            f"cannot run {device.type} (torch.{device.type}.is_available() is False): its "
            "autograd needs the device's backend, though not its memory. Estimate on a "
            "machine with the device, or on 'cpu' (the same ops, CPU kernels)."
        )
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def micro_batches(batch: Any, split: int, accumulation: int) -> list[Any]:
    """The batches of one step whose memory matters: the first two micro-batches of a
    split batch, or the batch twice when gradients are accumulated (from the second
    batch on, its activations meet the gradients the first left)."""
    if split > 1:
        return split_batch(batch, split)[:2]
    return [batch, batch] if accumulation > 1 else [batch]


def run_step(
    model: Any,
    optimizer: Any,
    pieces: list[Any],
    dtype: Any,
    device: Any,
    clip: float | None,
    tracker: Any,
) -> None:
    """What ember runs for a step: each micro-batch's `train_step` under autocast and
    the backward of its weighted loss, clipping, the optimizer step, the gradients cleared.
    The tracker's per-module figures (unused) are cleared before each micro-batch: it
    takes a second forward of the model for a second step."""
    for piece in pieces:
        tracker.reset_mod_stats()
        with autocast(device, dtype):
            loss = model.train_step(piece).loss
        (loss / len(pieces) if len(pieces) > 1 else loss).backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_state(params: Any, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state, as after a first step (zero gradients, one step)."""
    for param in params:
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def state_bytes(optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    storages = {
        id(value.untyped_storage()): value.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and same_device(value, device)
    }
    return sum(storages.values())


def on_fakes(what: Callable[[], Any], name: str) -> Any:
    """`what()`, its failures told as a `MemoryEstimateError` naming why."""
    from torch._subclasses import fake_tensor as fake

    try:
        return what()
    except MemoryEstimateError:
        raise
    except (fake.DataDependentOutputException, fake.DynamicOutputShapeException) as error:
        reason = f"its shapes depend on the data's values ({error})"
    except fake.UnsupportedOperatorException as error:
        reason = f"it runs an operator without a fake implementation ({error})"
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
    raise MemoryEstimateError(
        f"The memory estimate could not run {name} on fake tensors: {reason}. {_WHY} "
        "Measure a real step instead (torch.cuda.max_memory_allocated)."
    )


def estimate_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    device: torch.device,
    precision: str | None = None,
    split: int = 1,
    accumulation: int = 1,
    clip: float | None = None,
) -> MemoryEstimate:
    """The peak memory of one training step of `model` on `batch` (a step after the
    first: the optimizer state exists), on `device`, without running it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_leaves

    device = check_device(device)
    name = f"{type(model).__name__}.train_step"
    dtype = PRECISIONS.get(precision or "")
    with _disable_current_modes(), torch.enable_grad():  # nothing else sees the fakes
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        copy_ = fake_model(mode, model, device)
        fakes = {id(real): fake for real, fake in zip(model.parameters(), copy_.parameters())}
        fake_opt = fake_optimizer(optimizer, fakes)
        with mode:
            pieces = micro_batches(fake_batch(mode, batch, device), split, accumulation)
            on_fakes(
                lambda: make_state(copy_.parameters(), fake_opt), f"{type(optimizer).__name__}.step"
            )
            tracker = MemTracker()
            leaves = [leaf for leaf in tree_leaves(pieces) if isinstance(leaf, torch.Tensor)]
            tracker.track_external(copy_, fake_opt, *leaves)

            def tracked() -> None:
                with tracker:
                    run_step(copy_, fake_opt, pieces, dtype, device, clip, tracker)

            on_fakes(tracked, name)
            state = state_bytes(fake_opt, device)
        peaks = tracker.get_tracker_snapshot("peak")
    found = [s for d, s in peaks.items() if d.type == device.type]
    at_peak: dict[Any, int] = found[0] if found else {}
    kinds = _MemRefType
    opt = at_peak.get(kinds.OPT, 0)
    return MemoryEstimate(
        peak=int(at_peak.get("Total", 0)),
        parameters=at_peak.get(kinds.PARAM, 0) + at_peak.get(kinds.BUFFER, 0),
        gradients=at_peak.get(kinds.GRAD, 0),
        optimizer_state=min(opt, state),
        activations=at_peak.get(kinds.ACT, 0) + at_peak.get(kinds.OTH, 0),
        temporaries=at_peak.get(kinds.TEMP, 0) + max(0, opt - state),
        device=str(device),
        split=split,
    )
