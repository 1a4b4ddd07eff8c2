"""Metric logs are as trustworthy as the other records: each line carries a check
chained on the line before, a resume refuses a damaged log of the epoch it goes on with
(naming the file, the line and the fix), `ember repair` makes the logs whole again where
their lines are still there, and readers of finished epochs warn about a damaged one."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest
from ember_testing import Classifier, StopAt, blob_builder

from ember.cli import main
from ember.errors import RunRecordError
from ember.optim import AdamConfig
from ember.record import DefaultRecorder
from ember.train.files.metric_files import read_metric_log, scan_log
from ember.train.history import RunHistory


def builder(run: Path, quiet: Any, epochs: int = 3, every: int | None = None) -> Any:
    made = blob_builder(run, quiet).num_epochs(epochs).with_file_checkpointer(DefaultRecorder())
    return made.valid_every(every) if every else made


def fit(made: Any, loaders: Any) -> Any:
    learner = made.build(Classifier(), AdamConfig().init(), 1e-2)
    learner.fit(*loaders)
    return learner


def stopped(run: Path, quiet: Any, loaders: Any, every: int | None = None) -> Any:
    """A run stopped inside epoch 2, after its 4th training batch."""
    made = builder(run, quiet, every=every)
    return fit(made.listener(StopAt(made.interrupter(), 2, 4)), loaders)


def resumed(run: Path, quiet: Any, loaders: Any, every: int | None = None, at: Any = "latest"):
    return fit(builder(run, quiet, every=every).checkpoint(at), loaders)


def test_each_line_carries_a_check_chained_on_the_line_before(tmp_path, quiet, loaders):
    run = tmp_path / "run"
    fit(builder(run, quiet, epochs=1), loaders)
    lines = (run / "train/epoch-1/Loss.log").read_text().splitlines()
    chain = 0
    for line in lines:
        body, _, check = line.rpartition(",")
        chain = zlib.crc32(body.encode(), chain)
        assert check == f"{chain:08x}"
    assert len(read_metric_log(run / "train/epoch-1/Loss.log")) == len(lines) == 7


def test_a_log_of_an_earlier_version_is_read_unchecked(tmp_path):
    log = tmp_path / "Loss.log"
    log.write_text("0.5,32\n0.25,32\n")
    found = scan_log(log)
    assert found.rows == [(0.5, 32.0), (0.25, 32.0)] and not found.checked


def damage_line_2(text: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[1] = lines[1].replace(lines[1][2], "7" if lines[1][2] != "7" else "3", 1)
    return "".join(lines)


DAMAGE = {
    "edited digit": lambda data: damage_line_2(data.decode()).encode(),
    "dropped line": lambda data: b"".join(data.splitlines(keepends=True)[i] for i in (0, 2, 3)),
    "duplicated line": lambda data: b"".join(
        data.splitlines(keepends=True)[i] for i in (0, 1, 1, 2, 3)
    ),
    "zeroed bytes": lambda data: data[:20] + b"\0" * 8 + data[28:],
    "not UTF-8": lambda data: data[:20] + b"\xff\xfe" + data[22:],
    "truncated": lambda data: data[: len(data) - 10],
    "deleted": None,
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_log_of_the_open_epoch_refuses_the_resume_and_repair_names_the_way_on(
    tmp_path, quiet, loaders, capsys, kind
):
    run = tmp_path / "run"
    stopped(run, quiet, loaders)
    log = run / "train/epoch-2/Loss.log"
    assert len(log.read_text().splitlines()) == 4
    if DAMAGE[kind] is None:
        log.unlink()
    else:
        log.write_bytes(DAMAGE[kind](log.read_bytes()))
    with pytest.raises(RunRecordError) as info:
        resumed(run, quiet, loaders)
    message = str(info.value)
    assert str(log) in message and f"ember repair {run}" in message, message
    assert "\n" not in message
    if kind not in ("truncated", "deleted"):
        assert f"{log}, line " in message
    assert main(["repair", str(run)]) == 0
    said = capsys.readouterr().out
    assert "train/epoch-2/Loss.log" in said and "checkpoint(1)" in said, said
    assert "Nothing to repair" not in said
    learner = resumed(run, quiet, loaders, at=1)
    assert learner.outcome == "completed"
    assert len(read_metric_log(run / "train/epoch-2/Loss.log")) == 7


def test_damage_after_the_lines_the_checkpoint_counted_is_cut_by_repair_and_resumes_exactly(
    tmp_path, quiet, loaders, capsys
):
    run, whole = tmp_path / "run", tmp_path / "whole"
    stopped(run, quiet, loaders)
    shutil.copytree(run, whole)
    exact = resumed(whole, quiet, loaders)
    log = run / "train/epoch-2/Loss.log"
    with log.open("a") as file:
        file.write("0.1,32,00000000\ngarbage\n")  # lines no checkpoint counted, damaged
    assert main(["repair", str(run)]) == 0
    said = capsys.readouterr().out
    assert "cut back to the 4 line(s) the checkpoint counted" in said
    assert (run / "train/epoch-2/Loss.log.damaged").exists()
    learner = resumed(run, quiet, loaders)
    assert learner.history == exact.history


def test_a_damaged_log_of_a_finished_epoch_is_warned_about_and_repaired(
    tmp_path, quiet, loaders, capsys, caplog
):
    run = tmp_path / "run"
    fit(builder(run, quiet, epochs=2), loaders)
    log = run / "train/epoch-1/Loss.log"
    log.write_bytes(DAMAGE["not UTF-8"](log.read_bytes()))
    from ember.train.files.artifacts import Artifacts
    from ember.train.summary import log_means

    log_means(Artifacts(run))
    assert f"{log}, line 1: it is not UTF-8 text" in caplog.text
    assert f"ember repair {run}" in caplog.text
    assert main(["repair", str(run)]) == 0
    said = capsys.readouterr().out
    assert "train/epoch-1/Loss.log: line 1: it is not UTF-8 text" in said
    assert read_metric_log(log) == []
    assert main(["repair", str(run)]) == 0
    assert "Nothing to repair" in capsys.readouterr().out


def test_ember_repair_rebuilds_every_validation_point_from_its_logs(
    tmp_path, quiet, loaders, capsys
):
    run = tmp_path / "run"
    stopped(run, quiet, loaders, every=2)
    history = RunHistory.load(run / "history.jsonl")
    points = [(e, i) for e, i, _ in history.points]
    assert len(points) >= 4
    (run / "history.jsonl").unlink()
    assert main(["repair", str(run)]) == 0
    assert "validation point(s)" in capsys.readouterr().out
    repaired = RunHistory.load(run / "history.jsonl")
    assert [(e, i) for e, i, _ in repaired.points] == points
    for (_, _, exact), (_, _, rebuilt) in zip(history.points, repaired.points):
        assert rebuilt["valid"]["Loss"] == pytest.approx(exact["valid"]["Loss"])
    assert resumed(run, quiet, loaders, every=2).outcome == "completed"


def test_a_history_cut_inside_its_last_lines_is_repaired_and_the_run_resumes(
    tmp_path, quiet, loaders, capsys
):
    run = tmp_path / "run"
    stopped(run, quiet, loaders, every=2)
    path = run / "history.jsonl"
    data = path.read_bytes()
    starts = [n + 1 for n, byte in enumerate(data[:-1]) if byte == ord("\n")]
    path.write_bytes(data[: starts[-3] + 20])  # inside the third line from the end
    with pytest.raises(RunRecordError, match="ember repair"):
        resumed(run, quiet, loaders, every=2)
    assert main(["repair", str(run)]) == 0
    said = capsys.readouterr().out
    assert "Nothing to repair" not in said and "history.jsonl" in said
    assert resumed(run, quiet, loaders, every=2).outcome == "completed"


def test_an_evaluation_log_reads_back_checked(tmp_path, quiet, loaders):
    run = tmp_path / "run"
    learner = fit(builder(run, quiet, epochs=1), loaders)
    learner.evaluate("test", loaders[0])
    logs = sorted((run / "test/test").glob("*.log"))
    assert logs
    for path in logs:
        found = scan_log(path)
        assert found.checked and not found.damaged and len(found.rows) == 7


def test_a_log_replaced_by_another_intact_one_refuses_the_resume(tmp_path, quiet, loaders):
    """The checkpoint notes the check of each open log's last counted line: a log put
    in its place with whole, chained lines of other values is told apart, not resumed."""
    from ember.train.files.metric_files import format_line

    run = tmp_path / "run"
    stopped(run, quiet, loaders)
    scheduler = DefaultRecorder().load(None, run / "checkpoint" / "scheduler-2")
    noted = scheduler["log_checks"]
    log = run / "train/epoch-2/Loss.log"
    assert noted["Loss"] == log.read_text().splitlines()[-1].rsplit(",", 1)[1]
    lines, chain = [], 0
    for value in (0.9, 0.8, 0.7, 0.6, 0.5):  # intact, chained, and one line longer
        line = format_line(value, 16, chain)
        chain = int(line.rsplit(",", 1)[1], 16)
        lines.append(line)
    log.write_text("".join(lines))
    with pytest.raises(RunRecordError) as info:
        resumed(run, quiet, loaders)
    message = str(info.value)
    assert f"{log}, line 4: its line 4 is not the line the checkpoint counted" in message
    assert "Put back the log the run wrote, or resume from the checkpoint of an earlier" in message
