"""Describing a run and a batch in words, for logs and error messages."""

from __future__ import annotations

import sys
from typing import Any

import torch

from ember.data.device import describe
from ember.train.renderer.base import RunInfo

__all__ = ["describe", "describe_run", "run_info"]


def run_info(learner: Any, start: Any) -> RunInfo:
    """What the renderers know of a run that starts at `start` (a `Position`)."""
    return RunInfo(
        artifact_dir=str(learner.artifact_dir),
        start_epoch=start.epoch,
        resumed=not start.fresh,
        start_iteration=start.iteration,
        num_epochs=learner.num_epochs,
        model_name=model_name(learner.model),
        num_parameters=sum(p.numel() for p in learner.model.parameters()),
        devices=tuple(str(d) for d in learner.devices)
        if learner.dist is not None and learner.devices and len(learner.devices) > 1
        else (str(learner.device),),
        metrics=tuple(
            (split, entry.name, entry.unit, entry.numeric)
            for split, entries in learner.metrics.items()
            for entry in entries
        ),
        interrupter=learner.interrupter,
    )


def model_name(model: Any) -> str:
    """The class name of the user's model (FSDP swaps the class for `FSDP<name>`)."""
    kind = type(model)
    if kind.__name__.startswith("FSDP") and len(kind.__bases__) == 2:
        return kind.__bases__[1].__name__
    return kind.__name__


def describe_run(learner: Any, info: RunInfo) -> str:
    """The first line of experiment.log: what is trained, where and how."""
    names = {
        split: ", ".join(entry.name for entry in entries) or "none"
        for split, entries in learner.metrics.items()
    }
    optim = learner.optim
    extras = []
    if optim.mixed_precision:
        extras.append(f"mixed precision {optim.mixed_precision}")
    if optim.clip_norm is not None:
        extras.append(f"gradient norm clipped at {optim.clip_norm}")
    if optim.clip_value is not None:
        extras.append(f"gradient values clipped at {optim.clip_value}")
    recomputed = learner.options.activation_checkpointing
    if recomputed:
        classes = ", ".join(kind.__name__ for kind in recomputed)
        extras.append(f"activation checkpointing ({classes})")
    compiled = learner.options.compile
    if compiled is not None:
        options = ", ".join(f"{key}={value!r}" for key, value in compiled.items())
        extras.append(f"compiled ({options or 'torch.compile defaults'})")
    every = learner.options.valid_every
    if every is not None:
        unit = "optimizer steps" if isinstance(every, int) else ""
        extras.append(f"validation every {every} {unit}".rstrip())
    for split, limit in zip(("train", "valid"), learner.options.limit_batches):
        if limit is not None:
            share = f"{limit:.0%}" if isinstance(limit, float) else str(limit)
            extras.append(f"{split} limited to {share} of the batches of each epoch")
    dist = learner.dist
    if dist is not None:
        extras.append(f"{dist.world} processes ({dist.backend}), rank 0 writes the artifacts")
    fsdp = learner.options.fsdp
    if dist is not None and fsdp is not None:
        extras.append(f"parameters sharded (FSDP; {fsdp.describe()})")
    length = getattr(learner, "train_for", None)
    if length is not None:  # the epochs shown are where the length should end
        extras.insert(0, f"training for {length} ({learner.progress_text()} done)")
    accumulation = str(learner.grads_accumulation)
    split = optim.micro_split
    if split is not None:
        accumulation = "auto" + (f" (batches in {split})" if split > 1 else "")
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
