"""Stopping a run mid-epoch (SIGTERM, the interrupter) and resuming it is exact."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from ember_testing import Classifier, run_script, sigterm_when

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log

SCRIPT = Path(__file__).parent / "scripts" / "train_blobs.py"


def run(directory: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, str(directory), *extra, timeout=timeout)


def final_weights(directory: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(Classifier(), directory / "final").state_dict()


def sigterm_midway(directory: Path, *extra: str) -> subprocess.CompletedProcess:
    """Start a slow run and send SIGTERM once it is inside epoch 2."""
    log = directory / "train" / "epoch-2" / "Loss.log"
    return sigterm_when(SCRIPT, [str(directory), "--sleep", "0.01", *extra], log)


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


@pytest.mark.slow
def test_a_run_with_an_ema_resumes_exactly_its_weights_its_ema_and_its_gradient_norms(tmp_path):
    """EMA (validating on the averaged weights) and GradNormMetric keep their state in the
    checkpoint: a run stopped by SIGTERM mid-epoch and resumed ends like one never stopped."""
    straight = run(tmp_path / "straight", "--ema")
    assert straight.returncode == 0, straight.stderr
    stopped = sigterm_midway(tmp_path / "resumed", "--ema")
    assert stopped.returncode == 143, stopped.stderr
    resumed = run(tmp_path / "resumed", "--resume", "--ema")
    assert resumed.returncode == 0, resumed.stderr
    assert "Resumed from the checkpoint of epoch 2, iteration" in (
        (tmp_path / "resumed" / "experiment.log").read_text()
    )

    for name in ("final", "ema"):
        a = DefaultRecorder().load(Classifier(), tmp_path / "straight" / name).state_dict()
        b = DefaultRecorder().load(Classifier(), tmp_path / "resumed" / name).state_dict()
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    ema = DefaultRecorder().load(Classifier(), tmp_path / "straight" / "ema").state_dict()
    final = final_weights(tmp_path / "straight")
    assert not all(torch.equal(ema[key], final[key]) for key in final)  # an average, not a copy
    for split, name in (("train", "Grad_Norm.log"), ("valid", "Loss.log")):
        for epoch in (1, 2, 3):
            lines = read_metric_log(tmp_path / "straight" / split / f"epoch-{epoch}" / name)
            assert lines and lines == read_metric_log(
                tmp_path / "resumed" / split / f"epoch-{epoch}" / name
            ), (split, epoch, name)
