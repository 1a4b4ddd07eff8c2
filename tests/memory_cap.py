"""A CPU stand-in for a device with little memory: a dispatch mode that counts the
bytes of every storage an op creates until it is freed, and fails any op after which
more than `cap` bytes are live (`torch.OutOfMemoryError`, as CUDA's allocator raises).
Tensors made before the mode (weights, data) are not counted: `cap` is what a step may
add to them. `peak` is the high-water mark of what ops left live (a failed op's is not kept)."""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class MemoryCap(TorchDispatchMode):
    def __init__(self, cap: float = float("inf")) -> None:
        super().__init__()
        self.cap = cap
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.failures = 0

    def live_bytes(self) -> int:
        for key in [key for key, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[key]
        return sum(size for _, size in self.live.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        out = func(*args, **(kwargs or {}))
        self.live_bytes()  # forget the freed storages first: their addresses are reused
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
        live = sum(size for _, size in self.live.values())
        if live > self.cap:
            self.failures += 1
            del out, tensor  # the op's outputs are not kept: its memory is not there
            raise torch.OutOfMemoryError(
                f"stand-in device: {func} would leave {live:,} bytes live, over the cap of "
                f"{self.cap:,}"
            )
        self.peak = max(self.peak, live)
        return out
