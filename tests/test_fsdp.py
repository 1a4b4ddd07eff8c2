"""The FSDP strategy: several CPU processes (gloo) that each hold a shard of the model,
started by ember (tests/scripts/train_ddp.py --strategy fsdp); and its checks, in this
process."""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ember_testing import load_example
from torch import nn

from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.checkpoint import FileCheckpointer
from ember.train.checkpoint.shards import SHARDED, ShardIndex, index_record, load_whole
from ember.train.length.batches import BatchPlanner
from ember.train.logger import read_metric_log
from ember.train.parallel import FsdpOptions
from ember.train.parallel.fsdp import _by_index, _by_name, units
from ember.train.parallel.ties import tied_parameters, unit_groups

SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"
# two hidden blocks (FSDP units), Adam (sharded state), accumulation and clipping
TASK = ("--mlp", "--adam", "--accumulate", "2", "--clip", "0.5", "--epochs", "2")


def start(directory: Path, *args: str, task: tuple[str, ...] = TASK) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(directory), *task, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 240) -> str:
    _, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, stderr
    return stderr


def final(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(None, directory / "final")


def final_rank(directory: Path, rank: int) -> dict[str, torch.Tensor]:
    """What one process held at the end (--save-every-rank): under FSDP its shards."""
    return DefaultRecorder().load(None, directory / f"rank-{rank}")


def epoch_means(directory: Path, split: str, epoch: int, name: str) -> float:
    rows = read_metric_log(directory / split / f"epoch-{epoch}" / f"{name}.log")
    return sum(v * w for v, w in rows) / sum(w for _, w in rows)


@pytest.mark.slow
def test_fsdp_ddp_and_one_process_train_alike_at_the_same_global_batch(tmp_path):
    runs = {
        "one": start(tmp_path / "one", "--processes", "1", "--batch", "32"),
        "ddp": start(tmp_path / "ddp", "--processes", "2", "--batch", "16"),
        "fsdp": start(tmp_path / "fsdp", "--processes", "2", "--batch", "16", "--strategy", "fsdp"),
    }
    for process in runs.values():
        finish(process)
    reference = final(tmp_path / "one")
    for name in ("ddp", "fsdp"):
        weights = final(tmp_path / name)
        assert weights.keys() == reference.keys()
        for key, value in reference.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-5)
        for split in ("train", "valid"):
            for epoch in (1, 2):
                ours = epoch_means(tmp_path / name, split, epoch, "Loss")
                assert abs(ours - epoch_means(tmp_path / "one", split, epoch, "Loss")) < 1e-5
    log = (tmp_path / "fsdp" / "experiment.log").read_text()
    assert "Training Linear (467 parameters)" in log
    assert (
        "2 processes (gloo, launched by ember), rank 0 writes the artifacts, parameters "
        "sharded (FSDP; units: Block)" in log
    )


@pytest.mark.slow
def test_steps_that_call_the_submodules_train_under_fsdp_as_on_one_process(tmp_path):
    # train_step and valid_step call self.layer(...) directly, never the model's forward:
    # with hidden blocks as units, and with the root as the only unit
    one, root = ("--processes", "1", "--batch", "32", "--direct"), ("--epochs", "1")
    runs = [
        start(tmp_path / "one", *one),
        start(tmp_path / "fsdp", "--strategy", "fsdp", "--direct"),
        start(tmp_path / "root-one", *one, task=root),
        start(tmp_path / "root", "--strategy", "fsdp", "--direct", task=root),
    ]
    for process in runs:
        finish(process)
    for ours, reference in (("fsdp", "one"), ("root", "root-one")):
        expected = final(tmp_path / reference)
        weights = final(tmp_path / ours)
        assert weights.keys() == expected.keys()
        for key, value in expected.items():
            torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-5)
        valid = epoch_means(tmp_path / ours, "valid", 1, "Loss")
        assert abs(valid - epoch_means(tmp_path / reference, "valid", 1, "Loss")) < 1e-5


@pytest.mark.slow
def test_a_language_model_with_tied_weights_trains_under_fsdp_and_loads_tied(tmp_path):
    # the embedding is a unit (--lm adds nn.Embedding to the units), the head it is tied
    # to is not: ember shards them as one unit
    lm = ("--lm", "--adam", "--epochs", "2")
    one = start(tmp_path / "one", "--processes", "1", "--batch", "32", task=lm)
    fsdp = start(tmp_path / "fsdp", "--strategy", "fsdp", task=lm)
    finish(one), finish(fsdp)
    expected = final(tmp_path / "one")
    weights = final(tmp_path / "fsdp")
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-5)
    log = (tmp_path / "fsdp" / "experiment.log").read_text()
    assert (
        "units: Block, Embedding; embed.weight and head.weight are one parameter: embed and "
        "head sharded as one unit" in log
    )
    script = load_example(SCRIPT, "train_ddp_script")
    plain = script.Linear(argparse.Namespace(lm=True))
    DefaultRecorder().load(plain, tmp_path / "fsdp" / "checkpoint" / "model-2")
    assert plain.head.weight is plain.embed.weight
    assert torch.equal(plain.embed.weight.detach(), weights["embed.weight"])
    assert torch.equal(plain.head.weight.detach(), weights["head.weight"])


@pytest.mark.slow
def test_processes_with_fewer_batches_run_stand_ins_and_train_as_one_process(tmp_path):
    # 181 training samples: 91 and 90 per process, 7 and 6 batches of 15 (4 steps of 2);
    # 61 validation samples: 3 and 2 batches. The second process runs a stand-in (its
    # last batch again, weighing nothing) for the first one's seventh batch.
    uneven = ("--samples", "181", "--batch", "15")
    one = start(tmp_path / "one", "--processes", "1", "--samples", "181", "--batch", "30")
    fsdp = start(tmp_path / "fsdp", "--strategy", "fsdp", *uneven)
    finish(one), finish(fsdp)
    expected = final(tmp_path / "one")
    for key, value in final(tmp_path / "fsdp").items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=1e-5)
    for split, samples, lines in (("train", 181, 7 + 6), ("valid", 61, 3 + 2)):
        for epoch in (1, 2):
            ours = epoch_means(tmp_path / "fsdp", split, epoch, "Loss")
            assert abs(ours - epoch_means(tmp_path / "one", split, epoch, "Loss")) < 1e-5
            log = tmp_path / "fsdp" / split / f"epoch-{epoch}" / "Loss.log"
            rows = read_metric_log(log)
            assert len(rows) == lines  # each process's batches; no stand-in counted
            assert sum(weight for _, weight in rows) == samples


@pytest.mark.slow
def test_sync_batchnorm_on_the_cpu_gives_every_process_rank_0s_statistics(tmp_path):
    norm = ("--norm", "--epochs", "1", "--save-every-rank")
    runs = {
        "fsdp": start(tmp_path / "fsdp", "--strategy", "fsdp", "--sync-bn", task=norm),
        "ddp": start(tmp_path / "ddp", "--sync-bn", task=norm),
        "apart": start(tmp_path / "apart", "--strategy", "fsdp", task=norm),
    }
    for process in runs.values():
        finish(process)
    statistics = ("layer.0.running_mean", "layer.0.running_var")
    for name in runs:
        ranks = [final_rank(tmp_path / name, rank) for rank in (0, 1)]
        same = all(torch.equal(ranks[0][key], ranks[1][key]) for key in statistics)
        assert same == (name != "apart"), name  # FSDP alone leaves each process its own
    reference = final(tmp_path / "ddp")
    for key, value in final(tmp_path / "fsdp").items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-5)
    log = (tmp_path / "fsdp" / "experiment.log").read_text()
    assert "BatchNorm running statistics of rank 0 (SyncBatchNorm needs GPUs)" in log


@pytest.mark.slow
def test_hsdp_on_a_2_by_2_mesh_trains_as_fsdp_and_one_process(tmp_path):
    four = ("--processes", "4", "--batch", "8")
    hybrid = ("--strategy", "hsdp", "--shard-size", "2", "--sharded-checkpoints")
    hsdp = start(tmp_path / "hsdp", *four, *hybrid)
    finish(hsdp)
    fsdp = start(tmp_path / "fsdp", *four, "--strategy", "fsdp")
    one = start(tmp_path / "one", "--processes", "1", "--batch", "32")
    finish(fsdp), finish(one)
    weights = final(tmp_path / "hsdp")
    for reference in ("one", "fsdp"):
        for key, value in final(tmp_path / reference).items():
            torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-5)
    log = (tmp_path / "hsdp" / "experiment.log").read_text()
    assert "4 processes (gloo, launched by ember)" in log
    assert "parameters sharded (HSDP; units: Block; shard groups of 2 processes;" in log
    # the first copy's two processes wrote the shards, which load into a plain model
    checkpoints = tmp_path / "hsdp" / "checkpoint"
    assert sorted(p.name for p in checkpoints.glob("model-2.*")) == [
        "model-2.mpk",
        "model-2.rank-0.mpk",
        "model-2.rank-1.mpk",
    ]
    script = load_example(SCRIPT, "train_ddp_script")
    plain = script.Linear(argparse.Namespace(mlp=True, lm=False))
    load_whole(FileCheckpointer(checkpoints, DefaultRecorder()), 2, plain, None)
    for key, value in plain.state_dict().items():
        assert torch.equal(value, weights[key]), key


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_fsdp_on_two_gpus_trains_as_ddp_and_its_checkpoint_resumes_on_one(tmp_path):
    gpus = ("--processes", "2", "--batch", "16", "--device", "cuda")
    fsdp = start(tmp_path / "fsdp", *gpus, "--strategy", "fsdp")
    finish(start(tmp_path / "ddp", *gpus))
    finish(fsdp)
    reference = final(tmp_path / "ddp")
    for key, value in final(tmp_path / "fsdp").items():  # NCCL sums in its own order
        torch.testing.assert_close(value, reference[key], rtol=1e-4, atol=1e-5)
    assert (
        "2 processes (nccl, launched by ember)"
        in (tmp_path / "fsdp" / "experiment.log").read_text()
    )
    args = ("--processes", "1", "--batch", "32", "--device", "cuda", "--epochs", "3", "--resume")
    finish(start(tmp_path / "fsdp", *args))  # the whole state, gathered from the GPUs
    assert (
        "Resumed from the checkpoint of epoch 2."
        in (tmp_path / "fsdp" / "experiment.log").read_text()
    )


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_sync_batchnorm_on_two_gpus_shares_the_batch_statistics(tmp_path):
    gpus = ("--processes", "2", "--device", "cuda", "--sync-bn")
    norm = ("--norm", "--epochs", "1", "--save-every-rank")
    runs = {
        "fsdp": start(tmp_path / "fsdp", *gpus, "--strategy", "fsdp", task=norm),
        "ddp": start(tmp_path / "ddp", *gpus, task=norm),
    }
    for process in runs.values():
        finish(process)
    for name in runs:  # SyncBatchNorm: every process computed the same statistics
        ranks = [final_rank(tmp_path / name, rank) for rank in (0, 1)]
        for key in ("layer.0.running_mean", "layer.0.running_var"):
            torch.testing.assert_close(ranks[0][key], ranks[1][key], rtol=1e-5, atol=1e-6)
        log = (tmp_path / name / "experiment.log").read_text()
        assert "BatchNorm statistics shared (SyncBatchNorm)" in log
    reference = final(tmp_path / "ddp")
    for key, value in final(tmp_path / "fsdp").items():
        torch.testing.assert_close(value, reference[key], rtol=1e-4, atol=1e-5)


def stop_mid_epoch(directory: Path, events: Path, *args: str) -> subprocess.Popen[str]:
    """Start a 2-process FSDP run whose steps are slowed down (SIGTERM it with `stop`)."""
    fsdp = ("--processes", "2", "--strategy", "fsdp", "--slow", "0.15")
    return start(directory, *fsdp, "--events", str(events), *args)


def stop(runs: list[tuple[subprocess.Popen[str], Path]]) -> None:
    """SIGTERM each run after rank 0's third step (of 7 in epoch 1), watching them all at
    once; each checkpoints and exits."""
    deadline = time.monotonic() + 120
    waiting = list(runs)
    while waiting:
        for run, events in list(waiting):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1]
            if events.exists() and events.read_text().count("step 0") >= 3:
                run.send_signal(signal.SIGTERM)
                waiting.remove((run, events))
        time.sleep(0.05)
    for run, _ in runs:
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 128 + signal.SIGTERM, stderr


@pytest.mark.slow
@pytest.mark.parametrize("shards", [False, True], ids=["whole", "sharded"])
def test_a_stopped_fsdp_run_resumes_exactly_and_on_other_process_counts(tmp_path, shards):
    option = ("--sharded-checkpoints",) if shards else ()
    straight = start(tmp_path / "straight", "--processes", "2", "--strategy", "fsdp")
    stopped, events = tmp_path / "stopped", tmp_path / "events"
    stop([(stop_mid_epoch(stopped, events, *option), events)])
    finish(straight)
    scheduler = DefaultRecorder().load(None, stopped / "checkpoint" / "scheduler-1")
    assert 0 < scheduler["learner"]["iteration"] < 7
    written = sorted(p.name for p in (stopped / "checkpoint").iterdir())
    if shards:  # the model and optim parts are an index; each rank wrote its shards
        assert written == [
            f"{part}-1{rank}.mpk"
            for part in ("model", "optim")
            for rank in ("", ".rank-0", ".rank-1")
        ] + ["scheduler-1.mpk"]
        index = DefaultRecorder().load(None, stopped / "checkpoint" / "model-1")
        rows = {tuple(path): rows for path, _, rows in index[SHARDED]["model"]}
        assert rows[("layer.0.linear.weight",)] == [[0, 8], [8, 16]]  # Block(8, 16)
        assert rows[("layer.2.weight",)] == [[0, 2], [2, 3]]  # Linear(16, 3)
    else:  # the whole model is in the checkpoint: it loads into the plain module
        assert written == ["model-1.mpk", "optim-1.mpk", "scheduler-1.mpk"]
        script = load_example(SCRIPT, "train_ddp_script")
        plain = script.Linear(argparse.Namespace(mlp=True, lm=False))
        path = stopped / "checkpoint" / "model-1"
        DefaultRecorder().load(plain, path)
        state = DefaultRecorder().load(None, path)
        assert state.keys() == plain.state_dict().keys()
        for key, value in plain.state_dict().items():
            assert torch.equal(value, state[key])

    # the same number of processes: bit for bit; one process, or four under FSDP (each
    # reading the rows of its shards from the two files): within float rounding
    alone, four = tmp_path / "alone", tmp_path / "four"
    shutil.copytree(stopped, alone)
    shutil.copytree(stopped, four)
    resumed = start(stopped, "--processes", "2", "--strategy", "fsdp", "--resume", *option)
    single = start(alone, "--processes", "1", "--batch", "32", "--resume")
    finish(resumed), finish(single)
    quad = ("--processes", "4", "--batch", "8", "--strategy", "fsdp", "--resume", *option)
    finish(start(four, *quad))
    expected = final(tmp_path / "straight")
    for key, value in final(stopped).items():
        assert torch.equal(value, expected[key]), key
    for other in (alone, four):
        log = (other / "experiment.log").read_text()
        assert "Resumed from the checkpoint of epoch 1, iteration" in log
        for key, value in final(other).items():
            torch.testing.assert_close(value, expected[key], rtol=0, atol=1e-5)
    for run, ranks in ((stopped, 2), (four, 4)) if shards else ():
        # each checkpoint kept has the shards of the processes that wrote it, no other
        names = sorted(p.name for p in (run / "checkpoint").iterdir())
        assert [n for n in names if ".rank-" in n] == [
            f"{part}-{epoch}.rank-{rank}.mpk"
            for part in ("model", "optim")
            for epoch in (1, 2)
            for rank in range(ranks)
        ], names


# Choosing the strategy, in this process ------------------------------------------------
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 200)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 1)

    def train_step(self, batch):  # pragma: no cover - never trained here
        raise NotImplementedError


def test_strategy_errors_name_the_fix():
    builder = LearnerBuilder("unused")
    with pytest.raises(ConfigError, match=r"takes 'ddp' .*, 'fsdp' .* or 'hsdp' .*, got 'zero3'"):
        builder.devices(["cpu", "cpu"], strategy="zero3")
    with pytest.raises(
        ConfigError, match="shards the model over several processes, but this run has one"
    ):
        builder.devices(["cpu"], strategy="fsdp")
    with pytest.raises(
        ConfigError,
        match="mixed_precision, which are options of the FSDP strategy: add strategy='fsdp'",
    ):
        builder.devices(["cpu", "cpu"], mixed_precision="bf16")
    with pytest.raises(
        ConfigError, match="unknown option 'reshard'. FSDP options: modules, min_params"
    ):
        builder.devices(["cpu", "cpu"], strategy="fsdp", reshard=True)
    with pytest.raises(ConfigError, match="shard_size=2 is the size of HSDP's shard groups"):
        builder.devices(["cpu"] * 4, strategy="fsdp", shard_size=2)
    with pytest.raises(ConfigError, match="shard_size=3 does not divide the 4 processes"):
        builder.devices(["cpu"] * 4, strategy="hsdp", shard_size=3)
    with pytest.raises(ConfigError, match=r"strategy='hsdp'\) shards the model .* has one"):
        builder.devices(["cpu"], strategy="hsdp")
    with pytest.raises(ConfigError, match="takes 'bf16'"):
        builder.devices(["cpu", "cpu"], strategy="fsdp", mixed_precision="fp8")
    with pytest.raises(ConfigError, match=r"modules=...\) takes torch.nn.Module classes"):
        FsdpOptions(modules=["Block"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="in one place"):
        builder.devices(["cpu", "cpu"], strategy=FsdpOptions(), min_params=10)
    chosen = builder.devices(["cpu", "cpu"], strategy=FsdpOptions(min_params=10))
    offload = LearnerBuilder("unused").devices(["cpu", "cpu"], strategy="fsdp", cpu_offload=True)
    with pytest.raises(ConfigError, match="this run trains on the CPU, where they are already"):
        offload.build(Net(), AdamConfig(), 1e-3)
    with pytest.raises(ConfigError, match=r"mixed_precision\('fp16'\) needs a gradient scaler"):
        chosen.mixed_precision("fp16").build(Net(), AdamConfig(), 1e-3)


def test_units_are_the_chosen_classes_and_large_submodules_innermost_first():
    net = Net()
    assert units(net, FsdpOptions()) == []  # the root alone
    assert units(net, FsdpOptions(modules=[Block])) == [net.blocks[1], net.blocks[0]]
    by_size = units(net, FsdpOptions(min_params=100))
    assert by_size == [net.embed]  # 600 parameters; a block has 28, the head 5
    both = units(net, FsdpOptions(modules=(Block,), min_params=40))
    assert both == [net.blocks[1], net.blocks[0], net.embed]  # the list itself has none left


class Tied(nn.Module):
    """An embedding tied to the output head, and two blocks sharing one layer's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.blocks[1].inner.weight = self.blocks[0].inner.weight
        self.head = nn.Linear(4, 10)
        self.head.weight = self.embed.weight


def test_tied_parameters_are_sharded_in_one_unit():
    net = Tied()
    assert [tie.names for tie in tied_parameters(net)] == [
        ("embed.weight", "head.weight"),
        ("blocks.0.inner.weight", "blocks.1.inner.weight"),
    ]
    chosen = units(net, FsdpOptions(modules=[Block, nn.Embedding]))
    groups = unit_groups(net, chosen)
    # the blocks are one unit; the embedding and the head (outside any unit) another
    assert groups.units == [(net.blocks[1], net.blocks[0]), (net.embed, net.head)]
    assert groups.notes == [
        "embed.weight and head.weight are one parameter: embed and head sharded as one unit",
        "blocks.0.inner.weight and blocks.1.inner.weight are one parameter: blocks.1 and "
        "blocks.0 sharded as one unit",
    ]
    # a parameter the root module holds itself stays in the root unit
    net.extra = net.embed.weight
    groups = unit_groups(net, units(net, FsdpOptions(modules=[nn.Embedding])))
    assert groups.units == []
    assert groups.notes == [
        "extra, embed.weight and head.weight are one parameter: embed not sharded as a "
        "unit of its own (the parameter stays in the root unit)"
    ]
    # untied parameters leave the units as they were chosen
    assert unit_groups(Net(), units(Net(), FsdpOptions(modules=[Block]))).notes == []


def test_the_optimizer_state_is_written_as_a_plain_optimizer_writes_it():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    optimizer = torch.optim.Adam(
        [{"params": [model[1].weight]}, {"params": [model[0].weight, model[0].bias, model[1].bias]}]
    )
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    plain = optimizer.state_dict()
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = {  # as torch.distributed.checkpoint.state_dict keys it
        "state": {
            names[id(p)]: optimizer.state[p] for g in optimizer.param_groups for p in g["params"]
        },
        "param_groups": [
            {**g, "params": [names[id(p)] for p in g["params"]]} for g in optimizer.param_groups
        ],
    }
    indexed = _by_index(by_name)
    assert indexed["param_groups"] == plain["param_groups"]
    assert indexed["state"].keys() == plain["state"].keys()
    for key, value in plain["state"].items():
        assert all(torch.equal(value[k], indexed["state"][key][k]) for k in value)
    assert _by_name(indexed, optimizer, model)["state"].keys() == by_name["state"].keys()
    with pytest.raises(
        TrainingError,
        match="the optimizer part has 4 parameters in 2 groups; this run's optimizer has 2 in 1",
    ):
        _by_name(indexed, torch.optim.Adam(model[0].parameters()), model)


def test_a_checkpoint_in_shards_is_read_by_rows_from_the_files_that_hold_them(tmp_path):
    checkpointer = FileCheckpointer(tmp_path, DefaultRecorder(), asynchronous=False)
    whole = torch.arange(15.0).reshape(5, 3)
    for rank, rows in ((0, whole[:3]), (1, whole[3:])):  # chunks of 3 rows, as FSDP's
        checkpointer.save_shard(1, rank, {"model": {"w": rows, "step": torch.tensor(7.0)}})
    entries = {"model": [[["w"], [5, 3], [[0, 3], [3, 5]]]]}
    DefaultRecorder().save(index_record(2, [0, 1], entries), checkpointer.path("model", 1))
    index = ShardIndex(checkpointer, 1, "model")
    state = index.read(lambda path, shape: None)  # one process: every row
    assert torch.equal(state["w"], whole) and torch.equal(state["step"], torch.tensor(7.0))
    assert torch.equal(index.read(lambda path, shape: (2, 4))["w"], whole[2:4])  # both files
    assert index.read(lambda path, shape: (5, 5))["w"].shape == (0, 3)  # an empty shard
    checkpointer.shard_path("model", 1, 1).unlink()  # rows of the first file only
    assert torch.equal(index.read(lambda path, shape: (0, 2))["w"], whole[:2])
    with pytest.raises(TrainingError, match=r"model-1.rank-1.mpk of the checkpoint .* missing"):
        index.read(lambda path, shape: (1, 4))
    entries = {"model": [[["w"], [5, 3], [[0, 3], [4, 5]]]]}
    DefaultRecorder().save(index_record(2, [0, 1], entries), checkpointer.path("model", 1))
    with pytest.raises(
        TrainingError,
        match=r"epoch 1 is damaged: the rows of w in the model shards are \[\(0, 3\), \(4, 5\)\], "
        "which do not cover its 5 rows",
    ):
        ShardIndex(checkpointer, 1, "model")


def test_loaders_that_cannot_give_every_process_its_batches_are_refused():
    data = list(torch.randn(17, 2))  # 9 and 8 samples per process
    uneven = BatchPlanner(DataLoaderBuilder().batch_size(8).build(data), shard=(0, 2))
    uneven.check_stand_ins("training")  # 2 and 1 batches: the second runs a stand-in
    with pytest.raises(
        TrainingError,
        match=r"gives the 2 processes 1 or 2 batches per epoch \(17 samples, batch size 8\); "
        r"sync_batchnorm\(\) needs the same number on every process. Build the loader",
    ):
        uneven.check_even("training", "sync_batchnorm()", "Build the loader ...")
    few = DataLoaderBuilder().batch_size(2).build(data[:3])  # 1, 1, 1 and 0 samples
    with pytest.raises(
        TrainingError,
        match=r"gives 1 of the 4 processes no batch \(3 samples, batch size 2\); "
        "under FSDP a process with fewer batches runs stand-ins",
    ):
        BatchPlanner(few, shard=(1, 4)).check_stand_ins("training")
    dropped = DataLoaderBuilder().batch_size(9).drop_last().build(data)  # no step of 18
    with pytest.raises(TrainingError, match=r"its 17 samples make no full step of 18"):
        BatchPlanner(dropped, shard=(1, 2)).check_whole_steps("training")


def test_sync_batchnorm_needs_several_processes_and_a_batchnorm():
    with pytest.raises(
        ConfigError, match=r"sync_batchnorm\(\) shares the BatchNorm .* this run has one"
    ):
        LearnerBuilder("unused").sync_batchnorm().build(Net(), AdamConfig(), 1e-3)
    two = LearnerBuilder("unused").devices(["cpu", "cpu"]).sync_batchnorm()
    with pytest.raises(ConfigError, match=r"sync_batchnorm\(\): Net has no BatchNorm layer"):
        two.build(Net(), AdamConfig(), 1e-3)
