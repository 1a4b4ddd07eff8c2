"""Stopping a run mid-epoch (SIGTERM, the interrupter) and resuming it is exact."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ember_testing import Classifier, run_script

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log

SCRIPT = Path(__file__).parent / "scripts" / "train_blobs.py"


def run(directory: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, str(directory), *extra, timeout=timeout)


def final_weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(Classifier(), directory / "final").state_dict()


def sigterm_midway(directory: Path, *extra: str) -> subprocess.CompletedProcess:
    """Start a slow run and send SIGTERM once it is inside epoch 2."""
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(directory), "--sleep", "0.01", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    log = directory / "train" / "epoch-2" / "Loss.log"
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= 5:
            break
        if process.poll() is not None:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize(
    "options",
    [(), ("--workers", "2"), ("--accumulation", "3")],
    ids=["plain", "workers", "accumulation"],
)
def test_sigterm_mid_epoch_then_resume_latest_equals_an_uninterrupted_run(tmp_path, options):
    straight = run(tmp_path / "straight", *options)
    assert straight.returncode == 0, straight.stderr

    stopped = sigterm_midway(tmp_path / "resumed", *options)
    assert stopped.returncode == 143, stopped.stderr  # 128 + SIGTERM: a scheduler sees it
    assert "training stopped: terminated by SIGTERM" in stopped.stdout
    assert not (tmp_path / "resumed" / "final.mpk").exists()
    log = (tmp_path / "resumed" / "experiment.log").read_text()
    assert "Checkpoint of epoch 2, iteration" in log

    resumed = run(tmp_path / "resumed", "--resume", *options)
    assert resumed.returncode == 0, resumed.stderr
    assert (
        "Resumed from the checkpoint of epoch 2, iteration"
        in (tmp_path / "resumed" / "experiment.log").read_text()
    )

    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # the resumed epoch's logs continue where they stopped: same lines as the straight run
    for split, name in (("train", "Loss.log"), ("train", "Accuracy.log"), ("valid", "Loss.log")):
        for epoch in (1, 2, 3):
            assert read_metric_log(
                tmp_path / "straight" / split / f"epoch-{epoch}" / name
            ) == read_metric_log(tmp_path / "resumed" / split / f"epoch-{epoch}" / name), (
                split,
                epoch,
                name,
            )
