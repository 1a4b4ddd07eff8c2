"""A checkpoint's snapshot: copies taken at once (the loop goes on changing the weights),
on CUDA into reused pinned buffers with one wait for all of them."""

from __future__ import annotations

import pytest
import torch

import ember.record as er
from ember.train.checkpoint import FileCheckpointer
from ember.train.checkpoint.writer import Snapshots


def test_the_checkpoint_holds_the_weights_of_the_moment_it_was_taken(tmp_path):
    model = torch.nn.Linear(300, 200)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 300)).sum().backward()
    optimizer.step()
    expected = {name: value.clone() for name, value in model.state_dict().items()}
    moment = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    checkpointer = FileCheckpointer(tmp_path, er.DefaultRecorder())
    for epoch in (1, 2):
        checkpointer.save(epoch, model, optimizer, {"epoch": epoch})
        with torch.no_grad():  # the loop carries on while the write runs
            model.weight.add_(1.0)
            optimizer.state[model.weight]["exp_avg"].add_(1.0)
        checkpointer.wait()
        saved = er.load(None, checkpointer.path("model", epoch))
        assert torch.equal(saved["weight"], expected["weight"] + (epoch - 1))
        optim = er.load(None, checkpointer.path("optim", epoch))
        assert torch.equal(optim["state"][0]["exp_avg"], moment + (epoch - 1))
    assert checkpointer.epochs() == [1, 2]


def test_cpu_snapshots_are_copies():
    snapshots = Snapshots()
    tree = {"w": torch.ones(3), "nested": [torch.zeros(2), 5]}
    taken = snapshots.take("model", tree)
    snapshots.wait()
    tree["w"].add_(1.0)
    assert torch.equal(taken["w"], torch.ones(3)) and taken["nested"][1] == 5
    assert taken["w"].data_ptr() != tree["w"].data_ptr()


@pytest.mark.cuda
def test_cuda_snapshots_copy_without_a_sync_into_reused_pinned_buffers():
    device = torch.device("cuda")
    model = torch.nn.Linear(256, 128).to(device)
    snapshots = Snapshots()
    torch.cuda.set_sync_debug_mode("error")  # a blocking copy would raise here
    try:
        first = snapshots.take("model", model.state_dict())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    snapshots.wait()
    assert first["weight"].is_pinned() and first["weight"].device.type == "cpu"
    assert torch.equal(first["weight"], model.weight.detach().cpu())
    pointer = first["weight"].data_ptr()
    with torch.no_grad():
        model.weight.mul_(2.0)
    second = snapshots.take("model", model.state_dict())
    snapshots.wait()
    assert second["weight"].data_ptr() == pointer  # the same pinned buffer, refilled
    assert torch.equal(second["weight"], model.weight.detach().cpu())
