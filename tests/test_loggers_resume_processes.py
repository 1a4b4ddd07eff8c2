"""The CSV, TensorBoard and MLflow loggers of an interrupted and resumed run end up as
those of a run never interrupted, and under several processes each iteration is one
point at its true step. Each logger is read back with its own reader."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ember_testing import read_scalars, run_script
from mlflow import MlflowClient

from ember.errors import EmberError
from ember.train.history import RunHistory

SCRIPT = Path(__file__).parent / "scripts" / "train_loggers.py"
ITERATIONS = 20  # 320 samples in batches of 16
PAUSE_AT = ITERATIONS + 10  # epoch 2, iteration 10


def run(directory: Path, *args: str, timeout: float = 300) -> None:
    result = run_script(SCRIPT, str(directory), *args, timeout=timeout)
    assert result.returncode == 0, result.stderr


def interrupt(directory: Path, how: signal.Signals, *args: str, pause_at: int = PAUSE_AT) -> None:
    """Start a run that pauses in epoch 2; once the checkpoint of epoch 1 is written,
    send `how` (SIGKILL: the run dies; SIGTERM: it stops after the paused step)."""
    pause = "120" if how == signal.SIGKILL else "2"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(directory), "--sleep", "0.02", *args]
        + ["--pause-at", str(pause_at), "--pause", pause],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    history = directory / "run" / "history.jsonl"
    while time.monotonic() < deadline and process.poll() is None:
        if (directory / "paused").exists() and history.exists():
            try:
                if 1 in RunHistory.load(history).checkpoints:
                    break
            except EmberError:
                pass  # being replaced
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    process.send_signal(how)
    _, err = process.communicate(timeout=120)
    if how == signal.SIGTERM:
        assert process.returncode == 0, err


def csv_rows(directory: Path) -> list[tuple[str, ...]]:
    with open(directory / "metrics.csv", encoding="utf-8", newline="") as handle:
        return [tuple(row.values()) for row in csv.DictReader(handle)]


def csv_series(directory: Path) -> dict[tuple[str, ...], list[tuple[str, ...]]]:
    """The rows of each split, epoch, metric and kind, in file order (how the rows of
    different metrics interleave depends on the renderer's ticks, so it is left out)."""
    series: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for split, epoch, iteration, metric, value, weight, kind in csv_rows(directory):
        series.setdefault((split, epoch, metric, kind), []).append((iteration, value, weight))
    return series


def board(directory: Path) -> dict[str, list[tuple[int, float]]]:
    return read_scalars(directory / "tensorboard")


def mlflow(directory: Path) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(tracking_uri=(directory / "mlruns").as_uri())
    run_id = (directory / "mlflow_run_id").read_text()
    return {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in client.get_run(run_id).data.metrics
    }


@pytest.fixture(autouse=True)
def file_store(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("straight")
    run(directory)
    return directory


def assert_same_logs(straight: Path, resumed: Path) -> None:
    assert csv_series(resumed) == csv_series(straight)
    assert len(csv_rows(resumed)) == len(csv_rows(straight))
    expected, found = board(straight), board(resumed)
    assert sorted(found) == sorted(expected)
    for tag, series in expected.items():
        assert found[tag] == series, tag
    assert [step for step, _ in expected["train/epoch/Loss"]] == [1, 2, 3]
    assert [step for step, _ in expected["train/Loss"]] == list(range(1, 3 * ITERATIONS + 1))
    assert mlflow(resumed) == mlflow(straight)


def test_sigkill_mid_epoch_then_resume_latest_logs_as_a_run_never_killed(tmp_path, straight):
    interrupt(tmp_path, signal.SIGKILL)
    # the kill left epoch 2's first rows behind: the resumed run redoes epoch 2
    assert any(row[:2] == ("train", "2") for row in csv_rows(tmp_path))
    assert mlflow(tmp_path)["train/Loss"][-1][0] > ITERATIONS
    run(tmp_path, "--resume", "latest")
    assert_same_logs(straight, tmp_path)


def test_graceful_stop_mid_epoch_then_resume_logs_as_a_run_never_stopped(tmp_path, straight):
    interrupt(tmp_path, signal.SIGTERM)
    assert ("train", "2", str(PAUSE_AT - ITERATIONS)) in {row[:3] for row in csv_rows(tmp_path)}
    run(tmp_path, "--resume", "latest")
    assert_same_logs(straight, tmp_path)


def test_resume_from_an_earlier_checkpoint_logs_the_redone_epoch_once(tmp_path, straight):
    run(tmp_path)
    run(tmp_path, "--resume", "2")  # epoch 3 again
    assert_same_logs(straight, tmp_path)
    assert len(list((tmp_path / "tensorboard").glob("*tfevents*"))) == 2  # kept, then new


def test_two_processes_give_one_point_per_iteration_at_its_true_step(tmp_path):
    run(tmp_path / "one", "--batch", "32")
    run(tmp_path / "two", "--batch", "16", "--processes", "2")
    iterations = {"train": 10, "valid": 2}  # per process, per epoch

    # One process at batch 32 and two at batch 16 train on the same samples at each
    # step: each step's point is the same (the two processes' weighted mean).
    one, two = board(tmp_path / "one"), board(tmp_path / "two")
    assert sorted(two) == sorted(one)
    for tag, series in one.items():
        split = tag.split("/")[0]
        steps = [1, 2, 3] if "/epoch/" in tag else list(range(1, 3 * iterations[split] + 1))
        assert [step for step, _ in two[tag]] == [step for step, _ in series] == steps, tag
        assert [v for _, v in two[tag]] == pytest.approx([v for _, v in series], rel=1e-5, abs=1e-6)
    one_ml, two_ml = mlflow(tmp_path / "one"), mlflow(tmp_path / "two")
    assert sorted(two_ml) == sorted(one_ml)
    for key, series in one_ml.items():
        assert [s for s, _ in two_ml[key]] == [s for s, _ in series], key
        assert [v for _, v in two_ml[key]] == pytest.approx(
            [v for _, v in series], rel=1e-5, abs=1e-6
        )
    # The CSV keeps every process's row, each with the iteration's true number.
    rows = [r for r in csv_rows(tmp_path / "two") if r[6] == "iteration"]
    for split, count in iterations.items():
        for epoch in ("1", "2", "3"):
            numbers = sorted(int(r[2]) for r in rows if r[:2] == (split, epoch) and r[3] == "Loss")
            assert numbers == sorted(list(range(1, count + 1)) * 2), (split, epoch)

    # Two processes stopped in the middle of epoch 2 and resumed log what they would
    # have logged without the stop (the processes' rows interleave differently).
    resumed = tmp_path / "resumed"
    interrupt(resumed, signal.SIGTERM, "--batch", "16", "--processes", "2", pause_at=15)
    run(resumed, "--batch", "16", "--processes", "2", "--resume", "latest")
    assert board(resumed) == two
    assert mlflow(resumed) == two_ml
    sort = lambda series: {key: sorted(rows) for key, rows in series.items()}
    assert sort(csv_series(resumed)) == sort(csv_series(tmp_path / "two"))
