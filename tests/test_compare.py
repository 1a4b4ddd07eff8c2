"""`ember compare` and `ember runs`: tables checked against the runs' histories, charts
written, and runs in every state (completed, stopped, pruned, killed, running, old)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ember_testing import Classifier, StopAt

import ember
from ember.cli import main
from ember.errors import EmberError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import LearnerBuilder
from ember.train.files.lock import RunLock
from ember.train.history import RunHistory
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer.format import significant


def train(directory, quiet, loaders, lr, epochs=3, stop=None):
    ember.seed(0)
    builder = (
        LearnerBuilder(directory)
        .hparams({"lr": lr, "model": {"width": 16}, "epochs": epochs})
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .with_file_checkpointer(DefaultRecorder())
        .num_epochs(epochs)
        .renderer(quiet)
    )
    if stop is not None:
        builder.listener(StopAt(builder.interrupter(), *stop))
    builder.build(Classifier(), AdamConfig().init(), lr).fit(*loaders)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Three runs, trained once for the module: two complete, one stopped."""
    from ember_testing import BlobBatcher, BlobDataset

    from ember.data import DataLoaderBuilder
    from ember.train.renderer.silent import SilentRenderer

    loaders = (
        DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(7).build(BlobDataset(200)),
        DataLoaderBuilder(BlobBatcher()).batch_size(32).build(BlobDataset(90, seed=1)),
    )
    root = tmp_path_factory.mktemp("compare") / "runs"
    train(root / "fast", SilentRenderer(), loaders, 3e-2)
    train(root / "slow", SilentRenderer(), loaders, 1e-3)
    train(root / "stopped", SilentRenderer(), loaders, 1e-2, stop=(2, 3))
    return root


@pytest.fixture
def runs(trained, tmp_path):
    """A copy of the trained runs this test may change."""
    return Path(shutil.copytree(trained, tmp_path / "runs"))


def reference(directory):
    """Best and final values computed from the run's history, independently."""
    history = RunHistory.load(directory / "history.jsonl")
    out = {}
    for split in ("train", "valid"):
        for name in ("Loss", "Accuracy"):
            values = [(e, v[split][name]) for e, v in history.epochs if name in v.get(split, {})]
            if values:
                pick = max if name == "Accuracy" else min
                best = pick(values, key=lambda item: item[1])
                out[(split, name)] = (best[1], best[0], values[-1][1])
    return out


def test_compare_rows_match_the_histories_and_charts_are_written(runs, capsys):
    comparison = ember.compare([runs / "fast", runs / "slow", runs / "stopped"])
    assert [row.status for row in comparison.rows] == ["completed", "completed", "stopped"]
    assert [row.epochs for row in comparison.rows] == [3, 3, 1]
    assert comparison.differing == ["lr"]  # model.width and epochs are the same
    for row in comparison.rows:
        wanted = reference(row.directory)
        assert {k: (s.best, s.best_epoch, s.final) for k, s in row.metrics.items()} == wanted
        assert row.wall_time is not None and row.wall_time > 0
        assert row.hparams["model.width"] == 16
    assert "resume with LearnerBuilder(dir).checkpoint('latest')" in comparison.rows[2].detail

    output = runs.parent / "charts"
    assert main(["compare", *(str(runs / n) for n in ("fast", "slow")), "-o", str(output)]) == 0
    printed = capsys.readouterr().out
    header, _, fast, slow = printed.splitlines()[:4]
    assert [cell.strip() for cell in header.split("|")[1:6]] == [
        "Run",
        "Status",
        "Epochs",
        "Time",
        "lr",
    ]
    best, epoch, final = reference(runs / "fast")[("valid", "Loss")]
    assert f"{significant(best)} @{epoch}" in fast and f"{significant(final)}" in fast
    assert fast.split("|")[5].strip() == "0.03" and slow.split("|")[5].strip() == "0.001"
    charts = sorted(output.glob("*.png"))
    assert [p.name for p in charts] == ["Accuracy.png", "Loss.png"]
    assert all(p.stat().st_size > 20_000 for p in charts)  # drawn lines, not an empty frame
    assert [str(p) for p in charts] == sorted(printed.splitlines()[-2:])


def test_a_chart_shows_inline_in_a_notebook(runs):
    from IPython.core.formatters import PNGFormatter

    chart = ember.compare([runs / "fast", runs / "slow"]).chart("Loss")
    png = PNGFormatter()(chart)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    with pytest.raises(
        EmberError, match="No run has a metric 'Loss '; the runs have: Accuracy, Loss"
    ):
        ember.compare([runs / "fast"]).chart("Loss ")


def test_runs_lists_every_state_with_what_to_do(runs, capsys):
    root = runs
    # A run killed in its second epoch: no outcome, a lock its dead process left.
    shutil.copytree(root / "stopped", root / "killed")
    killed = root / "killed" / "history.jsonl"
    lines = killed.read_text().splitlines(keepends=True)
    killed.write_text("".join(line for line in lines if '"outcome"' not in line))
    dead = {"host": __import__("socket").gethostname(), "pid": 2**22 + 1, "token": "x"}
    (root / "killed" / ".lock").write_text(json.dumps(dead))
    # A run of an older ember: metric logs only.
    shutil.copytree(root / "fast", root / "old" / "run")
    for name in ("history.jsonl", "hparams.json", "sessions.json"):
        (root / "old" / "run" / name).unlink()
    shutil.rmtree(root / "old" / "run" / "checkpoint")  # (they would need the history)
    # A run going on now: this process holds its lock.
    shutil.copytree(root / "slow", root / "live")
    lock = RunLock(root / "live" / ".lock")
    lock.acquire()
    try:
        assert main(["runs", str(root)]) == 0
    finally:
        lock.release()
    lines = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert sorted(lines) == ["fast", "killed", "live", "old/run", "slow", "stopped"]
    cells = {run: [c.strip() for c in line.split("|")[2:6]] for run, line in lines.items()}
    assert cells["fast"][:2] == ["completed", "3"]
    assert cells["stopped"][:2] == ["stopped", "1"]
    assert cells["stopped"][3] == (
        "stopped: test stop; resume with LearnerBuilder(dir).checkpoint('latest')"
    )
    assert cells["killed"][0] == "failed"
    assert cells["killed"][3].startswith(f"killed (no process {2**22 + 1} runs any more)")
    assert cells["live"][0] == "running" and "training: process" in cells["live"][3]
    assert cells["old/run"][:3] == ["unknown", "3", "-"]

    old = ember.compare([root / "old" / "run"]).rows[0]
    assert old.hparams is None and old.wall_time is None
    assert old.notes == (
        "no history.jsonl: epoch values are the means of the metric logs",
        "no hparams.json",
        "no sessions.json: wall time unknown",
    )
    assert old.metrics[("valid", "Loss")].final == pytest.approx(
        reference(root / "fast")[("valid", "Loss")][2], rel=1e-6
    )


def test_missing_directories_are_named(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such artifact directory" in capsys.readouterr().err
    assert main(["runs", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"No runs under {tmp_path}."
