"""Activation checkpointing: the same gradients and weights as without it, plain
checkpoint keys, and clear errors for classes that match nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from ember_testing import Batch
from torch import nn

import ember
from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder, load
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.files.model_summary import ModelSummary


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.dropout = nn.Dropout(0.3)  # recomputation must draw the same mask

    def forward(self, x):
        return x + self.dropout(torch.tanh(self.linear(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.Sequential(Block(16), Block(16), Block(16))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x)))

    def train_step(self, batch: Batch):
        output = self(batch.inputs)
        loss = F.cross_entropy(output, batch.targets)
        return TrainOutput(ClassificationOutput(loss, output, batch.targets))

    def valid_step(self, batch: Batch):
        return self.train_step(batch).item


def build(directory, quiet, checkpointed: bool, precision: str | None = None):
    ember.seed(0)
    builder = LearnerBuilder(directory).renderer(quiet).with_file_checkpointer(DefaultRecorder())
    if checkpointed:
        builder = builder.activation_checkpointing(module_classes=(Block,))
    if precision:
        builder = builder.mixed_precision(precision)
    return builder.build(Net(), AdamConfig().init(), 1e-2)


def test_gradients_equal_those_of_the_plain_model(tmp_path, quiet):
    plain = build(tmp_path / "a", quiet, False).model
    wrapped = build(tmp_path / "b", quiet, True).model
    assert sum(type(m).__name__ == "CheckpointWrapper" for m in wrapped.modules()) == 3
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for model in (plain, wrapped):
        torch.manual_seed(5)
        F.cross_entropy(model(x), y).backward()
    grads = {n: p.grad for n, p in plain.named_parameters()}
    for name, parameter in wrapped.named_parameters():
        plain_name = name.replace("._checkpoint_wrapped_module", "")
        assert torch.equal(parameter.grad, grads[plain_name]), name
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values())


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_training_gives_the_same_weights_and_plain_checkpoint_keys(
    tmp_path, quiet, loaders, precision
):
    plain = build(tmp_path / "a", quiet, False, precision)
    plain.fit(*loaders)
    wrapped = build(tmp_path / "b", quiet, True, precision)
    wrapped.fit(*loaders)
    expected = plain.model.state_dict()
    state = wrapped.model.state_dict()
    assert list(state) == list(expected)  # no _checkpoint_wrapped_module. prefixes
    for key, value in state.items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=0)
    saved = load(None, tmp_path / "b" / "checkpoint" / "model-1.mpk")
    assert sorted(saved) == sorted(expected)
    restored = load(Net(), tmp_path / "b" / "checkpoint" / "model-1.mpk")  # a plain model
    for key, value in restored.state_dict().items():
        assert torch.equal(value, expected[key])
    log = (tmp_path / "b" / "experiment.log").read_text()
    assert "activation checkpointing (Block)" in log.splitlines()[0]


def test_a_plain_checkpoint_resumes_into_a_checkpointed_model(tmp_path, quiet, loaders):
    build(tmp_path, quiet, False).fit(*loaders)
    ember.seed(0)
    resumed = (
        LearnerBuilder(tmp_path)
        .renderer(quiet)
        .with_file_checkpointer(DefaultRecorder())
        .activation_checkpointing(Block)
        .checkpoint(1)
        .num_epochs(2)
        .build(Net(), AdamConfig().init(), 1e-2)
    )
    resumed.fit(*loaders)
    assert resumed.outcome == "completed" and len(resumed.history) == 2


def test_the_summary_names_the_checkpointed_modules():
    model = Net()
    LearnerBuilder("unused").activation_checkpointing(Block).build(model, AdamConfig().init(), 0.1)
    summary = ModelSummary.of(model, depth=2)
    rows = {row.name: row for row in summary.rows}
    assert rows["blocks.0"].kind == "Block" and rows["blocks.0"].checkpointed
    line = next(line for line in summary.table().splitlines() if "blocks.0 " in line)
    assert line.split("|")[2].strip() == "Block (checkpointed)"


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        ((), "takes torch.nn.Module subclasses"),
        (("Block",), "takes torch.nn.Module subclasses"),
        (nn.Conv2d, "Net has no submodule of class Conv2d: check the classes named"),
        (Net, "the model itself is a Net"),
    ],
)
def test_classes_that_match_nothing_fail_at_build_time(classes, message):
    with pytest.raises(ConfigError, match=message):
        LearnerBuilder("unused").activation_checkpointing(classes).build(
            Net(), AdamConfig().init(), 0.1
        )


@pytest.mark.slow  # two runs of two processes each
def test_under_two_processes_the_weights_are_those_without_it(tmp_path):
    from pathlib import Path

    from ember_testing import run_script

    script = Path(__file__).parent / "scripts" / "train_ddp.py"
    runs = {}
    for name, extra in (("plain", ()), ("recomputed", ("--recompute",))):
        done = run_script(script, str(tmp_path / name), "--epochs", "1", *extra, timeout=240)
        assert done.returncode == 0, done.stderr
        runs[name] = DefaultRecorder().load(None, tmp_path / name / "final")
    assert list(runs["recomputed"]) == list(runs["plain"]) == ["layer.weight", "layer.bias"]
    for key, value in runs["plain"].items():
        torch.testing.assert_close(runs["recomputed"][key], value, rtol=0, atol=0)
    log = (tmp_path / "recomputed" / "experiment.log").read_text()
    assert "activation checkpointing (Linear), 2 processes (gloo, launched by ember)" in log
