"""The GAN example: two optimizers in one Learner train, checkpoint and resume exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ember_testing import load_example, sigterm_when

from ember.record import DefaultRecorder
from ember.train.logger import read_metric_log

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gan" / "train.py"
SLOW = Path(__file__).parent / "scripts" / "train_gan.py"
gan = load_example(EXAMPLE, "gan_train")


def environment() -> dict[str, str]:
    env = {**os.environ, "EMBER_PROGRESS_INTERVAL": "3600", "OMP_NUM_THREADS": "1"}
    paths = [str(ROOT / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def run(script: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def weights(path: Path) -> dict[str, torch.Tensor]:
    return DefaultRecorder().load(gan.Gan(), path).state_dict()


def test_the_gan_trains_both_optimizers_and_checkpoints_their_states(tmp_path):
    directory = tmp_path / "gan"
    run(EXAMPLE, str(directory), "--epochs", "3")
    for name in ("final.mpk", "ema.mpk", "results.json", "history.jsonl", "experiment.log"):
        assert (directory / name).is_file(), name
    results = json.loads((directory / "results.json").read_text())
    assert results["after"]["mean_gap"] < results["before"]["mean_gap"] / 2, results

    optim = DefaultRecorder().load(None, directory / "checkpoint" / "optim-3.mpk")
    model = gan.Gan()
    for name, part in (("gen", model.generator), ("disc", model.discriminator)):
        assert optim[name]["class"] == "Adam"
        state = optim[name]["state"]
        assert len(state["state"]) == len(list(part.parameters()))  # every parameter stepped
        assert all(int(entry["step"]) == 3 * 32 for entry in state["state"].values())
    state = DefaultRecorder().load(None, directory / "checkpoint" / "scheduler-3.mpk")
    assert state["lr_scheduler"]["gen"]["type"] == "CosineAnnealingLrScheduler"
    assert state["lr_scheduler"]["disc"]["type"] == "ConstantLr"
    assert state["callbacks"]["EMA"]["updates"] == 3 * 32  # after each generator step
    averaged = weights(directory / "ema.mpk")
    for key, value in state["callbacks"]["EMA"]["shadow"].items():
        assert torch.equal(value, averaged[key]), key

    norms = read_metric_log(directory / "train" / "epoch-3" / "Grad_Norm_disc.log")
    assert len(norms) == 32 and all(weight == 1 and value > 0 for value, weight in norms)
    log = (directory / "experiment.log").read_text()
    assert "optimizer gen Adam, disc Adam, lr gen CosineAnnealingLrScheduler" in log


@pytest.mark.slow
@pytest.mark.parametrize("accumulation", ["1", "2"])
def test_custom_optimization_stopped_mid_epoch_resumes_exactly(tmp_path, accumulation):
    options = ["--epochs", "3", "--accumulation", accumulation]
    run(EXAMPLE, str(tmp_path / "straight"), *options)
    log = tmp_path / "resumed" / "train" / "epoch-2" / "Loss_gen.log"
    stopped = sigterm_when(
        SLOW, [str(tmp_path / "resumed"), "--sleep", "0.02", *options], log, env=environment()
    )
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert not (tmp_path / "resumed" / "final.mpk").exists()
    run(EXAMPLE, str(tmp_path / "resumed"), "--resume", *options)
    text = (tmp_path / "resumed" / "experiment.log").read_text()
    assert "Resumed from the checkpoint of epoch 2, iteration" in text

    for name in ("final.mpk", "ema.mpk"):
        a, b = weights(tmp_path / "straight" / name), weights(tmp_path / "resumed" / name)
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
    for name in ("Loss_gen.log", "Loss_disc.log", "Grad_Norm_disc.log"):
        for epoch in (2, 3):
            assert read_metric_log(
                tmp_path / "straight" / "train" / f"epoch-{epoch}" / name
            ) == read_metric_log(tmp_path / "resumed" / "train" / f"epoch-{epoch}" / name)
