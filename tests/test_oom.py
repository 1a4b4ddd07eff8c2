"""grads_accumulation("auto"): a step that runs out of memory is run again in micro-batches."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from ember_testing import BlobBatcher, BlobDataset
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import LossMetric, ThroughputMetric
from ember.train.oom import largest_allocations, memory_post_mortem, split_batch


class Fits(nn.Module):
    """Raises torch.OutOfMemoryError, as CUDA does, on a batch of more than `fits` samples."""

    def __init__(self, fits: int):
        super().__init__()
        self.layer = nn.Linear(8, 3)
        self.fits = fits
        self.raised = 0

    def train_step(self, batch):
        size = batch.inputs.shape[0]
        if size > self.fits:
            self.raised += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {size} MiB (a batch of {size})"
            )
        output = self.layer(batch.inputs)
        loss = F.cross_entropy(output, batch.targets)
        return TrainOutput(ClassificationOutput(loss, output, batch.targets))


def train(directory, quiet, batch, accumulation, epochs=2, fits=8, resume=False, make=Fits):
    ember.seed(1)
    model = make(fits)
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(batch).shuffle(4).build(BlobDataset(100))
    builder = (
        LearnerBuilder(directory)
        .metric_train_numeric(LossMetric())
        .with_file_checkpointer(DefaultRecorder())
        .grads_accumulation(accumulation)
        .num_epochs(epochs)
        .renderer(quiet)
    )
    if resume:
        builder = builder.checkpoint("latest")
    learner = builder.build(model, AdamConfig().init(), 1e-2)
    learner.fit(loader)
    return model, learner


def test_auto_splits_until_it_fits_and_matches_explicit_micro_batches(tmp_path, quiet):
    auto, learner = train(tmp_path / "auto", quiet, batch=32, accumulation="auto")
    explicit, reference = train(tmp_path / "explicit", quiet, batch=8, accumulation=4)
    assert auto.raised == 2  # 32 and 16 samples did not fit, then 8 for the rest of the run
    for a, b in zip(auto.parameters(), explicit.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    log = (tmp_path / "auto" / "experiment.log").read_text()
    assert "Out of memory at iteration 1 (CUDA out of memory. Tried to allocate 32 MiB" in log
    assert "every batch is now split into 2 micro-batches" in log
    assert "every batch is now split into 4 micro-batches" in log
    # the epoch's loss is the mean over the same samples; iterations count loader batches
    auto_epochs, explicit_epochs = learner.history, reference.history
    for (_, a), (_, b) in zip(auto_epochs, explicit_epochs):
        assert a["train"]["Loss"] == pytest.approx(b["train"]["Loss"], abs=1e-6)
    assert learner.iteration == 4  # 100 samples in batches of 32


def test_the_flops_are_counted_on_the_first_step_that_fits(tmp_path, quiet):
    mfu = ThroughputMetric("mfu", peak_flops=1e12)
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64))
    builder = LearnerBuilder(tmp_path).metric_train_numeric(mfu).renderer(quiet)
    builder.grads_accumulation("auto").build(Fits(8), AdamConfig().init(), 1e-2).fit(loader)
    assert mfu.flops_per_sample == 2 * 8 * 3 * 2  # forward and weight gradient of Linear(8, 3)


def test_a_smoke_test_splits_as_the_run_would_and_puts_the_split_back(tmp_path, quiet):
    loader = DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(64))
    model = Fits(8)
    learner = (
        LearnerBuilder(tmp_path)
        .grads_accumulation("auto")
        .renderer(quiet)
        .build(model, AdamConfig().init(), 1e-2)
    )
    learner.smoke_test(loader, echo=False)
    assert model.raised == 2
    assert learner.optim.micro_split == 1


def test_a_resumed_run_keeps_the_split(tmp_path, quiet):
    train(tmp_path / "run", quiet, batch=32, accumulation="auto", epochs=1)
    resumed, _ = train(tmp_path / "run", quiet, batch=32, accumulation="auto", resume=True)
    assert resumed.raised == 0  # the checkpoint's split: no out-of-memory to find it again
    log = (tmp_path / "run" / "experiment.log").read_text()
    assert "gradient accumulation auto (batches in 4)" in log
    assert "split into 4 micro-batches, as in the checkpoint's run" in log
    whole, _ = train(tmp_path / "whole", quiet, batch=8, accumulation=4)
    for a, b in zip(resumed.parameters(), whole.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_out_of_memory_for_one_sample_ends_the_run(tmp_path, quiet):
    with pytest.raises(torch.OutOfMemoryError) as raised:
        train(tmp_path, quiet, batch=4, accumulation="auto", fits=0)
    assert "micro-batches of one sample (4 per batch)" in "\n".join(raised.value.__notes__)


def test_without_auto_out_of_memory_ends_the_run_at_once(tmp_path, quiet):
    models = []

    def make(fits):
        models.append(Fits(fits))
        return models[-1]

    with pytest.raises(torch.OutOfMemoryError):
        train(tmp_path, quiet, batch=32, accumulation=1, make=make)
    assert models[0].raised == 1


def test_auto_is_refused_with_custom_optimization_or_fsdp(tmp_path):
    class Manual(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 2)

        def train_step(self, batch, ctx):
            raise AssertionError("not reached")

    params = Manual().parameters()
    with pytest.raises(ConfigError, match="custom optimization .* grads_accumulation\\(n\\)"):
        LearnerBuilder(tmp_path).grads_accumulation("auto").build(
            Manual(), {"a": torch.optim.SGD(params, lr=0.1)}, 0.1
        )
    with pytest.raises(ConfigError, match="an int >= 1\\) or 'auto', got 'Auto'"):
        LearnerBuilder(tmp_path).grads_accumulation("Auto")
    with pytest.raises(ConfigError, match="not on FSDP shards.* grads_accumulation\\(n\\)"):
        LearnerBuilder(tmp_path).grads_accumulation("auto").devices(
            ["cpu", "cpu"], strategy="fsdp"
        ).build(Fits(8), AdamConfig().init(), 1e-2)


@dataclass
class Pair:
    x: torch.Tensor
    tag: str


Named = namedtuple("Named", "x y")


def test_split_batch_cuts_every_tensor_along_the_first_dimension():
    x = torch.arange(10.0).reshape(5, 2)
    parts = split_batch(
        {"pair": Pair(x, "a"), "named": Named(x, [x[:, 0]]), "t": torch.tensor(3)}, 2
    )
    assert [part["pair"].x.shape[0] for part in parts] == [3, 2]
    assert parts[1]["pair"].tag == "a"
    assert torch.equal(parts[1]["named"].y[0], torch.tensor([6.0, 8.0]))
    assert torch.equal(torch.cat([part["named"].x for part in parts]), x)
    assert all(part["t"].item() == 3 for part in parts)

    class Opaque:
        def __init__(self):
            self.x = x

    with pytest.raises(TrainingError, match="cannot split a Opaque batch"):
        split_batch(Opaque(), 2)

    @dataclass
    class Tokens:
        x: torch.Tensor
        num_tokens: int

    # Its token count would be copied into every part, counting its tokens twice.
    with pytest.raises(TrainingError, match="says its own num_tokens.*output's tokens="):
        split_batch(Tokens(x, 40), 2)


class FailsOnce(Fits):
    """Also runs out of memory once in the middle of a split step (after a first
    micro-batch's backward), as memory fragmentation can make it."""

    def __init__(self, fits: int, at_call: int):
        super().__init__(fits)
        self.calls, self.at_call = 0, at_call

    def train_step(self, batch):
        self.calls += 1
        if self.calls == self.at_call:
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory (fragmented)")
        return super().train_step(batch)


def test_the_gradients_of_a_half_done_step_are_dropped_before_it_runs_again(tmp_path, quiet):
    # calls: 1 (16 samples, too many), 2 and 3 (iteration 1 in halves), 4 (iteration 2's
    # first half, backpropagated), 5 (its second half: out of memory) -> split into 4
    auto, learner = train(
        tmp_path / "auto", quiet, 16, "auto", make=lambda fits: FailsOnce(fits, at_call=5)
    )
    explicit, reference = train(tmp_path / "explicit", quiet, batch=4, accumulation=4)
    assert auto.raised == 2
    for a, b in zip(auto.parameters(), explicit.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    # the dropped attempt's first half (8 samples) is not in the epoch's metric lines
    lines = (tmp_path / "auto" / "train" / "epoch-1" / "Loss.log").read_text().splitlines()
    assert sum(float(line.split(",")[1]) for line in lines) == 100
    for (_, a), (_, b) in zip(learner.history, reference.history):
        assert a["train"]["Loss"] == pytest.approx(b["train"]["Loss"], abs=1e-6)


# Out-of-memory post-mortem ------------------------------------------------------------
def block(size, state="active_allocated", filename="train.py", line=3, name="forward"):
    torch_frame = {"filename": "/site-packages/torch/nn/modules/linear.py", "line": 1, "name": "f"}
    return {
        "size": size,
        "state": state,
        "frames": [torch_frame, {"filename": filename, "line": line, "name": name}],
    }


SNAPSHOT = [  # the shape of torch.cuda.memory_snapshot(): segments holding blocks
    {"device": 0, "blocks": [block(3 * 2**30, line=10), block(5 * 2**30, state="inactive")]},
    {
        "device": 0,
        "blocks": [
            block(512 * 2**20, name="attention"),
            {"size": 100, "state": "active_allocated"},
        ],
    },
]


def test_largest_allocations_lists_live_blocks_largest_first_with_their_frame():
    assert largest_allocations(SNAPSHOT) == [
        "3.00 GiB at train.py:10 (forward)",
        "512.00 MiB at train.py:3 (attention)",
        "100 B (no stack recorded)",
    ]
    assert largest_allocations(SNAPSHOT, count=1) == ["3.00 GiB at train.py:10 (forward)"]


def test_the_frame_named_is_the_users_python_line_not_a_cpp_torch_or_ember_frame():
    """What a CUDA snapshot records, innermost first: C++ frames (`??:0`), then torch's,
    ember's and the standard library's Python frames, then the user's."""
    frames = [
        {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"},
        {"filename": "/usr/lib/libtorch_cuda.so", "line": 0, "name": "c10::cuda::alloc"},
        {"filename": "/venv/lib/python3.11/site-packages/torch/nn/functional.py", "line": 9},
        {"filename": "/usr/lib/python3.11/contextlib.py", "line": 81, "name": "inner"},
        {"filename": "/venv/site-packages/ember/train/fit/stepper.py", "line": 5, "name": "step"},
        {"filename": "/home/me/train.py", "line": 10, "name": "forward"},
        {"filename": "/home/me/run.py", "line": 50, "name": "<module>"},
    ]
    snapshot = [{"blocks": [{"size": 2**29, "state": "active_allocated", "frames": frames}]}]
    assert largest_allocations(snapshot) == ["512.00 MiB at /home/me/train.py:10 (forward)"]
    inside = [frame for frame in frames if "/me/" not in frame["filename"]]
    snapshot[0]["blocks"][0]["frames"] = inside  # no user frame: a Python frame still wins
    assert largest_allocations(snapshot) == [
        "512.00 MiB at /venv/lib/python3.11/site-packages/torch/nn/functional.py:9 (None)"
    ]


class Hungry(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def train_step(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")


def test_out_of_memory_writes_the_snapshot_and_names_the_largest_allocations(
    tmp_path, quiet, monkeypatch
):
    recorded = []
    memory = torch.cuda.memory
    monkeypatch.setattr(memory, "_record_memory_history", lambda **kw: recorded.append(kw))
    monkeypatch.setattr(memory, "_dump_snapshot", lambda name: Path(name).write_bytes(b"viz"))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: SNAPSHOT)
    learner = LearnerBuilder(tmp_path).renderer(quiet).build(Hungry(), AdamConfig().init(), 0.1)
    # the builder refuses memory_history off CUDA: the option is set as a CUDA run has it
    learner.options = dataclasses.replace(learner.options, memory_history=1000)
    with pytest.raises(torch.OutOfMemoryError) as raised:
        learner.fit([(torch.zeros(4, 2),)])
    snapshot = tmp_path / "memory-snapshot.pickle"
    assert snapshot.read_bytes() == b"viz"
    assert not list(tmp_path.glob("*.partial"))
    note = "\n".join(raised.value.__notes__)
    assert "the largest live CUDA allocations:\n  3.00 GiB at train.py:10 (forward)\n" in note
    assert (
        f"The allocation history is in {snapshot}: open it at https://pytorch.org/memory_viz"
        in note
    )
    # recorded during fit only, with the Python stacks that name the user's lines
    assert recorded == [{"max_entries": 1000, "stacks": "python"}, {"enabled": None}]
    assert "open it at https://pytorch.org/memory_viz" in (tmp_path / "experiment.log").read_text()


def test_a_snapshot_that_cannot_be_written_is_said_and_the_error_kept(tmp_path, monkeypatch):
    def fails(name):
        Path(name).write_bytes(b"half")
        raise RuntimeError("record_context_cpp is not supported")

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", fails)
    error = torch.OutOfMemoryError("CUDA out of memory")
    memory_post_mortem(error, tmp_path / "memory-snapshot.pickle")
    assert error.__notes__ == [
        "ember: the memory snapshot could not be written: record_context_cpp is not supported"
    ]
    assert list(tmp_path.iterdir()) == []


def test_memory_history_is_refused_off_cuda(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"memory_history\(\) records CUDA allocations, and this run trains on cpu",
    ):
        LearnerBuilder(tmp_path).memory_history().build(Fits(8), AdamConfig().init(), 0.1)
    with pytest.raises(ConfigError, match="max_entries must be an int >= 1"):
        LearnerBuilder(tmp_path).memory_history(max_entries=0)


@pytest.mark.cuda
def test_a_real_out_of_memory_on_cuda_leaves_a_snapshot(tmp_path, quiet):
    class Greedy(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 1)

        def train_step(self, batch):
            self.kept = torch.empty(2**28, device="cuda")  # 1 GiB, alive at the error
            torch.empty(2**50, device="cuda")  # 4 PiB: out of memory
            raise AssertionError("not reached")

    line = Greedy.train_step.__code__.co_firstlineno + 1  # where the 1 GiB is allocated

    learner = (
        LearnerBuilder(tmp_path)
        .devices(["cuda:0"])
        .memory_history(max_entries=10_000)
        .renderer(quiet)
        .build(Greedy(), AdamConfig().init(), 0.1)
    )
    with pytest.raises(torch.OutOfMemoryError) as raised:
        learner.fit([(torch.zeros(4, 2),)])
    assert (tmp_path / "memory-snapshot.pickle").stat().st_size > 0
    note = "\n".join(raised.value.__notes__)
    assert f"1.00 GiB at {__file__}:{line} (train_step)" in note, note
