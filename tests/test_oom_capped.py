"""Out of memory on a stand-in device that fails any op past a byte cap
(`memory_cap.MemoryCap`): in the forward pass, the backward pass, the optimizer step.
`grads_accumulation("auto")` splits until the step fits and ends equal to hand
accumulation with the final split; an error that ends a run names the part of the
step it came from."""

from __future__ import annotations

import io

import pytest
import torch
from memory_cap import MemoryCap
from torch import nn
from torch.nn import functional as F

from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.callbacks import Callback
from ember.train.renderer import PlainRenderer


class Mlp(nn.Module):
    """The H100 case scaled down: wide hidden layers, one output, a batch whose
    activations are most of a step's memory."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
        )

    def train_step(self, batch):
        x, y = batch
        out = self.net(x)
        return TrainOutput(RegressionOutput(F.mse_loss(out, y), out, y))


def data(steps: int = 4, batch: int = 512):
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(batch, 16, generator=generator), torch.randn(batch, 1, generator=generator))
        for _ in range(steps)
    ]


class Probe(Callback):
    """Reads the stand-in's live bytes when the fit starts, and its peak when the first
    forward and backward passes end."""

    def __init__(self, stand_in: MemoryCap) -> None:
        self.stand_in = stand_in
        self.at: dict[str, int] = {}

    def on_fit_start(self, ctx) -> None:
        self.at.setdefault("start", self.stand_in.live_bytes())

    def on_before_backward(self, ctx) -> None:
        self.at.setdefault("forward", self.stand_in.peak)

    def on_before_optimizer_step(self, ctx) -> None:
        self.at.setdefault("backward", self.stand_in.peak)


def fit(tmp_path, cap: float, auto: bool = True, adam: bool = False, batch=512, probe=None):
    model = Mlp()
    stand_in = MemoryCap(cap)
    builder = LearnerBuilder(tmp_path, overwrite=True).renderer(
        PlainRenderer(interval=3600, stream=io.StringIO())
    )
    if auto:
        builder = builder.grads_accumulation("auto")
    if probe is not None:
        builder = builder.callback(probe(stand_in))
    optimizer = (
        torch.optim.Adam(model.parameters(), lr=0.01)
        if adam
        else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )
    learner = builder.build(model, optimizer, 0.01)
    with stand_in:
        learner.fit(data(batch=batch))
    return learner, model, stand_in


def measured(tmp_path, batch: int = 512) -> dict[str, int]:
    """Live bytes at the start of the fit, and the peaks of the first forward pass and
    of the first step up to the optimizer's (before its state is made)."""
    probes = []

    def probe(stand_in):
        probes.append(Probe(stand_in))
        return probes[-1]

    fit(tmp_path / "measure", float("inf"), auto=False, batch=batch, probe=probe)
    return probes[0].at


def by_hand(split: int):
    """Each batch of 512 cut into `split` micro-batches, their losses weighted by their
    share of the batch, gradients accumulated, one step per batch."""
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for x, y in data():
        for xs, ys in zip(torch.tensor_split(x, split), torch.tensor_split(y, split)):
            (F.mse_loss(model.net(xs), ys) * (len(xs) / len(x))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def test_a_capped_device_is_split_until_the_step_fits_and_equals_hand_accumulation(tmp_path):
    learner, model, stand_in = fit(tmp_path, cap=1_300_000)
    assert learner.outcome == "completed"
    split = learner.optim.micro_split
    assert split is not None and split >= 4 and stand_in.failures >= 2
    assert stand_in.peak <= 1_300_000
    log = (tmp_path / "experiment.log").read_text()
    assert f"every batch is now split into {split} micro-batches" in log
    for a, b in zip(model.parameters(), by_hand(split).parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("part", "auto", "batch", "phase"),
    [
        ("start", False, 512, "the forward pass (train_step)"),
        ("start", True, 512, "the forward pass (train_step)"),
        ("forward", False, 512, "the backward pass"),
        ("backward", False, 8, "the optimizer step"),
    ],
)
def test_an_out_of_memory_error_that_ends_a_run_names_the_part_of_the_step(
    tmp_path, part, auto, batch, phase
):
    """A cap just over what is live where a part begins fails that part: the forward
    pass (with "auto", once batches of one sample do not fit), the backward pass, the
    optimizer step (Adam's state, made at its first step, on a batch small enough for
    the state to be the larger part)."""
    cap = measured(tmp_path, batch)[part] + 4096
    with pytest.raises(torch.OutOfMemoryError) as raised:
        fit(tmp_path / "run", cap=cap, auto=auto, adam=part == "backward", batch=batch)
    note = "\n".join(raised.value.__notes__)
    assert f"ember: out of memory in {phase} at epoch 1, iteration 1" in note, note
    assert ("grads_accumulation('auto') split every batch into" in note) == auto
