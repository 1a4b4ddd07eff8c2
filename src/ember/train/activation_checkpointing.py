"""Activation checkpointing: chosen submodules keep no activations for the backward
pass and recompute them instead, trading compute for memory.

The modules are wrapped with PyTorch's non-reentrant checkpoint wrapper, which
recomputes under the same autocast state and random state as the forward pass (the
gradients are those of the plain model, dropout included), works under DDP, and keeps
the plain model's `state_dict` keys (its hooks strip the wrapper's
`_checkpoint_wrapped_module.` prefix), so checkpoints load into a model without it.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ember.errors import ConfigError

WRAPPED = "_checkpoint_wrapped_module"


def module_classes(classes: Any) -> tuple[type[torch.nn.Module], ...]:
    """`classes` (one class or a sequence of them) checked: torch.nn.Module subclasses."""
    found = (classes,) if isinstance(classes, type) else tuple(classes or ())
    bad = [c for c in found if not (isinstance(c, type) and issubclass(c, torch.nn.Module))]
    if not found or bad:
        raise ConfigError(
            "activation_checkpointing(module_classes=...) takes torch.nn.Module subclasses, "
            f"such as the model's transformer block class; got {classes!r}."
        )
    return found


def apply(model: torch.nn.Module, classes: Sequence[type[torch.nn.Module]]) -> int:
    """Wrap every submodule of `model` that is an instance of `classes` (the outermost
    ones: a match inside a wrapped module is recomputed with it); return how many."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    kinds = tuple(classes)
    names = ", ".join(c.__name__ for c in kinds)
    if isinstance(model, kinds):
        raise ConfigError(
            f"activation_checkpointing: the model itself is a {type(model).__name__}; name the "
            "classes of its submodules to recompute (its blocks or layers), not the model's."
        )
    chosen: list[torch.nn.Module] = []
    covered: set[int] = set()
    for _, module in model.named_modules():  # parents come before their children
        if id(module) in covered:
            continue
        if isinstance(module, kinds) and not hasattr(module, WRAPPED):
            chosen.append(module)
        if isinstance(module, kinds) or hasattr(module, WRAPPED):
            covered.update(id(sub) for sub in module.modules())
    if not chosen:
        already = any(hasattr(m, WRAPPED) for m in model.modules())
        hint = (
            " (its modules are already wrapped for checkpointing)"
            if already
            else ": check the classes named"
        )
        raise ConfigError(
            f"activation_checkpointing: {type(model).__name__} has no submodule of class "
            f"{names}{hint}."
        )
    ids = {id(module) for module in chosen}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda module: checkpoint_wrapper(
            module, checkpoint_impl=CheckpointImpl.NO_REENTRANT
        ),
        check_fn=lambda module: id(module) in ids,
    )
    return len(chosen)
