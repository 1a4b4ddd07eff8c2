"""The memory estimate on a GPU, against the caching allocator's own peak
(`torch.cuda.max_memory_allocated` over a real step, `memory_workloads.cuda_peak`)."""

from __future__ import annotations

import io

import pytest
import torch
from memory_workloads import cuda_peak, workload

from ember.train import LearnerBuilder
from ember.train.renderer import PlainRenderer

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "lm"])
def test_the_estimate_is_within_ten_percent_of_max_memory_allocated(tmp_path, name, precision):
    device = torch.device("cuda", 0)
    model, optimizer, batch = workload(name, large=True)
    model.to(device)
    builder = LearnerBuilder(tmp_path, overwrite=True).renderer(
        PlainRenderer(interval=3600, stream=io.StringIO())
    )
    if precision is not None:
        builder = builder.mixed_precision(precision)
    estimate = builder.devices(["cuda:0"]).build(model, optimizer).memory_estimate(batch)
    assert estimate.device == "cuda:0"
    del model, optimizer
    model, optimizer, batch = workload(name, large=True)
    model.to(device)
    batch = batch.to(device) if isinstance(batch, torch.Tensor) else [t.to(device) for t in batch]
    dtype = torch.bfloat16 if precision else None
    measured = cuda_peak(model, optimizer, batch, dtype)
    assert abs(estimate.peak - measured) <= 0.1 * measured, (str(estimate), measured)
