"""Items and their state trees: what is recorded for an item (`item_state`) and putting a
decoded record back into its target (`restore`): a module, an optimizer, a stateful object
or none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ember.errors import ConfigError, RecordError
from ember.record.header import KINDS, Kind, Record
from ember.record.tree import map_tensors

MAX_REPORTED = 10
"""Most key problems listed in one error message."""

Device = torch.device | str | int | None


def item_state(item: Any, kind: Kind | None = None) -> tuple[Kind, Any]:
    """Return (kind, state tree) for `item`: a module, an optimizer, a stateful object or a tree.

    Modules and optimizers give their `state_dict()`, as does any other object with
    `state_dict()`/`load_state_dict()` (kind "state"); plain trees are recorded as they are.
    `kind` overrides the inferred kind (e.g. "state" to store a module's weights losslessly).
    """
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
    inferred: Kind
    if isinstance(item, torch.nn.Module):
        inferred, tree = "module", item.state_dict()
    elif isinstance(item, torch.optim.Optimizer):
        inferred, tree = "optimizer", item.state_dict()
    elif _is_stateful(item):
        inferred, tree = "state", item.state_dict()
    else:
        inferred, tree = "state", item
    chosen = kind or inferred
    if chosen in ("module", "optimizer") and not isinstance(tree, Mapping):
        raise ConfigError(f"a {chosen} record needs a state dict, not a {type(tree).__name__}")
    return chosen, tree


def _is_stateful(item: Any) -> bool:
    if isinstance(item, (Mapping, list, tuple, torch.Tensor, np.ndarray, str, bytes)):
        return False
    return callable(getattr(item, "state_dict", None)) and callable(
        getattr(item, "load_state_dict", None)
    )


def restore(record: Record, target: Any, path: Path, device: Device = None) -> Any:
    """Load `record` into `target` and return the target, or the decoded tree for None/dict.

    Module targets load in place with every tensor cast to the module's own dtype and device
    (`device` is not used); optimizers and other objects get `load_state_dict` with tensors
    on `device` if given (optimizers then move state next to their parameters themselves).
    """
    kind, tree = record.header.kind, record.tree
    if target is None or isinstance(target, dict):
        return _to_device(tree, device)
    if isinstance(target, torch.nn.Module):
        _require(kind in ("module", "state") and isinstance(tree, dict), record, target, path)
        load_module(target, tree, path)
        return target
    if isinstance(target, torch.optim.Optimizer):
        _require(kind in ("optimizer", "state") and isinstance(tree, dict), record, target, path)
    elif callable(getattr(target, "load_state_dict", None)):
        _require(kind == "state", record, target, path)
    else:
        raise RecordError(
            f"cannot load {path} into a {type(target).__name__}: the target must be None, "
            "a dict, a torch.nn.Module, an optimizer or an object with load_state_dict()"
        )
    try:
        target.load_state_dict(_to_device(tree, device))
    except Exception as exc:
        raise RecordError(
            f"{path} does not fit the {type(target).__name__}: {type(exc).__name__}: {exc}"
        ) from exc
    return target


def load_module(module: torch.nn.Module, state: Mapping[Any, Any], path: Path) -> None:
    """Load `state` into `module` in place after checking keys and shapes against it."""
    expected = module.state_dict(keep_vars=True)
    problems = [
        f"missing key {key!r} (the model has it, the record does not)"
        for key in expected
        if key not in state
    ]
    problems += [
        f"unexpected key {key!r} (the record has it, the model does not)"
        for key in state
        if key not in expected
    ]
    converted: dict[str, Any] = {}
    for key, want in expected.items():
        if key not in state:
            continue
        got = state[key]
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                problems.append(f"key {key!r} holds a {type(got).__name__}, not a tensor")
                continue
            if got.shape != want.shape:
                problems.append(
                    f"shape mismatch for {key!r}: the record has {tuple(got.shape)}, "
                    f"the model has {tuple(want.shape)}"
                )
                continue
            try:
                got = got.to(device=want.device, dtype=want.dtype)
            except Exception as exc:
                problems.append(f"key {key!r} cannot become {want.dtype} on {want.device}: {exc}")
                continue
        converted[key] = got
    if problems:
        shown = problems[:MAX_REPORTED]
        if len(problems) > MAX_REPORTED:
            shown.append(f"... and {len(problems) - MAX_REPORTED} more")
        raise RecordError(
            f"{path} does not fit the {type(module).__name__}:\n  " + "\n  ".join(shown)
        )
    try:
        module.load_state_dict(converted, strict=True)
    except Exception as exc:
        raise RecordError(
            f"{path} does not fit the {type(module).__name__}: {type(exc).__name__}: {exc}"
        ) from exc


def _require(ok: bool, record: Record, target: Any, path: Path) -> None:
    if not ok:
        raise RecordError(
            f"{path} holds a {record.header.kind} record, which cannot be loaded into "
            f"a {type(target).__name__}"
        )


def _to_device(tree: Any, device: Device) -> Any:
    if device is None:
        return tree
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise RecordError(f"invalid device {device!r}: {exc}") from exc
    return map_tensors(tree, lambda t: t.to(dev))
