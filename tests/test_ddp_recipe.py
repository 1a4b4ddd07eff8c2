"""The standard DDP recipe on 2 CPU processes under torchrun: the script makes the
process group, then trains with the loader it has (a DistributedSampler, a plain or
shuffled DataLoader, a subclass). Each equals the DataLoaderBuilder run; no
collective per step beyond DDP's own gradient reduction; a stop asked on one rank
stops every rank at the same step, and the run resumes exactly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log

SCRIPT = Path(__file__).parent / "scripts" / "train_recipe.py"


def torchrun(directory: Path, *args: str, processes: int = 2) -> dict:
    """The recipe under torchrun; rank 0's report."""
    out = torchrun_output(directory, *args, processes=processes)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, out
    return json.loads(lines[-1])


def torchrun_output(directory: Path, *args: str, processes: int = 2) -> str:
    """The recipe under torchrun; what it printed (rank 0's console and report)."""
    process = start(directory, *args, processes=processes)
    try:
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, err[-3000:]
    return out


def start(
    directory: Path,
    *args: str,
    processes: int = 2,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """The recipe started under torchrun (in a session of its own, to be killed whole)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(processes),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(SCRIPT),
        str(directory),
        *args,
    ]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )


def signal_rank(
    process: subprocess.Popen[str], pids: Path, rank: int, signum: int
) -> tuple[str, str]:
    """Once `rank` trains (its pid written at its second step), send it `signum`; what
    the launch printed when it ended."""
    try:
        deadline = time.monotonic() + 120
        target = pids / f"pid-{rank}"
        while not target.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert target.exists(), process.communicate(timeout=60)
        os.kill(int(target.read_text()), signum)
        return process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(None, directory / "final")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """The DataLoaderBuilder run, ember making the process group."""
    directory = tmp_path_factory.mktemp("builder")
    return directory, torchrun(directory, "--loader", "builder", "--no-group")


@pytest.mark.parametrize("loader", ["distributed", "plain", "subclass"])
def test_the_standard_recipe_trains_like_dataloaderbuilder(tmp_path, reference, loader):
    directory, built = reference
    report = torchrun(tmp_path, "--loader", loader)
    assert report["outcome"] == "completed"
    assert report["group_kept"] is True  # the user's group is left to the user
    assert report["collectives"] == 0 and report["window"] == 14
    assert report["stops"] == [[2, 16], [2, 16]]
    ours = weights(tmp_path)
    for name, value in weights(directory).items():
        torch.testing.assert_close(ours[name], value, rtol=0, atol=1e-6)
    assert built["collectives"] == 0 and built["group_kept"] is False


def test_a_checkpoint_by_time_and_a_time_limit_add_no_collective_per_step(tmp_path):
    """Rank 0's clock decisions ride on the stop vote, every half second or so: over the
    14 steps of the window (a few milliseconds each), at most the collectives of one
    vote, where a decision broadcast at every step made 14 or more."""
    limits = ("--every-minutes", "60", "--max-minutes", "60")
    report = torchrun(tmp_path, "--loader", "builder", "--no-group", *limits)
    assert report["outcome"] == "completed"
    assert report["window"] == 14 and report["collectives"] <= 1


def test_a_shuffled_loader_is_split_exactly_with_rank_0s_order(tmp_path):
    """ember gives a shuffled DataLoader a sampler of its own, shuffling with rank 0's
    seed: in each epoch the two processes read disjoint halves of the data, every
    sample once, in an order that changes from epoch to epoch."""
    record = tmp_path / "indices"
    report = torchrun(tmp_path / "run", "--loader", "shuffled", "--record", str(record))
    assert report["outcome"] == "completed"
    reads = [
        [int(line) for line in Path(f"{record}-{rank}.txt").read_text().split()] for rank in (0, 1)
    ]
    epochs = [[read[:256], read[256:]] for read in reads]  # 512 samples, 256 each an epoch
    assert all(len(read) == 512 for read in reads)
    for epoch in (0, 1):
        first, second = epochs[0][epoch], epochs[1][epoch]
        assert sorted(first + second) == list(range(512))
    assert epochs[0][0] != epochs[0][1] and epochs[0][0] != sorted(epochs[0][0])


@pytest.mark.slow
def test_a_stop_on_one_rank_stops_both_at_the_same_step_and_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    torchrun(straight, "--loader", "distributed", "--epochs", "2")
    run = tmp_path / "run"
    stopped = torchrun(run, "--loader", "distributed", "--stop-at", "3", "--slow", "0.06")
    assert stopped["outcome"].startswith("stopped")
    first, second = stopped["stops"]
    assert first == second  # the same step on both ranks
    assert first[1] >= 3
    resumed = torchrun(run, "--loader", "distributed", "--resume")
    assert resumed["outcome"] == "completed"
    ours = weights(run)
    for name, value in weights(straight).items():
        assert torch.equal(ours[name], value), name


FAKE_SCONTROL = """#!/bin/sh
echo "$@" >> "{log}"
"""


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0])
def test_a_preemption_signal_on_any_rank_preempts_every_rank_and_requeues_once(tmp_path, rank):
    """SIGUSR1 to one rank (SLURM may deliver it to one task): every rank stops at the
    same step as `preempted`, exits 138, one checkpoint is written, and rank 0 alone
    asks SLURM to requeue the job, once."""
    bin_dir, calls, pids = tmp_path / "bin", tmp_path / "scontrol.txt", tmp_path / "pids"
    bin_dir.mkdir()
    pids.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(FAKE_SCONTROL.format(log=calls))
    scontrol.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    run = tmp_path / "run"
    args = ("--loader", "distributed", "--epochs", "3", "--slow", "0.05")
    process = start(run, *args, "--preemption", "SIGUSR1", "--pids", str(pids), env=env)
    out, err = signal_rank(process, pids, rank, signal.SIGUSR1)
    assert [(pids / f"exit-{r}").read_text() for r in (0, 1)] == ["138", "138"], err[-3000:]
    report = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert report["outcome"] == "preempted: SIGUSR1"
    first, second = report["stops"]
    assert first == second  # the same step on both ranks
    assert calls.read_text() == "requeue 4242\n"  # once, by rank 0
    log = (run / "experiment.log").read_text()
    assert "Requeued SLURM job 4242" in log
    assert "Training preempted: SIGUSR1 after epoch" in log
    if rank == 1:
        assert "Every process stops after this step: preempted by SIGUSR1 on rank 1." in log
    assert log.count("Checkpoint of epoch") - log.count("Checkpoint of epoch 1 written") <= 1
    lines = (run / "history.jsonl").read_text().splitlines()
    reasons = [json.loads(line)["stop_reason"] for line in lines if '"stop_reason"' in line]
    assert reasons[-1] == {"reason": "preempted", "signal": int(signal.SIGUSR1)}
    listed = subprocess.run(
        [sys.executable, "-m", "ember.cli", "runs", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    row = next(line for line in listed.stdout.splitlines() if line.startswith("| run "))
    assert [cell.strip() for cell in row.split("|")[1:3]] == ["run", "preempted"]


def test_the_console_counts_every_process_items_once_with_checkpoints_inside_epochs(tmp_path):
    """Each checkpoint inside an epoch gathers the processes' rows: the epoch's line on
    the console still counts each sample once, as the metric files do."""
    out = torchrun_output(tmp_path, "--loader", "distributed", "--every", "3")
    assert "train epoch 1/2 done: 16 iterations, 512 items" in out
    assert "train epoch 2/2 done: 16 iterations, 512 items" in out
    lines = read_metric_log(tmp_path / "train" / "epoch-1" / "Loss.log")
    assert sum(weight for _, weight in lines) == 512


@pytest.mark.slow
def test_a_killed_rank_is_named_in_rank_0s_log(tmp_path):
    """SIGKILL to rank 1 under torchrun: it leaves no record, and rank 0's log names it
    as the rank that did not answer, not only the backend's lost connection."""
    pids = tmp_path / "pids"
    pids.mkdir()
    run = tmp_path / "run"
    process = start(
        run, "--loader", "distributed", "--epochs", "3", "--slow", "0.05", "--pids", str(pids)
    )
    _, err = signal_rank(process, pids, 1, signal.SIGKILL)
    assert process.returncode != 0, err[-2000:]
    log = (run / "experiment.log").read_text()
    assert "Training stopped at epoch" in log
    assert "rank 1 did not answer: it died, or is stuck outside Python" in log
    assert "Training failed at epoch" not in log
