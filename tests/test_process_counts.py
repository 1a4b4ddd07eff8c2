"""A run stopped on some number of processes and resumed on another: the same global
batch, the same samples in the same optimizer steps, the weights of a run never
stopped. The dealing in this process; whole runs on CPU processes (gloo) started by
tests/scripts/train_counts.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from ember.data import DataLoaderBuilder
from ember.data.layout import Layout
from ember.data.sampler import ResumableSampler
from ember.errors import ConfigError, TrainingError
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.length.batches import BatchPlanner
from ember.train.length.global_batch import run_layout
from ember.train.length.position import Position

SCRIPT = Path(__file__).parent / "scripts" / "train_counts.py"


# The dealing, in this process -------------------------------------------------------------
def steps(layout: Layout, world: int, samples: int, skip: int = 0, seed: int = 4):
    """The sets of sample indices of each optimizer step, over `world` processes, and
    each process's micro-batches per step."""
    grouped: dict[int, set[int]] = defaultdict(set)
    per = layout.shards // world
    for rank in range(world):
        sampler = ResumableSampler(range(samples), seed)
        sampler.deal(layout, rank, world)
        sampler.set_epoch(2)
        sampler.skip(skip)
        for index, batch in enumerate(sampler.batches()):
            grouped[index // per].update(batch)
    return [grouped[step] for step in sorted(grouped)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 12])
def test_every_number_of_processes_takes_the_same_samples_in_each_step(world):
    first = Layout(4, 2, 3)  # 2 processes of 4 samples, 3 micro-batches a step: 24
    layout = first.for_processes(world)
    assert layout is not None and layout.global_batch == 24
    expected = steps(first, 2, 101)
    assert steps(layout, world, 101) == expected
    assert [len(step) for step in expected] == [24, 24, 24, 24, 5]
    # a run resumed after 2 steps reads the rest of the epoch's order, in the same steps
    assert steps(layout, world, 101, skip=48) == expected[2:]


def test_the_first_launchs_dealing_is_torchs_distributed_one():
    """Each process reads every other sample of its share, as a DistributedSampler
    deals; one process with accumulation reads contiguous batches, as its loader does."""
    sampler = ResumableSampler(range(20))
    sampler.deal(Layout(3, 2, 1), 1, 2)
    assert list(sampler.batches()) == [[1, 3, 5], [7, 9, 11], [13, 15, 17], [19]]
    alone = ResumableSampler(range(10))
    alone.deal(Layout(3, 1, 2), 0, 1)
    assert list(alone.batches()) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_a_layout_splits_its_micro_batches_only_when_the_processes_need_it():
    first = Layout(16, 2, 1)
    assert first.for_processes(1) == first and first.for_processes(2) == first
    assert first.for_processes(4) == Layout(8, 4, 1)  # each micro-batch dealt to two
    assert first.for_processes(3) is None  # no split of 16 samples makes shards 3 divides
    assert first.for_processes(1, largest=8) == Layout(8, 4, 1)  # the loader's batch caps it
    assert Layout(3, 1, 1).for_processes(2) is None  # 3 samples a step, 2 processes
    assert first.streams_kept(1) and first.streams_kept(2) and not first.streams_kept(4)


def test_a_global_batch_is_the_same_layout_on_every_number_that_divides_it():
    one, two, four = (Layout.for_global_batch(32, n, 8) for n in (1, 2, 4))
    assert one == two == four == Layout(8, 4, 1, own_streams=True)
    assert Layout.for_global_batch(30, 4, 8) is None
    assert Layout.for_global_batch(48, 2, 16) == Layout(12, 4, 1, own_streams=True)


def test_each_process_counts_its_batches_and_every_steps_samples():
    loader = DataLoaderBuilder().batch_size(4).build(list(range(101)))
    plans = [
        BatchPlanner(loader, 1, (rank, 3), layout=Layout(4, 2, 3).for_processes(3))
        for rank in range(3)
    ]
    assert [plan.accumulation for plan in plans] == [2, 2, 2]
    assert plans[0].step_samples() == [24, 24, 24, 24, 5]
    assert plans[0].batches_per_epoch() == 9  # 4 whole steps of 2, and one of 4, 1 and 0
    seen = []
    for plan in plans:
        epoch = plan.epoch(1, Position(1, iteration=4, items=48))
        batches = [step.sizes for step in epoch]
        seen.append(batches)
    assert seen == [[[4, 4], [4, 4], [3]], [[4, 4], [4, 4], [2]], [[4, 4], [4, 4]]]


def test_a_global_batch_the_processes_cannot_share_is_refused_with_the_numbers():
    loader = DataLoaderBuilder().batch_size(8).build(list(range(40)))
    with pytest.raises(TrainingError, match=r"global_batch\(30\) cannot be shared by 4 proc"):
        run_layout(loader, 4, 1, 30, None, [])
    saved = {**Layout(1, 3, 1).state(), "processes": 3}  # 3 samples a step
    with pytest.raises(TrainingError, match=r"cannot be shared by 2 processes\. Resume on 1, 3"):
        run_layout(loader, 2, 1, None, saved, [])
    with pytest.raises(ConfigError, match="has none"):
        run_layout([[1, 2]], 1, 1, 4, None, [])
    saved = {**Layout(8, 2, 2).state(), "processes": 2, "batch_size": 8, "accumulation": 2}
    notes: list[str] = []
    kept, _ = run_layout(loader, 4, 2, None, saved, notes)  # the same options, 4 processes
    assert kept == Layout(8, 2, 2) and notes == []
    changed, _ = run_layout(loader, 2, 1, None, saved, notes)  # the accumulation changed
    assert changed == Layout(8, 2, 1)
    assert notes == [
        "The run's global batch changes at this resume, from 32 to 16 samples per optimizer "
        "step: the training loader's batch size and accumulation are 8 and 1 now, 8 and 2 "
        "when the checkpoint was written. To keep 32, give global_batch(32)."
    ]


def test_global_batch_and_grads_accumulation_are_one_choice():
    with pytest.raises(ConfigError, match="Give one of the two"):
        LearnerBuilder("unused").global_batch(64).grads_accumulation(2)
    with pytest.raises(ConfigError, match="Give one of the two"):
        LearnerBuilder("unused").grads_accumulation(2).global_batch(64)
    with pytest.raises(ConfigError, match="global_batch"):
        LearnerBuilder("unused").global_batch(0)


def test_a_plain_torch_loader_is_dealt_as_ember_s_own():
    data = list(range(50))
    plain = DataLoader(data, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(1))
    plan = BatchPlanner(plain, 1, None, layout=Layout(5, 2, 1))
    assert plan.layout == Layout(5, 2, 1) and plan.accumulation == 2
    first = [step.batches for step in plan.epoch(1)]
    assert sorted(i for batches in first for batch in batches for i in batch.tolist()) == data


# Whole runs, stopped and resumed on other numbers of processes ---------------------------
def run(directory: Path, processes: int, *args: str, per_step: int = 1) -> subprocess.Popen[str]:
    order = str(directory) + ".order"
    command = [sys.executable, str(SCRIPT), str(directory), "--processes", str(processes)]
    command += [*args, "--order", order, "--per-step", str(per_step)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait(*processes: subprocess.Popen[str]) -> None:
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-3000:]


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(None, directory / "final")


def history(directory: Path) -> dict[int, dict]:
    import json

    epochs = {}
    for line in (directory / "history.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "epoch" in record and "train" in record:
            epochs[record["epoch"]] = {**record["train"], **record["valid"]}
    return epochs


def order(directory: Path) -> list[set[int]]:
    """The samples of each optimizer step, over every process, as the batches had them."""
    grouped: dict[tuple[int, int], set[int]] = defaultdict(set)
    for line in Path(str(directory) + ".order").read_text().splitlines():
        epoch, step, _, indices = line.split()
        grouped[(int(epoch), int(step))].update(map(int, indices.split(",")))
    return [grouped[key] for key in sorted(grouped)]


def resumed(stopped: Path, copy: Path, processes: int, *args: str, per_step: int = 1):
    shutil.copytree(stopped, copy)
    if Path(str(stopped) + ".order").exists():
        shutil.copy(str(stopped) + ".order", str(copy) + ".order")
    return run(copy, processes, *args, "--resume", per_step=per_step)


def same_run(run: Path, reference: Path, atol: float = 1e-5) -> float:
    """The weights (within `atol`), history (within 1e-6) and steps of `run` are those
    of `reference`; returns the largest weight difference."""
    expected, got = weights(reference), weights(run)
    difference = max((got[key] - expected[key]).abs().max().item() for key in expected)
    assert difference <= atol, (run.name, difference)
    want, have = history(reference), history(run)
    assert want.keys() == have.keys() == {1, 2}
    for epoch, values in want.items():
        for name, value in values.items():
            assert have[epoch][name] == pytest.approx(value, abs=1e-6), (run.name, epoch, name)
    assert order(run) == order(reference), run.name
    return difference


@pytest.mark.slow
def test_a_run_with_a_global_batch_resumes_exactly_on_1_2_and_4_processes(tmp_path):
    """global_batch(16) with micro-batches of 4: dropout draws and all, every count that
    divides the step's 4 micro-batches trains the run never stopped."""
    task = ("--global-batch", "16", "--batch", "4", "--dropout", "0.2")
    per = {1: 4, 2: 2, 4: 1}  # micro-batches per step on each process
    straight = tmp_path / "straight"
    stops = {n: tmp_path / f"stopped-{n}" for n in (1, 2, 4)}
    wait(run(straight, 2, *task, per_step=2), run(stops[1], 1, *task, "--steps", "5", per_step=4))
    wait(*(run(stops[n], n, *task, "--steps", "7", per_step=per[n]) for n in (2, 4)))
    pairs = [(2, 1), (2, 4), (4, 2), (1, 2)]
    copies = {pair: tmp_path / f"resumed-{pair[0]}-to-{pair[1]}" for pair in pairs}
    for first, then in pairs:
        wait(resumed(stops[first], copies[first, then], then, *task, per_step=per[then]))
    for (first, then), copy in copies.items():
        same_run(copy, straight)
        log = (copy / "experiment.log").read_text()
        assert (
            f"Resumed on {then} process(es) from a checkpoint taken on {first}: global batch 16 "
            f"samples per optimizer step: {per[then]} micro-batch" in log
        )
        assert "random draws in the forward (dropout) differ" not in log


@pytest.mark.slow
def test_a_run_keeps_its_first_launchs_global_batch_and_streams_on_fewer_processes(tmp_path):
    """The default global batch (2 processes of 8): on one process two micro-batches of 8
    a step, each with the random stream of the process that ran it; on four, each
    micro-batch dealt to two processes, the samples the same and the masks not."""
    task = ("--batch", "8", "--dropout", "0.2")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    ended = tmp_path / "ended"  # 19 steps: the whole of epoch 1 (301 samples, 16 a step)
    wait(run(straight, 2, *task), run(stopped, 2, *task, "--steps", "7"))
    wait(run(ended, 2, *task, "--steps", "19"))
    alone, after_end = tmp_path / "alone", tmp_path / "after-end"
    wait(resumed(stopped, alone, 1, *task, per_step=2))
    wait(resumed(ended, after_end, 1, *task, per_step=2))
    assert "Resumed from the checkpoint of epoch 1." in (after_end / "experiment.log").read_text()
    for run_alone in (alone, after_end):
        assert same_run(run_alone, straight) == 0.0  # bit for bit, measured
    four = tmp_path / "four"
    wait(resumed(stopped, four, 4, *task))
    assert order(four) == order(straight)
    log = (four / "experiment.log").read_text()
    assert "Resumed on 4 process(es) from a checkpoint taken on 2: global batch 16" in log
    assert "random draws in the forward (dropout) differ from a run never stopped" in log


@pytest.mark.slow
def test_fsdp_and_hsdp_runs_resume_on_other_counts_from_sharded_checkpoints(tmp_path):
    task = ("--global-batch", "16", "--batch", "4", "--dropout", "0.2")
    sharded = ("--sharded-checkpoints",)
    straight, fsdp, hsdp = tmp_path / "straight", tmp_path / "fsdp", tmp_path / "hsdp"
    wait(
        run(straight, 2, *task, per_step=2),
        run(fsdp, 2, *task, "--strategy", "fsdp", *sharded, "--steps", "7", per_step=2),
    )
    mesh = ("--strategy", "hsdp", "--shard-size", "2", *sharded)
    wait(run(hsdp, 4, *task, *mesh, "--steps", "7"))
    one, two = tmp_path / "fsdp-to-1", tmp_path / "hsdp-to-2"
    wait(resumed(fsdp, one, 1, *task, per_step=4))
    wait(resumed(hsdp, two, 2, *task, "--strategy", "fsdp", *sharded, per_step=2))
    for copy in (one, two):
        same_run(copy, straight)


@pytest.mark.slow
def test_a_torch_loader_with_workers_resumes_on_one_process(tmp_path):
    task = ("--batch", "8", "--dropout", "0.2", "--loader", "plain", "--workers", "2")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    wait(run(straight, 2, *task), run(stopped, 2, *task, "--steps", "7"))
    alone = tmp_path / "alone"
    wait(resumed(stopped, alone, 1, *task, per_step=2))
    expected, got = weights(straight), weights(alone)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_shuffled_torch_loader_read_as_it_is_then_dealt_is_warned_of(tmp_path):
    """On one process a shuffled torch DataLoader keeps torch's own order; resumed inside
    the epoch on two, ember deals it, in another order: the log says so."""
    task = ("--batch", "8", "--loader", "plain")
    stopped, two = tmp_path / "stopped", tmp_path / "two"
    wait(run(stopped, 1, *task, "--steps", "7"))
    wait(resumed(stopped, two, 2, *task))
    log = (two / "experiment.log").read_text()
    assert (
        "The training loader shuffled with its own RandomSampler on the 1 process(es) that "
        "wrote the checkpoint, and ember deals it now: the rest of epoch 1 follows another "
        "order" in log
    )
