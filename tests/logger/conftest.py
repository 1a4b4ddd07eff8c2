"""Fixtures of the logger tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch) -> str:
    """An MLflow file store under tmp_path (artifacts, if any, would go there too)."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)
    return (tmp_path / "mlruns").as_uri()
