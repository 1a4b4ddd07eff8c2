"""What gets recorded for an item: its kind and the state tree to store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ember.errors import ConfigError
from ember.record.header import KINDS, Kind


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
