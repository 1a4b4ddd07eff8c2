"""CsvMetricLogger: one CSV file of iteration rows and epoch rows, continued when reopened."""

from __future__ import annotations

import csv

import pytest
from logger_driver import drive

from ember.errors import EmberError
from ember.train.logger import CsvMetricLogger, MetricLogger, MetricRecord

HEADER = ["split", "epoch", "iteration", "metric", "value", "weight", "kind"]


def read_rows(path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def expected_rows(expected) -> list[dict[str, str]]:
    """The rows in write order: each split's iteration rows, then its epoch rows."""
    rows = []
    epochs = iter(expected.epochs)
    by_split_epoch: dict[tuple[str, int], list] = {}
    for split, epoch, iteration, name, value, weight, _ in expected.iterations:
        by_split_epoch.setdefault((split, epoch), []).append(
            {
                "split": split,
                "epoch": str(epoch),
                "iteration": str(iteration),
                "metric": name,
                "value": value,
                "weight": weight,
                "kind": "iteration",
            }
        )
    for split, epoch, name, value in epochs:
        rows.extend(by_split_epoch.pop((split, epoch), []))
        rows.append(
            {
                "split": split,
                "epoch": str(epoch),
                "iteration": "",
                "metric": name,
                "value": value,
                "weight": "",
                "kind": "epoch",
            }
        )
    return rows


def parsed(rows: list[dict[str, str]]) -> list[dict]:
    """Rows with value and weight read back as floats (exact: the text round-trips)."""
    out = []
    for row in rows:
        row = dict(row)
        row["value"] = float(row["value"])
        row["weight"] = float(row["weight"]) if row["weight"] != "" else ""
        out.append(row)
    return out


def test_rows_read_back_exactly_with_the_csv_module(tmp_path):
    path = tmp_path / "runs" / "metrics.csv"
    logger = CsvMetricLogger(path)
    assert isinstance(logger, MetricLogger)
    expected = drive(logger)
    header, rows = read_rows(path)
    assert header == HEADER
    assert parsed(rows) == expected_rows(expected)
    assert {row["kind"] for row in rows} == {"iteration", "epoch"}
    assert path.read_text(encoding="utf-8").count("split,epoch") == 1


def test_rows_are_flushed_at_every_call(tmp_path):
    path = tmp_path / "metrics.csv"
    logger = CsvMetricLogger(path)
    logger.log("train", 1, [MetricRecord("Loss", 1, 0.1, 4.0)])
    assert [row["value"] for row in read_rows(path)[1]] == ["0.1"]
    logger.end_epoch("train", 1, {"Loss": 0.1})
    assert [row["kind"] for row in read_rows(path)[1]] == ["iteration", "epoch"]
    logger.close()


def test_an_existing_file_is_continued_and_a_torn_last_row_dropped(tmp_path):
    path = tmp_path / "metrics.csv"
    first = CsvMetricLogger(path)
    first.log("train", 1, [MetricRecord("Loss", 1, 0.5, 4.0)])
    first.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("train,1,2,Loss,0.2")  # a kill mid-write
    second = CsvMetricLogger(path)
    second.log("train", 1, [MetricRecord("Loss", 2, 0.25, 4.0)])
    second.close()
    second.log("train", 1, [MetricRecord("Loss", 3, 0.125, 4.0)])  # reopens after close
    second.close()
    header, rows = read_rows(path)
    assert header == HEADER
    assert [(row["iteration"], row["value"], row["weight"]) for row in rows] == [
        ("1", "0.5", "4"),
        ("2", "0.25", "4"),
        ("3", "0.125", "4"),
    ]


def test_a_file_with_another_header_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b,c\n1,2,3\n", encoding="utf-8")
    with pytest.raises(EmberError, match="another header"):
        CsvMetricLogger(path)
    assert path.read_text(encoding="utf-8") == "a,b,c\n1,2,3\n"


def test_metric_names_with_commas_and_quotes_survive(tmp_path):
    path = tmp_path / "metrics.csv"
    logger = CsvMetricLogger(path)
    name = 'F1, "macro"'
    logger.log("valid", 3, [MetricRecord(name, 7, float("nan"), 0.5)])
    logger.end_epoch("valid", 3, {name: float("inf")})
    logger.close()
    rows = read_rows(path)[1]
    assert [row["metric"] for row in rows] == [name, name]
    assert rows[0]["weight"] == "0.5" and rows[0]["value"] == "nan"
    assert float(rows[1]["value"]) == float("inf")
