"""Runs on preemptible machines: checkpoint("auto") and preemption(signal, requeue)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from ember_testing import Classifier, run_script, sigterm_when

from ember.errors import ConfigError
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.outcome import StopReason

SCRIPT = Path(__file__).parent / "scripts" / "train_blobs.py"


def final_weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(Classifier(), directory / "final").state_dict()


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = final_weights(a), final_weights(b)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def signal_when(
    directory: Path, epoch: int, *extra: str, signum: int = signal.SIGTERM, env=None
) -> subprocess.CompletedProcess:
    """Start the run and send `signum` once it is inside `epoch`."""
    log = directory / "train" / f"epoch-{epoch}" / "Loss.log"
    args = [str(directory), "--sleep", "0.01", *extra]
    return sigterm_when(SCRIPT, args, log, env=env, signum=signum)


@pytest.mark.slow
def test_the_same_command_started_again_after_each_kill_ends_like_an_uninterrupted_run(tmp_path):
    straight = run_script(SCRIPT, str(tmp_path / "straight"), timeout=120)
    assert straight.returncode == 0, straight.stderr
    run = tmp_path / "auto"

    # killed outright in epoch 1: logs, no checkpoint; the next start is a fresh run
    killed = signal_when(run, 1, "--auto", signum=signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert not (run / "checkpoint").exists() or not any((run / "checkpoint").iterdir())

    first = signal_when(run, 2, "--auto")
    assert first.returncode == 143, first.stderr
    assert first.stdout.startswith("training epoch 1/3")
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
    assert_same_weights(tmp_path / "straight", run)


@pytest.mark.slow
def test_sigusr1_preempts_requeues_the_slurm_job_and_the_requeued_job_resumes(tmp_path):
    straight = run_script(SCRIPT, str(tmp_path / "straight"), timeout=120)
    assert straight.returncode == 0, straight.stderr
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
    outcomes = [
        json.loads(line)
        for line in (run / "history.jsonl").read_text().splitlines()
        if '"outcome"' in line
    ]
    assert outcomes[-1]["stop_reason"] == {"reason": "preempted", "signal": signal.SIGUSR1}
    assert not (run / "final.mpk").exists()

    requeued.unlink()
    again = run_script(SCRIPT, str(run), *options, timeout=120)
    assert again.returncode == 0, again.stderr
    assert not requeued.exists()  # a completed run is not requeued
    assert_same_weights(tmp_path / "straight", run)


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
