"""Describing a run and a batch in words, for logs and error messages."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ember.data.device import describe
from ember.train.length.run_length import RunLength
from ember.train.optimization import Optimization
from ember.train.options import LearnerOptions
from ember.train.parallel.batchnorm import converts
from ember.train.renderer.base import RunInfo

__all__ = ["describe", "describe_run", "run_info"]


def run_info(
    options: LearnerOptions, model: Any, num_epochs: int, dist: Any, start: Any
) -> RunInfo:
    """What the renderers know of a run that starts at `start` (a `Position`)."""
    devices = options.devices
    return RunInfo(
        artifact_dir=str(options.artifact_dir),
        start_epoch=start.epoch,
        resumed=not start.fresh,
        start_iteration=start.iteration,
        num_epochs=num_epochs,
        model_name=model_name(model),
        num_parameters=sum(p.numel() for p in model.parameters()),
        devices=tuple(str(d) for d in devices)
        if dist is not None and devices and len(devices) > 1
        else (str(options.device),),
        metrics=tuple(
            (split, entry.name, entry.unit, entry.numeric)
            for split, entries in options.metrics.items()
            for entry in entries
        ),
        interrupter=options.interrupter,
    )


def model_name(model: Any) -> str:
    """The class name of the user's model (FSDP swaps the class for `FSDP<name>`)."""
    kind = type(model)
    if kind.__name__.startswith("FSDP") and len(kind.__bases__) == 2:
        return kind.__bases__[1].__name__
    return kind.__name__


def describe_run(
    options: LearnerOptions, optim: Optimization, dist: Any, length: RunLength, info: RunInfo
) -> str:
    """The first line of experiment.log: what is trained, where and how."""
    names = {
        split: ", ".join(entry.name for entry in entries) or "none"
        for split, entries in options.metrics.items()
    }
    extras = []
    if optim.mixed_precision:
        extras.append(f"mixed precision {optim.mixed_precision}")
    if optim.clip_norm is not None:
        extras.append(f"gradient norm clipped at {optim.clip_norm}")
    if optim.clip_value is not None:
        extras.append(f"gradient values clipped at {optim.clip_value}")
    recomputed = options.activation_checkpointing
    if recomputed:
        classes = ", ".join(kind.__name__ for kind in recomputed)
        extras.append(f"activation checkpointing ({classes})")
    compiled = options.compile
    if compiled is not None:
        given = ", ".join(f"{key}={value!r}" for key, value in compiled.items())
        extras.append(f"compiled ({given or 'torch.compile defaults'})")
    every = options.valid_every
    if every is not None:
        unit = "optimizer steps" if isinstance(every, int) else ""
        extras.append(f"validation every {every} {unit}".rstrip())
    for split, limit in zip(("train", "valid"), options.limit_batches):
        if limit is not None:
            share = f"{limit:.0%}" if isinstance(limit, float) else str(limit)
            extras.append(f"{split} limited to {share} of the batches of each epoch")
    if dist is not None:
        extras.append(
            f"{dist.world} processes ({dist.backend}, launched by {dist.launched_by}), rank 0 "
            "writes the artifacts"
        )
    if dist is not None and options.sync_batchnorm:
        extras.append(
            "BatchNorm statistics shared (SyncBatchNorm)"
            if converts(dist.device)
            else "BatchNorm running statistics of rank 0 (SyncBatchNorm needs GPUs)"
        )
    fsdp = options.fsdp
    if dist is not None and fsdp is not None:
        ties = "".join(f"; {note}" for note in getattr(dist.sharding, "notes", ()))
        extras.append(f"parameters sharded ({fsdp.name}; {fsdp.describe()}{ties})")
    if length.train_for is not None:  # the epochs shown are where the length should end
        extras.insert(0, f"training for {length.train_for} ({length.progress_text()} done)")
    accumulation = str(options.grads_accumulation)
    micro = optim.micro_split
    if micro is not None:
        accumulation = "auto" + (f" (batches in {micro})" if micro > 1 else "")
    return (
        f"Training {info.model_name} ({info.num_parameters:,} parameters) on "
        f"{', '.join(info.devices)}: epochs {info.start_epoch} to {info.num_epochs}, optimizer "
        f"{_named(optim.optimizer)}, lr {_named(optim.lr.scheduler)}, gradient "
        f"accumulation {accumulation}{''.join(', ' + e for e in extras)}; "
        f"metrics train [{names['train']}], valid [{names['valid']}]; python "
        f"{sys.version.split()[0]}, torch {torch.__version__}"
    )


def _named(part: Any) -> str:
    """An optimizer's or a schedule's class; several named ones describe themselves."""
    return str(getattr(part, "description", type(part).__name__))
