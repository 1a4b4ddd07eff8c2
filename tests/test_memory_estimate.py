"""The memory estimate of a training step: its figures against the live-bytes
high-water mark of a real step (`memory_workloads.measured_peak`) on an MLP, a CNN and
a small transformer LM, fp32 and bf16; what it follows (mixed precision, micro-batches,
activation checkpointing); what it refuses; that it touches nothing."""

from __future__ import annotations

import io

import pytest
import torch
from memory_workloads import measured_peak, workload
from torch import nn

from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
from ember.train.memory_estimate import MemoryEstimate, MemoryEstimateError
from ember.train.renderer import PlainRenderer

DTYPES = {None: None, "bf16": torch.bfloat16}


def learner(tmp_path, model, optimizer, precision=None, recompute=None):
    builder = LearnerBuilder(tmp_path, overwrite=True).renderer(
        PlainRenderer(interval=3600, stream=io.StringIO())
    )
    if precision is not None:
        builder = builder.mixed_precision(precision)
    if recompute is not None:
        builder = builder.activation_checkpointing(recompute)
    return builder.build(model, optimizer)


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "lm"])
def test_the_estimate_is_within_ten_percent_of_a_real_steps_peak(tmp_path, name, precision):
    model, optimizer, batch = workload(name)
    estimate = learner(tmp_path, model, optimizer, precision).memory_estimate(batch)
    model, optimizer, batch = workload(name)
    measured = measured_peak(model, optimizer, batch, DTYPES[precision])
    assert abs(estimate.peak - measured) <= 0.1 * measured, (estimate, measured)
    parts = (estimate.parameters, estimate.gradients, estimate.optimizer_state)
    assert sum(parts) + estimate.activations + estimate.temporaries == estimate.peak
    params = sum(p.numel() * 4 for p in model.parameters())
    assert estimate.parameters >= params  # (with the buffers)


def test_bf16_halves_what_the_activations_take(tmp_path):
    model, optimizer, batch = workload("lm")
    full = learner(tmp_path / "a", model, optimizer).memory_estimate(batch)
    half = learner(tmp_path / "b", model, optimizer, "bf16").memory_estimate(batch)
    assert half.activations < 0.85 * full.activations
    assert half.parameters == full.parameters  # autocast keeps float32 weights


def test_micro_batches_and_activation_checkpointing_are_followed(tmp_path):
    model, optimizer, batch = workload("lm")
    whole = learner(tmp_path / "a", model, optimizer).memory_estimate(batch)
    split = learner(tmp_path / "a", model, optimizer).memory_estimate(batch, split=4)
    assert split.split == 4 and "batch split into 4" in str(split)
    assert split.activations < 0.5 * whole.activations
    model, optimizer, batch = workload("lm")
    assert abs(split.peak - measured_peak(model, optimizer, batch, split=4)) <= 0.1 * split.peak
    model, optimizer, batch = workload("lm")
    recomputed = learner(tmp_path / "c", model, optimizer, recompute=nn.TransformerEncoderLayer)
    checkpointed = recomputed.memory_estimate(batch)
    assert checkpointed.peak < 0.8 * whole.peak
    measured = measured_peak(model, optimizer, batch)  # the same wrapped model, for real
    assert abs(checkpointed.peak - measured) <= 0.1 * measured, (checkpointed, measured)


def test_the_estimate_touches_neither_the_model_nor_the_optimizer(tmp_path):
    model, optimizer, batch = workload("mlp")
    before = [p.detach().clone() for p in model.parameters()]
    estimate = learner(tmp_path, model, optimizer).memory_estimate(batch)
    assert isinstance(estimate, MemoryEstimate)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters()) and not optimizer.state
    text = str(estimate)
    assert text.startswith("peak ") and "(cpu)" in text
    for part in ("parameters", "gradients", "optimizer state", "activations", "temporaries"):
        assert part in text
    assert "KiB" in text or "MiB" in text


class Masked(nn.Module):
    """A step whose shapes depend on the data's values (a boolean mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def train_step(self, batch):
        x, y = batch
        kept = x[x[:, 0] > 0]
        out = self.layer(kept)
        return TrainOutput(RegressionOutput(out.pow(2).mean(), out, y[: len(out)]))


def test_a_step_whose_shapes_depend_on_the_data_is_refused_naming_why(tmp_path):
    model = Masked()
    run = learner(tmp_path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(MemoryEstimateError, match="depend on the data's values"):
        run.memory_estimate((torch.randn(8, 4), torch.randn(8, 1)))


def test_a_device_this_torch_cannot_run_is_refused_naming_it(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine runs CUDA")
    model, optimizer, batch = workload("mlp")
    with pytest.raises(MemoryEstimateError, match=r"torch.cuda.is_available\(\) is False"):
        learner(tmp_path, model, optimizer).memory_estimate(batch, device="cuda")


def test_under_fsdp_the_figures_are_one_process_share_with_the_gathered_units():
    from ember.train.memory_estimate.fits import per_process
    from ember.train.parallel import FsdpOptions

    model, _, _ = workload("lm")  # two blocks as units; the embedding and head at the root
    whole = MemoryEstimate(10_000_000, 4_000_000, 2_000_000, 3_000_000, 800_000, 200_000, "cpu")
    fsdp = FsdpOptions(modules=(nn.TransformerEncoderLayer,), mixed_precision="bf16")
    share = per_process(whole, model, fsdp, world=4)
    block = sum(p.numel() for p in model.blocks.layers[0].parameters())
    root = sum(p.numel() for p in model.parameters()) - 2 * block
    assert share.processes == 4 and "per process of 4" in str(share)
    assert share.parameters == 1_000_000 + (root + 2 * block) * 2  # bf16 copies gathered
    assert share.gradients == 500_000 + block * 4  # one unit's, before its reduce-scatter
    assert share.optimizer_state == 750_000
    assert (share.activations, share.temporaries) == (800_000, 200_000)
    assert (
        share.peak == 1_000_000 + 500_000 + 750_000 + 1_000_000 + (root + 2 * block) * 2 + block * 4
    )
