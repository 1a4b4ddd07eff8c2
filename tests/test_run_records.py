"""The records beside the checkpoints (history.jsonl, sessions.json, hparams.json, the lock)
are as trustworthy as the checkpoints: each is checked when read, damage is told apart
from absence, a refused resume leaves every byte of the directory as it was, and
`ember repair` makes a damaged run resumable again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Callable

import pytest
from ember_testing import BlobBatcher, BlobDataset, Classifier, StopAt, blob_builder

from ember.cli import main
from ember.data import DataLoaderBuilder
from ember.errors import EmberError, RunRecordError
from ember.optim import AdamConfig, SgdConfig
from ember.record import DefaultRecorder
from ember.train import End, ProcessedItem
from ember.train.files.lock import LockOwner, RunLock
from ember.train.files.run_record import read_hparams, read_sessions
from ember.train.history import RunHistory

HPARAMS = {"lr": 0.01, "width": 16}


def builder(directory: Path, quiet: Any, epochs: int = 2, checkpoints: bool = True) -> Any:
    made = blob_builder(directory, quiet).num_epochs(epochs).hparams(HPARAMS)
    return made.with_file_checkpointer(DefaultRecorder()) if checkpoints else made


def fit(made: Any, loaders: Any, lr: float = 1e-2, optimizer: Any = None) -> Any:
    learner = made.build(Classifier(), optimizer or AdamConfig().init(), lr)
    learner.fit(*loaders)
    return learner


@pytest.fixture
def completed(tmp_path, quiet, loaders) -> Path:
    """A run of two epochs that completed, with its checkpoints and every record."""
    run = tmp_path / "run"
    assert fit(builder(run, quiet), loaders).outcome == "completed"
    return run


def snapshot(directory: Path) -> dict[str, str]:
    """Every path under `directory` with the SHA-256 of its bytes ("dir" for a folder)."""
    return {
        str(path.relative_to(directory)): "dir"
        if path.is_dir()
        else hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
    }


def history_lines(run: Path) -> list[str]:
    return (run / "history.jsonl").read_text().splitlines(keepends=True)


def line_of(run: Path, text: str) -> int:
    """The line number (1-based) of the first line of the history holding `text`."""
    return next(n for n, line in enumerate(history_lines(run), start=1) if text in line)


def rewrite_history(run: Path, edit: Callable[[list[str]], list[str]]) -> None:
    (run / "history.jsonl").write_text("".join(edit(history_lines(run))))


def edit_file(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


# The ways a resume is refused, each with what the message must say -------------------
def damaged_history_line(run: Path) -> tuple[str, ...]:
    number = line_of(run, '"epoch": 1,')
    rewrite_history(
        run,
        lambda lines: [
            *lines[: number - 1],
            lines[number - 1].replace('"epoch": 1,', '"epoch": 7,'),
            *lines[number:],
        ],
    )
    return (f"history.jsonl, line {number}: the line is damaged", "checksum does not match")


def garbage_history_line(run: Path) -> tuple[str, ...]:
    number = line_of(run, '"epoch": 1,')
    rewrite_history(run, lambda lines: [*lines[: number - 1], "garbage\n", *lines[number:]])
    return (f"history.jsonl, line {number}: the line is damaged: it is not JSON",)


def lost_history_line(run: Path) -> tuple[str, ...]:
    number = line_of(run, '"epoch": 1,')
    rewrite_history(run, lambda lines: [*lines[: number - 1], *lines[number:]])
    return (f"history.jsonl, line {number}: the line before it is missing",)


def lost_history_tail(run: Path) -> tuple[str, ...]:
    number = line_of(run, '"epoch": 2,')
    rewrite_history(run, lambda lines: lines[: number - 1])
    return (f"history.jsonl, line {number}: the file ends before it", "line(s) were lost")


def deleted_history(run: Path) -> tuple[str, ...]:
    (run / "history.jsonl").unlink()
    return ("history.jsonl: the file is missing", "comes after 2 epoch(s)")


def damaged_sessions(run: Path) -> tuple[str, ...]:
    edit_file(run / "sessions.json", '"start_epoch": 1', '"start_epoch": 2')
    return ("sessions.json: the checksum does not match",)


def damaged_hparams(run: Path) -> tuple[str, ...]:
    edit_file(run / "hparams.json", "0.01", "0.02")
    return ("hparams.json: the checksum does not match",)


def downgraded_history(run: Path) -> tuple[str, ...]:
    rewrite_history(
        run, lambda lines: [lines[0].replace('"version": 3', '"version": 1'), *lines[1:]]
    )
    return ("history.jsonl, line 1: the header is damaged", "checksum does not match")


def damaged_hparams_key(run: Path) -> tuple[str, ...]:
    edit_file(run / "hparams.json", '"$crc32"', '"$crc22"')
    return ("hparams.json: its checksum key reads '$crc22', not '$crc32'",)


def unwritable_log(run: Path) -> tuple[str, ...]:
    log = run / "experiment.log"
    text = log.read_text()
    log.unlink()
    log.mkdir()  # no file can be opened there
    (log / "kept.txt").write_text(text)
    return ("Cannot write the run's log", "experiment.log")


def held_lock(run: Path) -> tuple[str, ...]:
    (run / ".lock").write_text(LockOwner.current().dumps())  # this very process: alive
    return ("is in use by process", ".lock")


def damaged_checkpoint(run: Path) -> tuple[str, ...]:
    model = run / "checkpoint" / "model-2.mpk"
    data = bytearray(model.read_bytes())
    data[-40] ^= 0xFF
    model.write_bytes(bytes(data))
    return ("checkpoint(2): the checkpoint cannot be loaded",)


REFUSALS: dict[str, tuple[Callable[[Path], tuple[str, ...]], bool]] = {
    # kind: (damage, whether the message names `ember repair` as the fix)
    "damaged history line": (damaged_history_line, True),
    "garbage history line": (garbage_history_line, True),
    "lost history line": (lost_history_line, True),
    "lost history tail": (lost_history_tail, True),
    "deleted history": (deleted_history, True),
    "damaged sessions.json": (damaged_sessions, True),
    "damaged hparams.json": (damaged_hparams, True),
    "history version edited": (downgraded_history, True),
    "hparams checksum key edited": (damaged_hparams_key, True),
    "unwritable experiment.log": (unwritable_log, False),
    "run lock held": (held_lock, False),
    "damaged checkpoint": (damaged_checkpoint, False),
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
def test_a_refused_resume_leaves_every_byte_of_the_directory_as_it_was(
    kind, completed, quiet, loaders
):
    damage, repairable = REFUSALS[kind]
    expected = damage(completed)
    before = snapshot(completed)
    resume = builder(completed, quiet, epochs=3)
    resume = resume.checkpoint(2) if kind == "damaged checkpoint" else resume.checkpoint("latest")
    with pytest.raises(EmberError) as refused:
        fit(resume, loaders)
    message = str(refused.value)
    for text in expected:
        assert text in message, message
    assert ("ember repair" in message) == repairable, message
    assert "line 1 column 1" not in message
    assert snapshot(completed) == before


@pytest.mark.parametrize("kind", ["damaged sessions.json", "unwritable experiment.log"])
def test_a_refused_resume_keeps_the_outcome_and_the_model_of_a_completed_run(
    kind, completed, quiet, loaders
):
    REFUSALS[kind][0](completed)
    with pytest.raises(EmberError):
        fit(builder(completed, quiet, epochs=3).checkpoint("latest"), loaders)
    saved = RunHistory.load(completed / "history.jsonl")
    assert (saved.outcome, saved.model, len(saved.epochs)) == ("completed", "Classifier", 2)


def test_another_optimizer_on_resume_is_refused_before_anything_is_written(
    completed, quiet, loaders
):
    before = snapshot(completed)
    with pytest.raises(EmberError, match="written by a run with Adam"):
        fit(
            builder(completed, quiet, epochs=3).checkpoint("latest"),
            loaders,
            optimizer=SgdConfig().init(),
        )
    assert snapshot(completed) == before


# ember runs and ember repair --------------------------------------------------------
def test_a_damaged_sessions_file_shows_its_run_as_damaged_and_the_others_are_listed(
    completed, tmp_path, quiet, loaders, capsys
):
    other = tmp_path / "other"
    fit(builder(other, quiet), loaders)
    damaged_sessions(completed)
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines()[2:] if line.startswith("|")]
    rows = {line.split("|")[1].strip(): line for line in table}
    assert sorted(rows) == ["other", "run"]
    cells = {name: [cell.strip() for cell in line.split("|")[2:6]] for name, line in rows.items()}
    assert cells["other"][:2] == ["completed", "2"]
    assert cells["run"][:2] == ["damaged", "2"]
    assert "sessions.json: the checksum does not match" in cells["run"][3]
    assert f"ember repair {completed}" in cells["run"][3]
    below = out.splitlines()[2 + len(table) :]  # the problem in full, below the table
    assert below == [
        "run: sessions.json: the checksum does not match: the file was damaged or edited "
        f"after it was written; run `ember repair {completed}`"
    ]


def test_ember_repair_sets_damaged_records_aside_and_the_run_resumes(
    completed, quiet, loaders, capsys
):
    damaged_sessions(completed)
    damaged_hparams(completed)
    with pytest.raises(RunRecordError, match="ember repair"):
        fit(builder(completed, quiet, epochs=3).checkpoint("latest"), loaders)
    assert main(["repair", str(completed)]) == 0
    said = capsys.readouterr().out
    assert "sessions.json: the checksum does not match" in said and "sessions.json.damaged" in said
    assert "hparams.json: the checksum does not match" in said and "hparams.json.damaged" in said
    assert (completed / "sessions.json.damaged").exists()
    assert (completed / "hparams.json.damaged").exists()
    learner = fit(builder(completed, quiet, epochs=3).checkpoint("latest"), loaders)
    assert learner.outcome == "completed" and [e for e, _ in learner.history] == [1, 2, 3]
    assert read_hparams(completed) == HPARAMS
    assert [s.start_epoch for s in read_sessions(completed)] == [3]
    assert main(["repair", str(completed)]) == 0
    assert "Nothing to repair" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kind", ["deleted history", "lost history line", "garbage history line", "lost history tail"]
)
def test_a_history_that_lost_lines_is_rebuilt_by_ember_repair_and_the_run_resumes(
    kind, completed, quiet, loaders, capsys
):
    exact = RunHistory.load(completed / "history.jsonl").epochs
    REFUSALS[kind][0](completed)
    with pytest.raises(RunRecordError, match="history.jsonl"):
        fit(builder(completed, quiet, epochs=3).checkpoint("latest"), loaders)
    assert main(["repair", str(completed)]) == 0
    said = capsys.readouterr().out
    assert "history.jsonl holds 2 epoch(s) again" in said
    repaired = RunHistory.load(completed / "history.jsonl")
    assert [epoch for epoch, _ in repaired.epochs] == [1, 2]
    rebuilt = repaired.repairs[-1]["rebuilt"]
    for epoch, values in repaired.epochs:
        if epoch in rebuilt:  # the means of the metric log lines
            assert values["valid"]["Loss"] == pytest.approx(dict(exact)[epoch]["valid"]["Loss"])
        else:
            assert values == dict(exact)[epoch]
    if kind != "deleted history":
        assert (completed / "history.jsonl.damaged").exists()
    learner = fit(builder(completed, quiet, epochs=3).checkpoint("latest"), loaders)
    assert learner.outcome == "completed"
    assert [epoch for epoch, _ in RunHistory.load(completed / "history.jsonl").epochs] == [1, 2, 3]


# checkpoint("auto") -------------------------------------------------------------------
class FailsAt(Classifier):
    """Raises in its training step after `steps` steps."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def train_step(self, batch: Any) -> Any:
        self.steps -= 1
        if self.steps < 0:
            raise RuntimeError("the data went bad")
        return super().train_step(batch)


def test_checkpoint_auto_never_replaces_a_run_that_completed_or_stopped(
    completed, tmp_path, quiet, loaders
):
    shutil.rmtree(completed / "checkpoint")  # e.g. cleared by hand to save space
    stopped = tmp_path / "stopped"
    first = builder(stopped, quiet, epochs=3)
    first.listener(StopAt(first.interrupter(), 1, 3))
    assert fit(first, loaders).outcome.startswith("stopped")
    shutil.rmtree(stopped / "checkpoint")
    for run, ended in ((completed, "ended (completed, 2 epoch(s))"), (stopped, "ended (stopped")):
        before = snapshot(run)
        with pytest.raises(RunRecordError) as refused:
            fit(builder(run, quiet, epochs=3).checkpoint("auto"), loaders)
        assert ended in str(refused.value) and "it is left as it is" in str(refused.value)
        assert "LearnerBuilder(dir, overwrite=True)" in str(refused.value)
        assert snapshot(run) == before


def test_checkpoint_auto_replaces_a_run_that_failed_before_its_first_checkpoint(
    tmp_path, quiet, loaders
):
    run = tmp_path / "run"
    failing = builder(run, quiet).build(FailsAt(2), AdamConfig().init(), 1e-2)
    with pytest.raises(RuntimeError, match="the data went bad"):
        failing.fit(*loaders)
    assert RunHistory.load(run / "history.jsonl").outcome == "failed"
    learner = fit(builder(run, quiet).checkpoint("auto"), loaders)
    assert learner.outcome == "completed" and [e for e, _ in learner.history] == [1, 2]


# ember summary ------------------------------------------------------------------------
def test_ember_summary_refuses_a_history_that_lost_a_line_naming_it(completed, capsys):
    lost_history_line(completed)
    assert main(["summary", str(completed)]) == 2
    err = capsys.readouterr().err
    assert "history.jsonl, line 4: the line before it is missing" in err
    assert f"ember repair {completed}" in err


def test_ember_summary_counts_the_epochs_it_shows_and_names_those_missing(completed, capsys):
    """A history of the previous version (no line numbers) that lost the line of epoch 1."""
    epochs = [record for _, record in RunHistory.load(completed / "history.jsonl").epochs]
    lines = [
        {"format": "ember-history", "version": 2},
        {"model": "Classifier", "num_parameters": 195},
    ]
    lines += [{"epoch": 2, **epochs[1]}, {"outcome": "completed", "stop_reason": None}]
    (completed / "history.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert main(["summary", str(completed)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"Summary of {completed}: 1 epochs, Classifier")
    assert out[1].startswith("Note: no values of epoch(s) 1 in the history: its lines were lost")


def test_ember_summary_of_a_run_stopped_inside_its_first_epoch_shows_its_logs(
    tmp_path, quiet, loaders, capsys
):
    run = tmp_path / "run"
    first = builder(run, quiet)
    first.listener(StopAt(first.interrupter(), 1, 3))
    assert fit(first, loaders).outcome.startswith("stopped")
    assert main(["summary", str(run)]) == 0
    out = capsys.readouterr().out
    assert "holds no metric logs" not in out
    assert (
        "Note: no epoch ended: the values are the means of the metric log lines of epoch 1" in out
    )
    assert "| train | Loss" in out and "outcome: stopped: test stop" in out


# Records of earlier versions, and the lock -------------------------------------------
def test_records_without_a_checksum_are_read_as_those_of_an_earlier_version(tmp_path):
    (tmp_path / "hparams.json").write_text(json.dumps(HPARAMS, indent=2))
    sessions = {
        "format": "ember-sessions",
        "version": 1,
        "sessions": [{"started": 1.0, "start_epoch": 1}],
    }
    (tmp_path / "sessions.json").write_text(json.dumps(sessions))
    assert read_hparams(tmp_path) == HPARAMS
    assert [s.started for s in read_sessions(tmp_path)] == [1.0]
    sessions["version"] = 2  # this version seals its files: one without a checksum is damage
    (tmp_path / "sessions.json").write_text(json.dumps(sessions))
    with pytest.raises(RunRecordError, match="sessions.json: it has no checksum"):
        read_sessions(tmp_path)
    owner = LockOwner.current()
    legacy = json.loads(owner.dumps())
    del legacy["crc32"]
    assert LockOwner.parse(json.dumps(legacy)) == owner


def test_a_damaged_lock_names_no_owner_and_is_taken_over_once_old(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_text(LockOwner.current().dumps().replace('"pid": ', '"pid": 1'))
    assert LockOwner.parse(lock.read_text()) is None  # never mistaken for process 1...
    old = lock.stat().st_mtime - 60
    os.utime(lock, (old, old))
    taker = RunLock(lock)
    taker.acquire()
    assert "holds no process record" in str(taker.takeover_message)
    taker.release()


# What the console shows --------------------------------------------------------------
def test_hyperparameters_kept_from_the_checkpoint_are_shown_on_the_console(
    completed, quiet, loaders
):
    fit(builder(completed, quiet, epochs=3).checkpoint("latest"), loaders, lr=0.05)
    shown = quiet.stream_text.getvalue()
    assert (
        "warning: The checkpoint's hyperparameters are kept over this run's: lr 0.05 "
        "(checkpoint 0.01)." in shown
    )
    assert shown.count("hyperparameters are kept") == 1


def test_a_mid_epoch_resume_on_other_data_is_shown_on_the_console(tmp_path, quiet, loaders):
    run = tmp_path / "run"
    first = builder(run, quiet)
    first.listener(StopAt(first.interrupter(), 1, 3))
    fit(first, loaders)
    more = DataLoaderBuilder(BlobBatcher()).batch_size(32).shuffle(8).build(BlobDataset(260))
    fit(builder(run, quiet).checkpoint("latest"), (more, loaders[1]))
    shown = quiet.stream_text.getvalue()
    assert (
        "warning: The training data differs from the data the checkpoint of epoch 1, "
        "iteration 3 was taken on (training samples 200 then, 260 now; shuffle seed 7 then, "
        "8 now)" in shown
    )
    assert "Resume with the same data" in shown


# Writes that fail -------------------------------------------------------------------------
class BreaksHistory:
    """A listener that makes history.jsonl unwritable after the first epoch ends."""

    def __init__(self, run: Path) -> None:
        self.run = run

    def on_event(self, event: Any) -> None:
        from ember.train import EndEpoch

        if isinstance(event, EndEpoch) and event.epoch == 1:
            path = self.run / "history.jsonl"
            path.unlink()
            path.mkdir()


def test_a_failed_write_of_the_history_is_named_as_such(tmp_path, quiet, loaders):
    run = tmp_path / "run"
    made = builder(run, quiet, epochs=3)
    made.listener(BreaksHistory(run))
    with pytest.raises(EmberError) as failed:
        fit(made, loaders)
    message = str(failed.value)
    assert f"Writing the run history {run / 'history.jsonl'} failed" in message
    assert "Writing a checkpoint failed" not in message


def test_a_failed_metric_log_write_without_a_checkpointer_does_not_suggest_resuming(
    tmp_path, quiet, loaders
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train").write_text("in the way")  # no folder can be made there
    with pytest.raises(EmberError) as failed:
        fit(builder(run, quiet, checkpoints=False), loaders)
    message = str(failed.value)
    assert "Writing the metric logs under" in message
    assert "checkpoint('latest')" not in message
    assert "this run writes no checkpoint to resume from" in message


# A second Ctrl-C ------------------------------------------------------------------------
class CtrlC:
    """A listener pressing Ctrl-C (SIGINT to this process) inside epoch 1, then again once
    the run has ended and writes its last records."""

    def on_event(self, event: Any) -> None:
        first = isinstance(event, ProcessedItem) and (
            event.split,
            event.epoch,
            event.iteration,
        ) == (
            "train",
            1,
            3,
        )
        if first or isinstance(event, End):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_second_ctrl_c_while_the_run_writes_its_last_records_does_not_cut_it_short(
    tmp_path, quiet, loaders, capfd
):
    run = tmp_path / "run"
    made = builder(run, quiet, epochs=3)
    made.listener(CtrlC())
    learner = fit(made, loaders)  # no KeyboardInterrupt
    assert learner.outcome.startswith("stopped: interrupted by Ctrl-C")
    assert learner.exit_code == 130
    assert "the run has ended and is writing its last records" in capfd.readouterr().err
    assert RunHistory.load(run / "history.jsonl").outcome == learner.outcome
    assert read_sessions(run)[-1].outcome == learner.outcome
