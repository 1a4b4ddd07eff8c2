"""Importing the loggers loads no optional integration until a logger is created."""

from __future__ import annotations

from ember_testing import fresh


def test_import_loggers_leaves_tensorboard_and_mlflow_unloaded():
    code = (
        "import sys, json, ember.train.logger as logger;"
        "logger.InMemoryMetricLogger(); logger.mlflow_key('a b');"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('tensorboard', 'mlflow') or m.startswith('torch.utils.tensorboard'))))"
    )
    assert fresh(code) == []
