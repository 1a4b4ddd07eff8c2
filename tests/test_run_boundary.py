"""A run's directory is a boundary: nothing it holds (names, reasons, values) reaches a
terminal raw, nothing is written through a symlink out of it, and a damaged lock is
named as damaged, with when it is taken over."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from ember_testing import Classifier, blob_builder

from ember.cli import main
from ember.errors import TrainingError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train import ProcessedItem
from ember.train.files.lock import LockOwner, RunLock

HOSTILE = "\x1b]0;owned\x07\x1b[2J\r| fake | row |\n"
"""Retitles the terminal, rings, clears the screen, and adds a table row of its own."""
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
"""Control characters other than the newlines between lines ember lays out."""


class StopWith:
    """Stops the run gracefully after the second training batch of epoch 2, giving a
    hostile reason."""

    def __init__(self, interrupter: Any) -> None:
        self.interrupter = interrupter

    def on_event(self, event: Any) -> None:
        train = isinstance(event, ProcessedItem) and event.split == "train"
        if train and (event.epoch, event.iteration) == (2, 2):
            self.interrupter.stop(f"stop {HOSTILE}")


def hostile_run(root: Path, quiet: Any, loaders: Any) -> Path:
    """A run in a folder named with control characters, of a model whose class name
    holds them, stopped with a reason that holds them."""
    run = root / f"run{HOSTILE}"
    made = blob_builder(run, quiet).num_epochs(3).with_file_checkpointer(DefaultRecorder())
    made = made.listener(StopWith(made.interrupter()))
    model = type(f"Net{HOSTILE}", (Classifier,), {})()
    learner = made.build(model, AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    assert learner.outcome != "completed"
    return run


def clean(text: str) -> str:
    assert not RAW.search(text), repr(text)
    assert "| fake | row |" not in text.splitlines()
    return text


def test_control_characters_from_a_run_are_shown_escaped_by_every_command(
    tmp_path, quiet, loaders, capsys
):
    run = hostile_run(tmp_path, quiet, loaders)
    shown = clean(quiet.stream_text.getvalue())
    assert "\\x1b]0;owned\\x07" in shown and "stop \\x1b" in shown
    for argv in (["runs", str(tmp_path)], ["summary", str(run)], ["compare", str(run)]):
        assert main(argv) == 0
        out = clean(capsys.readouterr().out)
        assert "\\x1b" in out, argv
    assert main(["runs", str(tmp_path)]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 3  # the header, its rule and one run: no row added
    assert main(["summary", str(run)]) == 0
    assert "Net\\x1b]0;owned\\x07" in capsys.readouterr().out
    assert main(["repair", str(run)]) == 0
    clean(capsys.readouterr().out)
    assert main(["summary", str(tmp_path / "missing\x1b[2J")]) == 2
    assert "missing\\x1b[2J" in clean(capsys.readouterr().err)


# Symlinks ------------------------------------------------------------------------------
def fit_blobs(run: Path, quiet: Any, loaders: Any, **options: Any) -> Any:
    from ember.train import LearnerBuilder
    from ember.train.metric import AccuracyMetric, LossMetric

    made = (
        LearnerBuilder(run, **options)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(LossMetric())
        .metric_valid(AccuracyMetric())
        .renderer(quiet)
        .num_epochs(1)
        .with_file_checkpointer(DefaultRecorder())
    )
    learner = made.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    return learner


def outside_tree(outside: Path) -> dict[str, bytes]:
    return {str(p.relative_to(outside)): p.read_bytes() for p in outside.rglob("*") if p.is_file()}


# Each write path of a run, as a link to a folder or file outside the run of the same kind.
LINKS = {
    "train": "dir",
    "valid": "dir",
    "checkpoint": "dir",
    "train/epoch-1": "dir",
    "train/epoch-1/Loss.log": "file",
    "checkpoint/model-1.mpk": "file",
    "experiment.log": "file",
    "history.jsonl": "file",
    "sessions.json": "file",
    "hparams.json": "file",
    ".lock": "file",
}


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "overwrite"])
@pytest.mark.parametrize("where", list(LINKS))
def test_a_symlink_inside_the_run_is_refused_and_nothing_is_written_through_it(
    tmp_path, quiet, loaders, where, fresh
):
    run, outside = tmp_path / "run", tmp_path / "outside"
    if not fresh:
        fit_blobs(run, quiet, loaders)
    outside.mkdir()
    target = outside / "target"
    if LINKS[where] == "dir":
        target.mkdir()
        (target / "Loss.log").write_text("0.5,1\n")
        (target / "model-1.mpk").write_bytes(b"keep")
    else:
        target.write_text("kept as it is\n")
    before = outside_tree(outside)
    link = run / where
    if link.is_dir():
        import shutil

        shutil.rmtree(link)
    elif link.exists():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=LINKS[where] == "dir")
    with pytest.raises(TrainingError) as info:
        fit_blobs(run, quiet, loaders, overwrite=not fresh)
    message = str(info.value)
    assert f"{link} is a symbolic link" in message and "Remove the link" in message
    assert outside_tree(outside) == before
    assert link.is_symlink()


def test_ember_plot_and_repair_write_nothing_through_a_link(tmp_path, quiet, loaders, capsys):
    run, outside = tmp_path / "run", tmp_path / "outside"
    fit_blobs(run, quiet, loaders)
    outside.mkdir()
    (run / "plots").symlink_to(outside, target_is_directory=True)
    assert main(["plot", str(run)]) == 2
    assert "plots is a symbolic link" in capsys.readouterr().err
    assert main(["repair", str(run)]) == 2
    assert "plots is a symbolic link" in capsys.readouterr().err
    assert list(outside.iterdir()) == []


# The lock ------------------------------------------------------------------------------
def test_a_damaged_lock_is_named_as_damaged_with_when_it_is_taken_over(
    tmp_path, quiet, loaders, capsys
):
    run = tmp_path / "run"
    fit_blobs(run, quiet, loaders)
    lock = run / ".lock"
    lock.write_text(LockOwner.current().dumps().replace('"pid": ', '"pid": 9'))
    when = time.strftime("%H:%M:%S", time.localtime(lock.stat().st_mtime + 10))
    with pytest.raises(TrainingError) as info:
        RunLock(lock).acquire()
    message = str(info.value)
    assert f"The run lock {lock} is damaged" in message
    assert f"takes it over once it is 10 s old, at {when}" in message
    assert "in use by" not in message
    assert main(["repair", str(run)]) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and f"at {when}" in err and f"deleting {lock}" in err
    assert main(["runs", str(tmp_path)]) == 0
    assert "is damaged" in capsys.readouterr().out
    old = lock.stat().st_mtime - 60
    os.utime(lock, (old, old))
    taker = RunLock(lock)
    taker.acquire()
    assert "holds no process record" in str(taker.takeover_message)
    taker.release()
    assert main(["repair", str(run)]) == 0


class OwnRenderer:
    """A user's renderer, without the optional `notice`: warnings go to stderr."""

    def start(self, info: Any) -> None: ...

    def update(self, progress: Any, metrics: Any, records: Any) -> None: ...

    def end_split(self, progress: Any, metrics: Any) -> None: ...

    def end(self, reason: str) -> None: ...


def test_a_warning_shown_on_stderr_by_a_renderer_without_notices_is_escaped(
    tmp_path, loaders, capsys
):
    run = tmp_path / f"run{HOSTILE}"
    for epochs, width in ((1, 16), (2, 32)):
        made = blob_builder(run, OwnRenderer()).num_epochs(epochs)
        made = made.with_file_checkpointer(DefaultRecorder()).hparams({f"w{HOSTILE}": width})
        if epochs == 2:
            made = made.checkpoint("latest")
        made.build(Classifier(), AdamConfig().init(), 1e-2).fit(*loaders)
    shown = clean(capsys.readouterr().err)
    assert "ember: warning: The hyperparameters differ" in shown
    assert "w\\x1b]0;owned\\x07" in shown
