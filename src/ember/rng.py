"""Capturing and restoring every random number generator a run uses (exact resume)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's `random`, NumPy's global generator, torch's CPU and CUDA
    generators, as plain data (lists, ints, tensors) any recorder can store."""
    version, internal, gauss = random.getstate()
    key, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "key": str(key),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [state for state in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the generators captured by `capture_rng_state`."""
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(v) for v in py["state"]), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"]
    keys = keys.cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state(
        (
            npy["key"],
            keys.astype(np.uint32),
            int(npy["pos"]),
            int(npy["has_gauss"]),
            float(npy["cached_gaussian"]),
        )
    )
    torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu().to(torch.uint8) for s in state["cuda"]])
