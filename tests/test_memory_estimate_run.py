"""What a run does with the memory estimate, on CPU stand-ins for an accelerator (the
device check and its free and total memory patched; `memory_cap.MemoryCap` as the
device): grads_accumulation("auto") starts from the split whose estimate fits, with no
failed attempt; fit logs the estimate; build() refuses a model whose parameters,
gradients and optimizer state alone exceed the device."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from memory_cap import MemoryCap
from test_oom_capped import Mlp, by_hand, data
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from ember.errors import ConfigError
from ember.train import LearnerBuilder, RegressionOutput, TrainOutput, memory
from ember.train.renderer import PlainRenderer

CAP = 1_300_000


@pytest.fixture
def accelerator(monkeypatch):
    """The CPU taken for an accelerator with `memory["free"]` and `memory["total"]`
    bytes, or, with `memory["device"]` set, the memory of that stand-in."""
    figures: dict = {"free": CAP, "total": CAP, "device": None}

    def device_memory(device):
        stand_in = figures["device"]
        if stand_in is not None:
            return int(stand_in.cap - stand_in.live_bytes()), int(stand_in.cap)
        return figures["free"], figures["total"]

    monkeypatch.setattr(memory, "accelerator", lambda device: True)
    monkeypatch.setattr(memory, "device_memory", device_memory)
    return figures


def device_with(model: nn.Module, room: int) -> MemoryCap:
    """A stand-in device holding `model`'s parameters, with `room` bytes more."""
    params = [p.untyped_storage() for p in model.parameters()]
    stand_in = MemoryCap(room + sum(storage.nbytes() for storage in params))
    for storage in params:
        stand_in.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
    return stand_in


def builder(tmp_path):
    return LearnerBuilder(tmp_path, overwrite=True).renderer(
        PlainRenderer(interval=3600, stream=io.StringIO())
    )


def test_auto_starts_from_the_split_whose_estimate_fits_with_no_failed_attempt(
    tmp_path, accelerator
):
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    learner = builder(tmp_path).grads_accumulation("auto").build(model, optimizer, 0.01)
    stand_in = accelerator["device"] = device_with(model, CAP)
    with stand_in:
        learner.fit(data())
    assert learner.outcome == "completed"
    split = learner.optim.micro_split
    assert split is not None and split >= 4  # the whole batch of 512 does not fit
    assert stand_in.failures == 0 and stand_in.peak <= stand_in.cap
    log = (tmp_path / "experiment.log").read_text()
    assert f"every batch is split into {split} micro-batches from the start" in log
    assert "Memory estimate of one training step on cpu" in log
    assert "Out of memory" not in log
    for a, b in zip(model.parameters(), by_hand(split).parameters()):
        torch.testing.assert_close(a, b)


def test_auto_keeps_whole_batches_when_they_fit(tmp_path, accelerator):
    accelerator["free"] = 100 * CAP
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    learner = builder(tmp_path).grads_accumulation("auto").build(model, optimizer, 0.01)
    learner.fit(data(steps=1))
    assert learner.optim.micro_split == 1
    assert "from the start" not in (tmp_path / "experiment.log").read_text()


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 1)

    def train_step(self, batch):
        x, y = batch
        out = self.layer(x[x[:, 0] > -10])  # a shape that depends on the values
        return TrainOutput(RegressionOutput(nn.functional.mse_loss(out, y), out, y))


def test_a_step_the_estimate_cannot_run_trains_as_before_saying_why(tmp_path, accelerator):
    model = Masked()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    learner = builder(tmp_path).grads_accumulation("auto").build(model, optimizer, 0.01)
    learner.fit(data(steps=2, batch=8))
    assert learner.outcome == "completed" and learner.optim.micro_split == 1
    log = (tmp_path / "experiment.log").read_text()
    assert "No memory estimate of the training step" in log
    assert "depend on the data's values" in log


class Wide(nn.Sequential):
    def train_step(self, batch):
        out = self(batch[0])
        return TrainOutput(RegressionOutput(nn.functional.mse_loss(out, batch[1]), out, batch[1]))


def test_build_refuses_a_model_whose_states_exceed_the_device(tmp_path, accelerator):
    model = Wide(nn.Linear(256, 256), nn.Linear(256, 256))  # 526,336 bytes
    params = sum(p.numel() * 4 for p in model.parameters())
    accelerator["total"] = 3 * params  # room for weights and gradients, not Adam's state
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(ConfigError) as raised:
        builder(tmp_path).build(model, optimizer, 1e-3)
    message = str(raised.value)
    processes = math.ceil(4 * params / (3 * params * 0.9))
    assert "Wide does not fit cpu (1.51 MiB)" in message
    assert "parameters (514.00 KiB)" in message and "gradients (514.00 KiB)" in message
    assert "optimizer state (1.00 MiB)" in message and "take 2.01 MiB" in message
    assert f"FSDP over {processes} processes" in message
    assert "bfloat16 (model.to(torch.bfloat16)): 1.00 MiB" in message
    assert "A smaller batch does not help" in message
    # plain SGD keeps no state: the weights and gradients fit
    builder(tmp_path).build(model, torch.optim.SGD(model.parameters(), lr=0.1), 0.1)


def test_a_plain_fit_on_the_cpu_imports_no_estimate(tmp_path):
    script = f"""
import io, sys, torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.renderer import PlainRenderer
class M(nn.Linear):
    def train_step(self, batch):
        out = self(batch[0])
        return TrainOutput(RegressionOutput(nn.functional.mse_loss(out, batch[1]), out, batch[1]))
model = M(4, 1)
learner = (LearnerBuilder({str(tmp_path)!r}, overwrite=True).grads_accumulation("auto")
    .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
    .build(model, torch.optim.SGD(model.parameters(), lr=0.1)))
learner.fit([(torch.randn(8, 4), torch.randn(8, 1))])
print(sorted(m for m in sys.modules if "memory_estimate" in m or "mem_tracker" in m))
"""
    src = Path(__file__).resolve().parents[1] / "src"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
