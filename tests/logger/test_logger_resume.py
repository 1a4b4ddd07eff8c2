"""start_run: every ember logger of a resumed run ends up as if the run had never
stopped, and several processes' values of one iteration share its step."""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import pytest
from ember_testing import read_scalars
from mlflow import MlflowClient

from ember.train.logger import (
    CsvMetricLogger,
    FileMetricLogger,
    InMemoryMetricLogger,
    MetricRecord,
    MlflowMetricLogger,
    RunStart,
    TensorBoardMetricLogger,
    read_metric_log,
    start_loggers,
    tensorboard_logger,
)
from ember.train.logger._steps import GlobalSteps, ProcessMerge

EPOCHS = 3
LENGTHS = {"train": 5, "valid": 3}


def value_of(split: str, epoch: int, iteration: int, name: str, rank: int = 0) -> float:
    return 1.0 / (iteration + 2) + 0.1 * epoch + (0.5 if split == "valid" else 0.0) + rank / 7
    # a long decimal expansion, so float32 rounding and text formats show


def records(split: str, epoch: int, iterations, processes: int = 1) -> list[MetricRecord]:
    """What the processor sends: rank 0's records, then the other ranks', by metric."""
    out = []
    for rank in range(processes):
        for name in ("Loss", "Accuracy"):
            out.extend(
                MetricRecord(name, i, value_of(split, epoch, i, name, rank), 8.0 + rank)
                for i in iterations
            )
    return out


def play(logger, start: RunStart | None = None, stop: tuple[int, int] | None = None) -> None:
    """Epochs from `start` as the learner drives a logger (two log() calls per train
    epoch, one per valid epoch), until the end or until train iteration `stop` is
    done; then close, as a stopped or finished run does."""
    start = start or RunStart()
    if hasattr(logger, "start_run"):
        logger.start_run(start)
    for epoch in range(start.epoch, EPOCHS + 1):
        first = start.iteration + 1 if epoch == start.epoch else 1
        for chunk in (
            [i for i in range(first, 6) if i <= 3],
            [i for i in range(first, 6) if i > 3],
        ):
            if chunk:
                logger.log("train", epoch, records("train", epoch, chunk))
            if stop is not None and stop[0] == epoch and chunk and chunk[-1] >= stop[1]:
                logger.close()
                return
        logger.end_epoch("train", epoch, {"Loss": 0.25 * epoch, "Accuracy": 90.0 + epoch})
        logger.log("valid", epoch, records("valid", epoch, [1, 2, 3]))
        logger.end_epoch("valid", epoch, {"Loss": 0.5 * epoch})
    logger.close()


# Each logger read back with its own reader ----------------------------------------------
def read_csv(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle))


def read_mlflow(logger: MlflowMetricLogger) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(tracking_uri=logger.client.tracking_uri)
    return {
        key: [
            (m.step, m.value)
            for m in sorted(
                client.get_metric_history(logger.run_id, key), key=lambda m: (m.step, m.timestamp)
            )
        ]
        for key in client.get_run(logger.run_id).data.metrics
    }


def read_files(directory: Path) -> dict[str, list[tuple[float, float]]]:
    return {
        str(path.relative_to(directory)): read_metric_log(path)
        for path in sorted(directory.glob("epoch-*/*.log"))
    }


# What the stopped run did, and where the resumed run starts.
STOPS = {
    # a kill in epoch 2 after its 4th iteration was logged: resume after epoch 1
    "killed mid-epoch": ((2, 4), RunStart(2, 0, resumed=True)),
    # a graceful stop after iteration 3 of epoch 2 (its checkpoint)
    "stopped mid-epoch": ((2, 3), RunStart(2, 3, resumed=True)),
    # a finished run, resumed from the checkpoint of epoch 1
    "finished, checkpoint(1)": (None, RunStart(2, 0, resumed=True)),
    # a kill in epoch 3, resumed from the mid-epoch checkpoint of epoch 2
    "killed after a stop": ((3, 2), RunStart(2, 3, resumed=True)),
}


@pytest.mark.parametrize("stop, start", STOPS.values(), ids=STOPS.keys())
def test_csv_rows_are_cut_back_to_the_checkpoint(tmp_path, stop, start):
    play(CsvMetricLogger(tmp_path / "straight.csv"))
    play(CsvMetricLogger(tmp_path / "resumed.csv"), stop=stop)
    play(CsvMetricLogger(tmp_path / "resumed.csv"), start)
    assert read_csv(tmp_path / "resumed.csv") == read_csv(tmp_path / "straight.csv")
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("stop, start", STOPS.values(), ids=STOPS.keys())
def test_memory_forgets_what_came_after_the_checkpoint(stop, start):
    straight, resumed = InMemoryMetricLogger(), InMemoryMetricLogger()
    play(straight)
    play(resumed, stop=stop)
    play(resumed, start)
    assert resumed.values == straight.values
    assert resumed.epochs == straight.epochs


@pytest.mark.parametrize("stop, start", STOPS.values(), ids=STOPS.keys())
def test_tensorboard_holds_each_step_once(tmp_path, stop, start):
    play(TensorBoardMetricLogger(tmp_path / "straight"))
    play(TensorBoardMetricLogger(tmp_path / "resumed"), stop=stop)
    play(TensorBoardMetricLogger(tmp_path / "resumed"), start)
    expected, found = read_scalars(tmp_path / "straight"), read_scalars(tmp_path / "resumed")
    assert found == expected
    assert [s for s, _ in found["train/Loss"]] == list(range(1, 3 * LENGTHS["train"] + 1))
    assert [s for s, _ in found["train/epoch/Loss"]] == [1, 2, 3]
    assert not list((tmp_path / "resumed").glob(".ember-*"))


@pytest.mark.parametrize("stop, start", STOPS.values(), ids=STOPS.keys())
def test_mlflow_does_not_log_a_step_twice(tracking_uri, stop, start, caplog):
    straight = MlflowMetricLogger(tracking_uri, interval=0.0)
    play(straight)
    first = MlflowMetricLogger(tracking_uri, interval=0.0)
    play(first, stop=stop)
    resumed = MlflowMetricLogger(tracking_uri, run_id=first.run_id, interval=0.0)
    with caplog.at_level(logging.WARNING, logger="ember"):
        play(resumed, start)
    assert read_mlflow(resumed) == read_mlflow(straight)
    assert not caplog.records  # the values held already are the ones logged again


@pytest.mark.parametrize("stop, start", STOPS.values(), ids=STOPS.keys())
def test_file_logger_drops_the_epochs_after_the_checkpoint(tmp_path, stop, start):
    play(FileMetricLogger(tmp_path / "straight"))
    play(FileMetricLogger(tmp_path / "resumed"), stop=stop)
    logger = FileMetricLogger(tmp_path / "resumed")
    logger.start_run(start)
    kept = {p.name for p in (tmp_path / "resumed").iterdir()}
    assert kept == {f"epoch-{e}" for e in range(1, start.kept_epochs() + 1)}


def test_run_start_keeps_what_came_before_the_checkpoint():
    fresh = RunStart()
    assert fresh.keeps("train", 9, 9) and fresh.keeps("valid", 9)
    mid = RunStart(3, 4, resumed=True)
    assert mid.keeps("train", 2, 99) and mid.keeps("valid", 2, 1) and mid.keeps("valid", 2)
    assert mid.keeps("train", 3, 4) and not mid.keeps("train", 3, 5)
    assert (
        not mid.keeps("valid", 3, 1) and not mid.keeps("train", 3) and not mid.keeps("train", 4, 1)
    )
    assert mid.kept_epochs() == 3 and RunStart(3, 0, resumed=True).kept_epochs() == 2


def test_start_loggers_tells_each_instance_once_and_skips_loggers_without_start_run():
    class Told:
        def __init__(self):
            self.runs = []

        def start_run(self, run):
            self.runs.append(run)

    class Plain:  # a logger written before start_run existed
        def log(self, split, epoch, records): ...

        def end_epoch(self, split, epoch, aggregates): ...

        def close(self): ...

    both, valid_only, run = Told(), Told(), RunStart(2, 3, True, 4)
    start_loggers({"train": [both, Plain()], "valid": [both, valid_only]}, run)
    assert both.runs == [run] and valid_only.runs == [run]


# Several processes ---------------------------------------------------------------------
def test_merge_gives_one_weighted_mean_per_iteration_in_step_order():
    merge = ProcessMerge(2)
    assert merge.add("train", 1, records("train", 1, [1, 2, 3])) == []  # rank 0, live
    ready = merge.add("train", 1, records("train", 1, [1, 2], 2)[4:])  # rank 1's Loss, Acc.
    # the records sent at an exchange: rank 0's latest, then rank 1's
    assert [(e, r.name, r.iteration) for e, r in ready] == [
        (1, "Loss", 1),
        (1, "Loss", 2),
        (1, "Accuracy", 1),
        (1, "Accuracy", 2),
    ]
    loss = ready[0][1]
    a, b = value_of("train", 1, 1, "Loss", 0), value_of("train", 1, 1, "Loss", 1)
    assert math.isclose(loss.value, (a * 8.0 + b * 9.0) / 17.0) and loss.weight == 17.0
    left = merge.release("train")
    assert [(s, r.name, r.iteration) for s, _, r in left] == [
        ("train", "Loss", 3),
        ("train", "Accuracy", 3),
    ]
    assert left[0][2].value == value_of("train", 1, 3, "Loss")  # only rank 0's came
    assert merge.release() == []
    one = ProcessMerge()
    assert [r for _, r in one.add("valid", 2, records("valid", 2, [1]))] == records("valid", 2, [1])


def test_two_processes_share_each_step_in_tensorboard_and_mlflow(tmp_path, tracking_uri):
    run = RunStart(processes=2)
    board = TensorBoardMetricLogger(tmp_path / "tb")
    tracking = MlflowMetricLogger(tracking_uri, interval=0.0)
    for logger in (board, tracking):
        logger.start_run(run)
        for epoch in (1, 2):
            logger.log("train", epoch, records("train", epoch, [1, 2, 3]))  # rank 0's ticks
            logger.log("train", epoch, records("train", epoch, [4, 5]))
            other = records("train", epoch, [1, 2, 3, 4, 5], 2)[10:]  # rank 1's, at the end
            logger.log("train", epoch, other)
            logger.end_epoch("train", epoch, {"Loss": 0.5})
        logger.close()
    mean = lambda e, i: (
        (8 * value_of("train", e, i, "Loss") + 9 * value_of("train", e, i, "Loss", 1)) / 17
    )
    expected = [(5 * (e - 1) + i, mean(e, i)) for e in (1, 2) for i in range(1, 6)]
    found = read_scalars(tmp_path / "tb")["train/Loss"]
    assert [s for s, _ in found] == [s for s, _ in expected]
    assert [v for _, v in found] == pytest.approx([v for _, v in expected], rel=1e-6)
    found = read_mlflow(tracking)["train/Loss"]
    assert [s for s, _ in found] == [s for s, _ in expected]
    assert [v for _, v in found] == pytest.approx([v for _, v in expected], rel=1e-15)


# Steps of resumed runs --------------------------------------------------------------------
def test_global_steps_survive_as_text_and_resume_after_the_kept_epochs():
    steps = GlobalSteps()
    for epoch, length in ((1, 5), (2, 5), (3, 5), (4, 2)):
        for iteration in range(1, length + 1):
            steps.step("train", epoch, iteration)
        steps.end_epoch("train", epoch)
    steps.step("valid", 2, 3)
    steps.end_epoch("valid", 2)
    text = steps.to_text()
    assert text == '{"train":[[5,3],[2,1]],"valid":[[0,1],[3,1]]}'
    again = GlobalSteps.from_text(text)
    assert again.to_text() == text and again.step("train", 5, 1) == 18
    again = GlobalSteps.from_text(text)
    again.resume(RunStart(3, 2, resumed=True))
    assert (again.last("train"), again.last("valid")) == (12, 3)
    assert again.step("train", 3, 3) == 13 and again.step("valid", 3, 1) == 4
    assert [again.step("train", 3, i) for i in (4, 5)] == [14, 15]
    again.end_epoch("train", 3)
    assert again.step("train", 4, 1) == 16
    with pytest.raises(ValueError):
        GlobalSteps.from_text('{"train": [[5, -1]]}')


# Damage a kill can leave -------------------------------------------------------------------
def test_a_kill_during_the_tensorboard_rewrite_is_finished_by_the_next_start(tmp_path, monkeypatch):
    play(TensorBoardMetricLogger(tmp_path / "straight"))
    resumed = tmp_path / "resumed"
    play(TensorBoardMetricLogger(resumed))
    finish = tensorboard_logger._finish_interrupted_rewrite
    calls = []

    def killed(directory):  # dies once the new file is complete, before old files go
        calls.append(directory)
        if len(calls) == 2:
            raise KeyboardInterrupt
        finish(directory)

    monkeypatch.setattr(tensorboard_logger, "_finish_interrupted_rewrite", killed)
    with pytest.raises(KeyboardInterrupt):
        TensorBoardMetricLogger(resumed).start_run(RunStart(2, 0, resumed=True))
    monkeypatch.undo()
    assert (resumed / ".ember-events.ready").exists()
    (resumed / ".ember-events.tmp").write_bytes(b"half a file")  # another write cut short
    play(TensorBoardMetricLogger(resumed), RunStart(2, 0, resumed=True))
    assert read_scalars(resumed) == read_scalars(tmp_path / "straight")
    assert not list(resumed.glob(".ember-*"))


def test_a_torn_tensorboard_record_and_a_torn_csv_row_are_dropped_on_resume(tmp_path):
    play(TensorBoardMetricLogger(tmp_path / "straight"))
    play(CsvMetricLogger(tmp_path / "straight.csv"))
    play(TensorBoardMetricLogger(tmp_path / "resumed"), stop=(2, 4))
    play(CsvMetricLogger(tmp_path / "resumed.csv"), stop=(2, 4))
    (events,) = (tmp_path / "resumed").glob("*tfevents*")
    with open(events, "ab") as handle:
        handle.write(b"\x30\x00\x00\x00\x00\x00\x00\x00\x01\x02")  # a kill mid-record
    with open(tmp_path / "resumed.csv", "ab") as handle:
        handle.write("train,2,5,Lo\xdf".encode())  # mid-row, mid-character
    play(TensorBoardMetricLogger(tmp_path / "resumed"), RunStart(2, 0, resumed=True))
    play(CsvMetricLogger(tmp_path / "resumed.csv"), RunStart(2, 0, resumed=True))
    assert read_scalars(tmp_path / "resumed") == read_scalars(tmp_path / "straight")
    assert read_csv(tmp_path / "resumed.csv") == read_csv(tmp_path / "straight.csv")


def test_tensorboard_events_without_steps_file_are_kept_with_a_warning(tmp_path, caplog):
    play(TensorBoardMetricLogger(tmp_path), stop=(2, 4))
    (tmp_path / tensorboard_logger.STEPS_FILE).unlink()  # as written by an older version
    before = read_scalars(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ember"):
        TensorBoardMetricLogger(tmp_path).start_run(RunStart(2, 0, resumed=True))
    assert "no ember-steps.json" in caplog.text
    assert read_scalars(tmp_path) == before


def test_mlflow_names_values_that_differ_or_stay_after_the_resumed_run(tracking_uri, caplog):
    first = MlflowMetricLogger(tracking_uri, interval=0.0)
    play(first)
    resumed = MlflowMetricLogger(tracking_uri, run_id=first.run_id, interval=0.0)
    resumed.start_run(RunStart(2, 0, resumed=True))
    with caplog.at_level(logging.WARNING, logger="ember"):
        resumed.log("train", 2, [MetricRecord("Loss", 1, 42.0, 1.0)])  # another value
        resumed.log("train", 2, records("train", 2, [2]))  # the same value: not sent
        resumed.close()
    assert "held train/Loss = " in caplog.text and "gives 42.0" in caplog.text
    assert "still holds values" in caplog.text and "train/Loss at step 8..15" in caplog.text
    history = read_mlflow(resumed)["train/Loss"]
    assert [s for s, _ in history].count(6) == 2 and [s for s, _ in history].count(7) == 1
