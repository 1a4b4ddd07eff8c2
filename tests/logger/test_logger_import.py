"""Importing the loggers loads no optional integration until a logger is created."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_loggers_leaves_tensorboard_and_mlflow_unloaded():
    code = (
        "import sys, json, ember.train.logger as logger;"
        "logger.InMemoryMetricLogger(); logger.mlflow_key('a b');"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorboard', 'mlflow') or m.startswith('torch.utils.tensorboard'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
