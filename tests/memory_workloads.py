"""Workloads for the memory estimate, and the reference it is checked against: the
live-bytes high-water mark of one real training step on the CPU (`memory_cap.MemoryCap`
counts every storage an op creates until it is freed), plus what is live before the
step (parameters, buffers, optimizer state, the batch), which the estimate counts too.

An MLP, a CNN (convolutions and BatchNorm) and a small transformer language model, each
in a small size for the tests and a larger one for `bench/memory_estimate.py`."""

from __future__ import annotations

from typing import Any

import torch
from memory_cap import MemoryCap
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn import functional as F

from ember.train import ClassificationOutput, TrainOutput
from ember.train.oom import split_batch


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
            nn.Linear(width, 10),
        )  # fmt: skip

    def train_step(self, batch: Any) -> TrainOutput:
        x, y = batch
        out = self.net(x)
        return TrainOutput(ClassificationOutput(F.cross_entropy(out, y), out, y))


class Cnn(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.LazyLinear(10),
        )  # fmt: skip

    def train_step(self, batch: Any) -> TrainOutput:
        x, y = batch
        out = self.net(x)
        return TrainOutput(ClassificationOutput(F.cross_entropy(out, y), out, y))


class TinyLm(nn.Module):
    """A causal transformer language model: embedding, encoder layers under a causal
    mask, a head over the vocabulary."""

    def __init__(self, width: int, layers: int, vocab: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def train_step(self, batch: Any) -> TrainOutput:
        tokens = batch
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        mask = nn.Transformer.generate_square_subsequent_mask(inputs.shape[1])
        hidden = self.blocks(self.embed(inputs), mask=mask, is_causal=True)
        logits = self.head(hidden).flatten(0, 1)
        targets = targets.flatten()
        return TrainOutput(ClassificationOutput(F.cross_entropy(logits, targets), logits, targets))


def workload(name: str, large: bool = False) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """The model, an optimizer over it (Adam: two states a parameter), and a batch."""
    torch.manual_seed(0)
    model: nn.Module
    if name == "mlp":
        model = Mlp(1024 if large else 256)
        batch: Any = (
            torch.randn(512 if large else 64, 64),
            torch.randint(0, 10, (512 if large else 64,)),
        )
    elif name == "cnn":
        model = Cnn(32 if large else 8)
        size = 64 if large else 16
        batch = (torch.randn(size, 3, 32, 32), torch.randint(0, 10, (size,)))
        model.train_step(batch)  # the lazy layer takes its shape
        model.zero_grad(set_to_none=True)
    else:
        model = TinyLm(256 if large else 64, 4 if large else 2)
        batch = torch.randint(0, 512, (16 if large else 4, 129 if large else 33))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), batch


def real_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, dtype: Any, split: int = 1
) -> None:
    """One training step as ember runs it: for each of `split` micro-batches, forward
    under autocast with mixed precision and backward of its share of the loss; the
    optimizer step, the gradients cleared."""
    pieces = split_batch(batch, split)
    where = next(model.parameters()).device.type
    for piece in pieces:
        with torch.autocast(where, dtype=dtype, enabled=dtype is not None):
            loss = model.train_step(piece).loss  # type: ignore[operator]
        (loss / len(pieces)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def storages_before(model: nn.Module, optimizer: Any, batch: Any) -> list[torch.UntypedStorage]:
    """The storages live before a step: parameters, buffers, optimizer state, the batch."""
    tensors = [*model.parameters(), *model.buffers(), *torch.utils._pytree.tree_leaves(batch)]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    return [t.untyped_storage() for t in tensors if isinstance(t, torch.Tensor)]


def measured_peak(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    dtype: Any = None,
    split: int = 1,
) -> int:
    """The peak bytes of a real step after the first (the optimizer state exists): the
    high-water mark of the live storages, those live before the step (parameters,
    buffers, optimizer state, the batch) counted from the start, once each (an in-place
    op returns them again)."""
    real_step(model, optimizer, batch, dtype, split)  # the optimizer makes its state
    counter = MemoryCap()
    for storage in storages_before(model, optimizer, batch):
        counter.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
    with counter:
        real_step(model, optimizer, batch, dtype, split)
    return counter.peak


def cuda_peak(
    model: nn.Module, optimizer: Any, batch: Any, dtype: Any = None, split: int = 1
) -> int:
    """`measured_peak` on CUDA, from the caching allocator (`max_memory_allocated`) over
    a step after the first, less what was allocated before it that the estimate does not
    count (the cuBLAS workspaces, other tests' leftovers)."""
    real_step(model, optimizer, batch, dtype, split)  # the state, the workspaces
    torch.cuda.synchronize()
    known = {
        storage.data_ptr(): -(-storage.nbytes() // 512) * 512
        for storage in storages_before(model, optimizer, batch)
        if storage.device.type == "cuda"
    }
    unknown = torch.cuda.memory_allocated() - sum(known.values())
    torch.cuda.reset_peak_memory_stats()
    real_step(model, optimizer, batch, dtype, split)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - unknown
