"""What the tests of models from other libraries share: the library or a skip, a quiet
builder, the hand-written loop they are compared with, and checks of weights and
checkpoints."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from ember_testing import StopAt
from torch import nn

from ember.record import DefaultRecorder, load
from ember.train import LearnerBuilder
from ember.train.logger import read_metric_log
from ember.train.metric import LossMetric
from ember.train.renderer import PlainRenderer

CUDA_WHEELS = (
    "{name} is not installed: the wheels the package index serves for it are CUDA builds "
    "that do not import beside a CPU-only torch"
)


def library(name: str, reason: str | None = None) -> Any:
    """The library, or a skip saying why it cannot be used."""
    try:
        return pytest.importorskip(name, reason=reason)
    except pytest.skip.Exception:
        raise
    except Exception as error:  # a wheel built for another torch fails in other ways
        pytest.skip(f"{name} does not import: {type(error).__name__}: {error}")


def quiet(hf: Any) -> Any:
    hf.utils.logging.set_verbosity_error()
    return hf


def builder(
    directory: Path,
    *,
    epochs: int = 2,
    valid: tuple[Any, ...] = (),
    checkpoints: bool = False,
    stop: tuple[int, int] | None = None,
    resume: bool = False,
) -> LearnerBuilder:
    built = (
        LearnerBuilder(directory, overwrite=not resume)
        .metric_train_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
        .num_epochs(epochs)
    )
    for metric in valid:
        built = built.metric_valid_numeric(metric)
    if checkpoints or stop or resume:
        built = built.with_file_checkpointer(DefaultRecorder())
    if resume:
        built = built.checkpoint("latest")
    if stop is not None:
        built = built.listener(StopAt(built.interrupter(), *stop))
    return built


def assert_close_states(a: nn.Module, b: nn.Module, atol: float = 0.0) -> None:
    """The same parameter names and tensors (equal, or within `atol`), and training moved
    them (checked by the caller against the initial state)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        if atol == 0.0:
            assert torch.equal(sa[name], sb[name]), name
        else:
            assert (sa[name] - sb[name]).abs().max() <= atol, name


def fit_history(directory: Path) -> list[tuple[int, dict[str, dict[str, float]]]]:
    from ember.train.history import RunHistory

    return RunHistory.load(directory / "history.jsonl").entries()


def train_losses(directory: Path, epoch: int) -> list[float]:
    return [
        value for value, _ in read_metric_log(directory / "train" / f"epoch-{epoch}" / "Loss.log")
    ]


def assert_checkpoint_loads_into(directory: Path, epoch: int, bare: nn.Module, trained: nn.Module):
    """The checkpoint's model record holds the bare model's own keys and loads into it."""
    tree = load(None, directory / "checkpoint" / f"model-{epoch}")
    assert sorted(tree) == sorted(bare.state_dict())
    bare.load_state_dict(tree)
    assert_close_states(bare, trained)


def hand_loop(model: nn.Module, optimizer: Any, loader: Any, epochs: int, loss: Any) -> list[float]:
    """The loop a user writes: every batch's loss, backward, step; the losses it saw."""
    losses = []
    model.train()
    for epoch in range(1, epochs + 1):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            value = loss(model, batch)
            value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(value.detach()))
    return losses
