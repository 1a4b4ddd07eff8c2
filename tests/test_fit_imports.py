"""A plain fit imports nothing: every module it uses is loaded by `import ember.train`
and by the user's own loaders, so the time of a fit is spent on the run alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
    from ember.train.metric import AccuracyMetric, LossMetric


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 3)

        def forward(self, x):
            return self.linear(x)

        def valid_step(self, batch):
            x, y = batch
            out = self(x)
            return ClassificationOutput(nn.functional.cross_entropy(out, y), out, y)

        def train_step(self, batch):
            return TrainOutput(self.valid_step(batch))


    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    train = DataLoader(data, batch_size=16, shuffle=True)
    valid = DataLoader(data, batch_size=16)
    for _ in valid:  # what the user's loaders import on their first batch
        break
    model = Net()
    learner = (
        LearnerBuilder(sys.argv[1])
        .metric_train_numeric(AccuracyMetric())
        .metric_valid_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .num_epochs(2)
        .build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3)
    )
    before = set(sys.modules)
    learner.fit(train, valid)
    print(json.dumps(sorted(set(sys.modules) - before)))
    """
)


def test_a_plain_fit_imports_no_module(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], f"fit imported {len(imported)} modules: {imported}"
    assert (tmp_path / "run" / "valid" / "epoch-2" / "Accuracy.log").exists()
