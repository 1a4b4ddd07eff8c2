"""Runs on preemptible machines: checkpoint("auto"), checkpoint_every, max_time and
preemption(signal, requeue)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from ember_testing import (
    BLOBS_SCRIPT,
    Classifier,
    assert_same_state,
    final_weights,
    run_script,
    sigterm_when,
)

from ember.errors import ConfigError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.checkpoint import FileCheckpointer
from ember.train.outcome import StopReason

SCRIPT = BLOBS_SCRIPT
DDP_SCRIPT = Path(__file__).parent / "scripts" / "train_ddp.py"


@pytest.fixture
def straight(blob_straight) -> Path:
    """The reference: the same run, never interrupted."""
    return blob_straight


def stop_reasons(directory: Path) -> list[dict]:
    return [
        json.loads(line)["stop_reason"]
        for line in (directory / "history.jsonl").read_text().splitlines()
        if '"stop_reason"' in line
    ]


def assert_same_weights(a: Path, b: Path) -> None:
    assert_same_state(final_weights(a), final_weights(b))


def signal_when(
    directory: Path, epoch: int, *extra: str, signum: int = signal.SIGTERM, env=None
) -> subprocess.CompletedProcess:
    """Start the run and send `signum` once it is inside `epoch`."""
    log = directory / "train" / f"epoch-{epoch}" / "Loss.log"
    args = [str(directory), "--sleep", "0.01", *extra]
    return sigterm_when(SCRIPT, args, log, env=env, signum=signum)


@pytest.mark.slow
def test_the_same_command_started_again_after_each_kill_ends_like_an_uninterrupted_run(
    tmp_path, straight
):
    run = tmp_path / "auto"

    # killed outright in epoch 1: logs, no checkpoint; the next start is a fresh run
    killed = signal_when(run, 1, "--auto", signum=signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert not (run / "checkpoint").exists() or not any((run / "checkpoint").iterdir())

    first = signal_when(run, 2, "--auto")
    assert first.returncode == 143, first.stderr
    assert first.stdout.startswith("training epoch 1/3")  # the heading, then the warnings
    took_over = [line for line in first.stdout.splitlines() if "Took over the run lock" in line]
    assert len(took_over) == 1 and took_over[0].startswith("warning: ")  # shown once
    assert "no longer runs" in took_over[0]
    log = (run / "experiment.log").read_text()
    assert "checkpoint('auto'): no checkpoint in" in log
    assert "starting a fresh run" in log

    second = signal_when(run, 3, "--auto")
    assert second.returncode == 143, second.stderr
    assert second.stdout.startswith("resuming at epoch 2/3, iteration")
    log = (run / "experiment.log").read_text()
    assert "checkpoint('auto'): resuming the run in" in log
    assert "Resumed from the checkpoint of epoch 2, iteration" in log

    third = run_script(SCRIPT, str(run), "--auto", timeout=120)
    assert third.returncode == 0, third.stderr
    assert third.stdout.startswith("resuming at epoch 3/3, iteration")
    assert "Resumed from the checkpoint of epoch 3, iteration" in (
        (run / "experiment.log").read_text()
    )
    assert_same_weights(straight, run)


@pytest.mark.slow
def test_sigusr1_preempts_requeues_the_slurm_job_and_the_requeued_job_resumes(tmp_path, straight):
    run, requeued = tmp_path / "job", tmp_path / "requeued.txt"
    options = ("--auto", "--preemption", "SIGUSR1", "--requeue", "--requeue-log", str(requeued))
    env = {**os.environ, "SLURM_JOB_ID": "4242"}

    preempted = signal_when(run, 2, *options, signum=signal.SIGUSR1, env=env)
    assert preempted.returncode == 128 + signal.SIGUSR1 == 138, preempted.stderr
    assert "training preempted: SIGUSR1" in preempted.stdout
    assert requeued.read_text() == "4242"
    log = (run / "experiment.log").read_text()
    assert "Checkpoint of epoch 2, iteration" in log
    assert "Requeued SLURM job 4242" in log
    assert stop_reasons(run)[-1] == {"reason": "preempted", "signal": signal.SIGUSR1}
    assert not (run / "final.mpk").exists()

    requeued.unlink()
    again = run_script(SCRIPT, str(run), *options, timeout=120)
    assert again.returncode == 0, again.stderr
    assert not requeued.exists()  # a completed run is not requeued
    assert_same_weights(straight, run)


def test_a_preemption_outside_slurm_is_not_requeued_and_says_how_to_resume(tmp_path):
    run, requeued = tmp_path / "job", tmp_path / "requeued.txt"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    options = ("--preemption", "SIGTERM", "--requeue", "--requeue-log", str(requeued))
    preempted = signal_when(run, 1, *options, env=env)
    assert preempted.returncode == 143, preempted.stderr
    assert "training preempted: SIGTERM" in preempted.stdout
    assert not requeued.exists()
    assert "SLURM_JOB_ID is not set, so no job is requeued" in (
        (run / "experiment.log").read_text()
    )


def test_preemption_and_checkpoint_reject_bad_values_at_build_time(tmp_path):
    with pytest.raises(ConfigError, match=r"takes 'SIGTERM' or 'SIGUSR1', got 'SIGKILL'"):
        LearnerBuilder(tmp_path).preemption("SIGKILL")
    with pytest.raises(ConfigError, match=r"takes True or False, got 'yes'"):
        LearnerBuilder(tmp_path).preemption("SIGUSR1", requeue="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"an epoch number, 'latest' or 'auto', got 'Auto'"):
        LearnerBuilder(tmp_path).checkpoint("Auto")


def test_preempted_is_a_stop_reason_with_the_signal_exit_code():
    from ember.train.outcome import Outcome

    outcome = Outcome.preempted(signal.SIGUSR1, "SIGUSR1")
    assert outcome == "preempted: SIGUSR1"
    assert outcome.reason is StopReason.PREEMPTED
    assert outcome.exit_code == 138


@pytest.mark.slow
def test_checkpoints_every_n_steps_resume_exactly_after_a_hard_kill(tmp_path, straight):
    """20 batches an epoch, a checkpoint every 7 steps: at iterations 7 and 14 (the
    epoch end checkpoints anyway). Killed outright after the one at epoch 2, iteration
    14, the run resumes from it and ends as if never stopped."""
    run = tmp_path / "job"
    options = ("--auto", "--every-steps", "7")
    killed = sigterm_when(
        SCRIPT,
        [str(run), "--sleep", "0.05", *options],
        run / "experiment.log",
        signum=signal.SIGKILL,
        text="Checkpoint of epoch 2, iteration 14 written",
    )
    assert killed.returncode == -signal.SIGKILL
    log = (run / "experiment.log").read_text()
    for where in (
        "epoch 1, iteration 7",
        "epoch 1, iteration 14",
        "epoch 1",
        "epoch 2, iteration 7",
    ):
        assert f"Checkpoint of {where} written" in log, where
    assert "iteration 20 written" not in log  # the epoch's last step: its end checkpoints
    # retention as for any mid-epoch checkpoint: the last two epochs (the newest mid-epoch)
    assert FileCheckpointer(run / "checkpoint", DefaultRecorder()).epochs() == [1, 2]

    resumed = run_script(SCRIPT, str(run), *options, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "Resumed from the checkpoint of epoch 2, iteration 14." in (
        (run / "experiment.log").read_text()
    )
    assert_same_weights(straight, run)


@pytest.mark.slow
def test_max_time_stops_with_a_checkpoint_and_exit_75_and_the_next_start_goes_on(
    tmp_path, straight
):
    run = tmp_path / "job"
    limited = run_script(
        SCRIPT, str(run), "--auto", "--max-minutes", "0.02", "--sleep", "0.05", timeout=120
    )
    assert limited.returncode == 75, limited.stderr
    assert "training stopped: time limit reached (max_time 1s)" in limited.stdout
    assert stop_reasons(run)[-1] == {"reason": "time_limit"}
    assert "Checkpoint of epoch" in (run / "experiment.log").read_text()
    assert not (run / "final.mpk").exists()

    again = run_script(SCRIPT, str(run), "--auto", timeout=120)
    assert again.returncode == 0, again.stderr
    assert "Resumed from the checkpoint of epoch" in (run / "experiment.log").read_text()
    assert_same_weights(straight, run)


@pytest.mark.slow
def test_two_processes_checkpoint_by_time_and_stop_at_the_time_limit_together(tmp_path):
    """Rank 0's clock decides, its decisions carried by the stop vote: both processes
    checkpoint at the same steps and stop at the same step with exit code 75; resumed,
    they end like a run never stopped."""
    straight = run_script(DDP_SCRIPT, str(tmp_path / "straight"), timeout=240)
    assert straight.returncode == 0, straight.stderr
    run = tmp_path / "job"
    limits = ("--every-minutes", "0.0001", "--max-minutes", "0.02", "--slow", "0.2")
    limited = run_script(DDP_SCRIPT, str(run), *limits, timeout=240)
    assert limited.returncode == 75, limited.stderr
    log = (run / "experiment.log").read_text()
    # by time, at a vote (the first step's clock was just reset), not the stop
    assert re.search(r"Checkpoint of epoch 1, iteration [2-9] written", log), log
    assert "Training stopped: time limit reached (max_time 1s)" in log
    resumed = run_script(DDP_SCRIPT, str(run), "--resume", timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    a = DefaultRecorder().load(None, tmp_path / "straight" / "final")
    b = DefaultRecorder().load(None, run / "final")
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_checkpoint_every_and_max_time_reject_bad_values_at_build_time(tmp_path):
    with pytest.raises(ConfigError, match=r"needs steps=N .* or minutes=M"):
        LearnerBuilder(tmp_path).checkpoint_every()
    with pytest.raises(ConfigError, match=r"checkpoint_every\(steps=...\) must be an int >= 1"):
        LearnerBuilder(tmp_path).checkpoint_every(steps=0)
    with pytest.raises(ConfigError, match=r"must be a positive number, got -1"):
        LearnerBuilder(tmp_path).checkpoint_every(minutes=-1)
    with pytest.raises(ConfigError, match=r"max_time\(hours=...\) must be a number >= 0"):
        LearnerBuilder(tmp_path).max_time(hours=-1)
    with pytest.raises(ConfigError, match=r"must be a positive number, got 0"):
        LearnerBuilder(tmp_path).max_time()
    builder = LearnerBuilder(tmp_path).checkpoint_every(steps=10)
    with pytest.raises(ConfigError, match=r"no checkpointer is set: add with_file_checkpointer"):
        builder.build(Classifier(), AdamConfig().init(), 1e-2)


def test_a_stop_on_a_checkpoint_step_writes_that_checkpoint_once(tmp_path):
    """checkpoint_every(steps=3) and a stop asked after the same step: one checkpoint of
    that step, not two."""
    from ember_testing import BlobBatcher, BlobDataset, Classifier, StopAt, blob_builder

    from ember.data import DataLoaderBuilder

    train = DataLoaderBuilder(BlobBatcher()).batch_size(16).shuffle(0).build(BlobDataset(160))
    builder = (
        blob_builder(tmp_path)
        .with_file_checkpointer(DefaultRecorder())
        .checkpoint_every(steps=3)
        .num_epochs(2)
    )
    builder = builder.listener(StopAt(builder.interrupter(), 2, 3))
    learner = builder.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(train)
    assert learner.outcome == "stopped: test stop"
    log = (tmp_path / "experiment.log").read_text()
    assert log.count("Checkpoint of epoch 2, iteration 3 written") == 1
