"""`sync_batchnorm()`: the BatchNorm statistics shared by the processes.

On GPUs each BatchNorm becomes a `torch.nn.SyncBatchNorm` (it keeps the parameters
and buffers, so the optimizer bound to them stays bound), which normalizes each batch
with the mean and variance of every process's batch. torch's SyncBatchNorm does not run
on the CPU (its forward refuses CPU tensors); there ember broadcasts rank 0's buffers
after each training forward instead, so every process validates, checkpoints and ends
with rank 0's running statistics, and each batch is normalized with its own.
"""

from __future__ import annotations

import torch
from torch import nn


def converts(device: torch.device) -> bool:
    """Whether torch's SyncBatchNorm runs on `device` (else the buffers are broadcast)."""
    return device.type != "cpu"


def sync_batchnorm(model: nn.Module, device: torch.device) -> bool:
    """Make the BatchNorm layers of `model` share their statistics; True when they
    became SyncBatchNorm, False when the buffers are to be broadcast (on the CPU)."""
    if not converts(device):
        return False
    nn.SyncBatchNorm.convert_sync_batchnorm(model)  # in place: the model has train_step
    return True


def broadcast_buffers(model: nn.Module) -> None:
    """Every process takes rank 0's buffers (running statistics)."""
    import torch.distributed as dist

    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
