"""The checks `LearnerBuilder.build` makes of the options together with the model: the
model itself, options that do not go together, the device, resuming and checkpointing.
Each one fails before training with the fix in its message."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from ember.errors import ConfigError
from ember.train import memory
from ember.train.checkpoint.file import FileCheckpointer, other_checkpoint_formats
from ember.train.files.artifacts import Artifacts
from ember.train.manual import check_automatic, check_manual
from ember.train.optimization import needs_closure
from ember.train.step import check_steps
from ember.train.structure import check_loose_modules, check_train_methods

if TYPE_CHECKING:
    from ember.record.protocol import Recorder
    from ember.train.checkpoint.base import Checkpointer
    from ember.train.length.duration import Duration
    from ember.train.optimization import Optimization
    from ember.train.parallel import FsdpOptions


def check_model(model: Any, optimizer: Any, lr: Any) -> list[str]:
    """A module, not wrapped by `torch.compile`, whose steps fit the optimization (one
    optimizer, or a dict of them that its own `train_step` drives), with torch's
    `train(mode)` and its layers registered (`ember.train.structure`); returns a
    warning for each container of layers that would not train."""
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"build() needs a torch.nn.Module, got {type(model).__name__}.")
    if hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":
        raise ConfigError(
            "build() got a model wrapped by torch.compile(model): its steps would run "
            "uncompiled and its checkpoints would carry '_orig_mod.' keys. Pass the model "
            "itself and ask for compilation with LearnerBuilder.compile(**options)."
        )
    check_train_methods(model)
    warnings = check_loose_modules(model, optimizer)
    check_steps(model)
    if isinstance(optimizer, Mapping):
        check_manual(model, optimizer, lr)
    else:
        check_automatic(model)
    return warnings


def check_closures(
    optimization: Optimization, accumulation: int, micro_auto: bool, mixed_precision: str | None
) -> None:
    """An optimizer whose step takes a closure (L-BFGS) re-evaluates one batch's loss
    within its step: refused with gradient accumulation and with fp16's loss scaling,
    which cannot work with it."""
    optimizers = getattr(optimization, "optimizers", {"": optimization.optimizer})
    for name, optimizer in optimizers.items():
        if not needs_closure(optimizer):
            continue
        what = (
            f"{type(optimizer).__name__}{f' ({name!r})' if name else ''} steps with a closure "
            "that evaluates the loss again, several times a step (optimizer.step(closure))"
        )
        if accumulation > 1 or micro_auto:
            raise ConfigError(
                f"{what}: each evaluation is the forward and backward of one batch, so it "
                "cannot accumulate the gradients of several batches. Leave "
                "grads_accumulation(...) out and give the step larger batches instead."
            )
        if mixed_precision == "fp16":
            raise ConfigError(
                f"{what}, and the gradient scaler of mixed_precision('fp16') cannot step "
                "with a closure (torch's GradScaler refuses one). Use mixed_precision('bf16'), "
                "which needs no scaler, or full precision."
            )


def check_precision(fsdp: FsdpOptions | None, mixed_precision: str | None) -> None:
    if fsdp is not None and mixed_precision == "fp16":
        raise ConfigError(
            "mixed_precision('fp16') needs a gradient scaler that FSDP's sharded gradients "
            "do not support here: use mixed_precision('bf16'), or FSDP's own "
            "devices(..., strategy='fsdp', mixed_precision='bf16')."
        )


def check_sync_batchnorm(model: torch.nn.Module, world: int) -> None:
    """`sync_batchnorm()` needs several processes and a BatchNorm to share."""
    if world < 2:
        raise ConfigError(
            "sync_batchnorm() shares the BatchNorm statistics between processes, but this "
            "run has one. List several devices (devices(['cuda:0', 'cuda:1'])), launch with "
            "torchrun, or drop sync_batchnorm()."
        )
    norms = (torch.nn.modules.batchnorm._BatchNorm,)
    if not any(isinstance(module, norms) for module in model.modules()):
        raise ConfigError(
            f"sync_batchnorm(): {type(model).__name__} has no BatchNorm layer "
            "(BatchNorm1d/2d/3d) whose statistics could be shared. Drop sync_batchnorm()."
        )


def check_processes(manual: bool, devices: Sequence[torch.device] | None, placement: Any) -> None:
    """Custom optimization runs on one process."""
    if manual and ((devices is not None and len(devices) > 1) or placement):
        raise ConfigError(
            "Custom optimization (a dict of optimizers) runs on one device: several "
            "processes are not supported with it. Train on one device."
        )


def check_micro_auto(manual: bool, fsdp: FsdpOptions | None) -> None:
    """grads_accumulation("auto") splits batches whose loss ember backpropagates, on
    one process or DDP replicas."""
    if manual:
        raise ConfigError(
            "grads_accumulation('auto') splits a batch and backpropagates each part, and "
            "custom optimization (a dict of optimizers) runs its own backward passes: "
            "use grads_accumulation(n) with a smaller batch size instead."
        )
    if fsdp is not None:
        raise ConfigError(
            "grads_accumulation('auto') runs on one process or DDP replicas, not on "
            "FSDP shards: FSDP gathers the parameters inside every forward pass, where a "
            "rank that runs out of memory would leave the others waiting. Set the split "
            "yourself (a smaller batch size with grads_accumulation(n)), or use DDP."
        )


def check_device(
    device: torch.device, memory_history: int | None, fsdp: FsdpOptions | None
) -> None:
    """The options that need a GPU, on the device this process trains on."""
    if memory_history is not None and device.type != "cuda":
        raise ConfigError(
            f"memory_history() records CUDA allocations, and this run trains on {device}: "
            "drop memory_history(), or train on a CUDA device (devices(['cuda:0']))."
        )
    if fsdp is not None and fsdp.cpu_offload and device.type == "cpu":
        raise ConfigError(
            "FSDP's cpu_offload=True keeps the shards of a model trained on GPUs in host "
            "memory; this run trains on the CPU, where they are already. Drop cpu_offload."
        )


def check_device_memory(
    model: torch.nn.Module, optimizer: Any, device: torch.device, fsdp: Any, world: int
) -> None:
    """The parameters, their gradients and the optimizer state (one process's share
    under FSDP) fit: on an accelerator, the device's memory; on the CPU, the memory the
    machine has available, before the model is moved there (`memory_estimate/fits.py`)."""
    if memory.accelerator(device):
        from ember.train.memory_estimate.fits import check_states_fit

        check_states_fit(model, optimizer, device, fsdp, world)
    elif device.type == "cpu":
        found = memory.host_memory()
        if found is None or states_bound(model) <= found[0]:
            return  # (a plain fit on the CPU imports no estimate)
        from ember.train.memory_estimate.fits import check_host_fit

        check_host_fit(model, optimizer, fsdp, world, found)


def states_bound(model: torch.nn.Module) -> int:
    """More bytes than a step's states can add to the host's memory: the parameters and
    buffers not in it yet, gradients of the trainable ones, and an optimizer state three
    times their size (Adam's with amsgrad)."""
    tensors = [*model.parameters(), *model.buffers()]
    away = sum(t.numel() * t.element_size() for t in tensors if t.device.type != "cpu")
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return away + 4 * trainable


def check_resume(
    resume_from: int | str | None,
    checkpointer: Checkpointer | None,
    artifact_dir: Path,
    recorder: Recorder | None,
) -> None:
    """`checkpoint(...)` names a checkpoint that `checkpointer` holds (or "auto" would
    not replace checkpoints of another format)."""
    if resume_from is None:
        return
    if checkpointer is None:
        raise ConfigError(
            "checkpoint() resumes from saved checkpoints, but no checkpointer is set: "
            "add with_file_checkpointer(recorder) with the recorder of the first run."
        )
    if resume_from == "auto":  # no checkpoint: a fresh run, unless that loses some
        other = other_checkpoint_formats(Artifacts(artifact_dir).checkpoints, recorder)
        if other and not checkpointer.epochs():
            raise ConfigError(
                f"checkpoint('auto'): the checkpoints in {checkpointer} were written in "
                f"another format ({other}), and a fresh run would replace them: resume "
                "with that recorder in with_file_checkpointer(...)."
            )
        return
    available = checkpointer.epochs()
    listing = ", ".join(map(str, available)) if available else "none"
    if resume_from == "latest" and available:
        return
    if resume_from != "latest" and resume_from in available:
        return
    what = (
        "there is no complete checkpoint"
        if resume_from == "latest"
        else f"there is no checkpoint of epoch {resume_from}"
    )
    saved = "" if resume_from == "latest" else f" (epochs saved: {listing})"
    raise ConfigError(
        f"checkpoint({resume_from!r}): {what} in {checkpointer}{saved}. "
        + resume_fix(available, artifact_dir, recorder)
    )


def resume_fix(available: list[int], artifact_dir: Path, recorder: Recorder | None) -> str:
    """The one thing that works from here: another recorder, another epoch, or a new run."""
    artifacts = Artifacts(artifact_dir)
    other = other_checkpoint_formats(artifacts.checkpoints, recorder)
    if other:
        return (
            f"The checkpoints there were written in another format ({other}): resume "
            "with that recorder in with_file_checkpointer(...)."
        )
    if available:
        return f"Resume with one of the epochs saved, e.g. checkpoint({available[-1]})."
    if any(artifacts.epoch_dirs(split) for split in ("train", "valid")):
        return (
            "The directory holds a run that saved no checkpoint: start it again with "
            "LearnerBuilder(dir, overwrite=True), or train in another directory."
        )
    return "Start without checkpoint()."


def check_checkpointing(
    checkpointer: Checkpointer | None,
    optimization: Optimization,
    train_for: Duration | None,
    every: tuple[int | None, float | None],
    every_count: Duration | None,
    fsdp: FsdpOptions | None,
) -> None:
    """The run's length, its schedule and its checkpoints go together."""
    length = train_for
    if length is not None and length.unit == "tokens" and optimization.lr.pending is not None:
        raise ConfigError(
            "The learning-rate schedule's length is 'auto' (the run's optimizer steps), but "
            f"the run trains for {length}, and how many optimizer steps that takes is only "
            "known once the tokens are counted. Give the schedule an explicit step count "
            "(e.g. num_iters=10_000), or train_for a number of steps or samples."
        )
    if checkpointer is None and (every != (None, None) or every_count):
        raise ConfigError(
            "checkpoint_every() writes checkpoints, but no checkpointer is set: add "
            "with_file_checkpointer(recorder)."
        )
    sharded = fsdp is not None and fsdp.sharded_checkpoints
    if sharded and checkpointer is not None and not isinstance(checkpointer, FileCheckpointer):
        raise ConfigError(
            "FSDP's sharded_checkpoints=True has each process write files of its own, "
            f"which {type(checkpointer).__name__} cannot hold: use "
            "with_file_checkpointer(recorder), or drop sharded_checkpoints."
        )
