"""The built wheel and sdist install into a clean virtualenv and run the quick start."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

QUICK_START = """
import torch, torch.nn.functional as F
from torch import nn
import ember
from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import CompactRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)
    def forward(self, x):
        return self.net(x)
    def step(self, batch):
        x, y = batch
        out = self(x)
        return ClassificationOutput(F.cross_entropy(out, y), out, y)
    def train_step(self, batch):
        return TrainOutput(self.step(batch))
    def valid_step(self, batch):
        return self.step(batch)

data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
loader = DataLoaderBuilder().batch_size(16).shuffle(1).build(data)
ember.seed(1)
model = (LearnerBuilder("run").metric_train_numeric(AccuracyMetric()).metric_valid_numeric(LossMetric())
         .with_file_checkpointer(CompactRecorder()).num_epochs(2)
         .build(Model(), AdamConfig().init(), 1e-2).fit(loader, loader))
print("version", ember.__version__)
"""


@pytest.mark.slow
def test_the_wheel_installs_into_a_clean_venv_and_trains(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    wheels = sorted(dist.glob("ember-*.whl"))
    sdists = sorted(dist.glob("ember-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0", str(wheels[0])],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    run = subprocess.run(
        [str(python), "-c", QUICK_START],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={"CI": "1", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "version 0.1.0" in run.stdout
    assert (tmp_path / "run" / "checkpoint" / "model-2.mpk.gz").exists()
    version = subprocess.run(
        [str(env_dir / "bin" / "ember"), "--version"], capture_output=True, text=True
    )
    assert version.stdout.strip() == "ember 0.1.0"
    typed = subprocess.run(
        [
            str(python),
            "-c",
            "import ember, pathlib; print((pathlib.Path(ember.__file__).parent / 'py.typed').exists())",
        ],
        capture_output=True,
        text=True,
    )
    assert typed.stdout.strip() == "True"
