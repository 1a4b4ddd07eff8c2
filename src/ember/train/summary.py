"""The learner summary: each metric's lowest and highest epoch value, from the run history,
and the last epoch's count matrix of each matrix metric (confusion matrices). A run
that ended inside its first epoch is summarised from the metric logs of that epoch so
far, and said so; epochs missing from a history are named, never counted."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.printable import printable
from ember.train.files.artifacts import SPLITS, Artifacts
from ember.train.files.metric_files import format_value, metric_stem, read_metric_log
from ember.train.history import RunHistory, repair_hint
from ember.train.metric.base import weighted_mean

log = logging.getLogger(__name__)


def epoch_values(
    directory: str | os.PathLike[str],
) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Per (split, metric file name): the epoch values of a run, oldest first. They are
    the learner's exact values from its history (`history.jsonl`, or an earlier version's
    `history.json`); a directory without one (metric
    logs written by a hand-written loop) gets the weighted mean of each log's lines."""
    artifacts = Artifacts(directory)
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    saved = artifacts.saved_history
    if saved is not None:
        for epoch, values in RunHistory.load(saved).epochs:
            for split in SPLITS:
                for name, value in values.get(split, {}).items():
                    stem = metric_stem(name)
                    series.setdefault((split, stem), []).append((epoch, value))
        return series
    return log_means(artifacts)


def log_means(artifacts: Artifacts) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Per (split, metric file name): the weighted mean of each epoch's metric log lines."""
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for split in SPLITS:
        for epoch, stem, path in artifacts.metric_logs(split):
            lines = _rows(path)
            if lines:
                series.setdefault((split, stem), []).append((epoch, weighted_mean(lines)))
    return series


def _rows(path: Path) -> list[tuple[float, float]]:
    """A metric log's rows; a damaged log's rows before the damage, with a warning that
    names the file, the line and the fix."""
    damage: list[str] = []
    rows = read_metric_log(path, damage)
    for problem in damage:
        log.warning("warning: %s", problem)
    return rows


def point_values(directory: str | os.PathLike[str]) -> dict[str, list[tuple[int, int, float]]]:
    """Per metric file name: the values of the validations inside epochs
    (`valid_every`) as (epoch, training batches before it, value), in order. Each is
    the weighted mean of its `valid/epoch-N/iteration-K/<Metric>.log`, or the history's
    exact value where the history has the point (whole-set metrics such as AUROC)."""
    artifacts = Artifacts(directory)
    exact: dict[tuple[int, int, str], float] = {}
    saved = artifacts.saved_history
    if saved is not None:
        for epoch, iteration, values in RunHistory.load(saved).points:
            for name, value in values.get("valid", {}).items():
                exact[(epoch, iteration, metric_stem(name))] = value
    series: dict[str, list[tuple[int, int, float]]] = {}
    for epoch in sorted(artifacts.epoch_dirs("valid")):
        for iteration, folder in sorted(artifacts.point_dirs(epoch).items()):
            for path in sorted(folder.glob("*.log")):
                found = exact.get((epoch, iteration, path.stem))
                if found is None:
                    lines = _rows(path)
                    if not lines:
                        continue
                    found = weighted_mean(lines)
                series.setdefault(path.stem, []).append((epoch, iteration, found))
    return series


def unfinished_epoch(
    directory: str | os.PathLike[str],
) -> tuple[dict[tuple[str, str], list[tuple[int, float]]], str | None]:
    """A run whose history holds no epoch (it stopped or failed inside the first one):
    the weighted means of the metric logs of that epoch so far, and a note saying so."""
    series = log_means(Artifacts(directory))
    if not series:
        return series, None
    epochs = sorted({epoch for values in series.values() for epoch, _ in values})
    where = ", ".join(map(str, epochs))
    return series, (
        f"no epoch ended: the values are the means of the metric log lines of epoch {where} "
        "so far (whole-epoch metrics, such as AUROC, are not the means of their lines)"
    )


@dataclass(frozen=True)
class MetricSummary:
    split: str
    name: str
    minimum: float
    min_epoch: int
    maximum: float
    max_epoch: int


@dataclass(frozen=True)
class MatrixSummary:
    """The last epoch's count matrix of a matrix metric (rows: targets, columns:
    predictions)."""

    split: str
    name: str
    epoch: int
    counts: tuple[tuple[int, ...], ...]

    def table(self) -> str:
        """The counts as a plain-text table, target classes down, predicted across."""
        size = len(self.counts)
        header = ["target \\ predicted", *(str(k) for k in range(size))]
        body = [[str(k), *(str(cell) for cell in row)] for k, row in enumerate(self.counts)]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(size + 1)]

        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        title = printable(f"{self.name} ({self.split}, epoch {self.epoch})")
        return "\n".join([title, line(header), rule, *(line(row) for row in body)])


def last_matrices(directory: str | os.PathLike[str]) -> tuple[MatrixSummary, ...]:
    """Per split and matrix metric, its matrix of the latest epoch that saved one."""
    artifacts = Artifacts(directory)
    found: dict[tuple[str, str], MatrixSummary] = {}
    for split in SPLITS:
        for epoch, name, counts in artifacts.matrices(split):
            rows = tuple(tuple(row) for row in counts)
            found[(split, name)] = MatrixSummary(split, name, epoch, rows)
    return tuple(found.values())


@dataclass(frozen=True)
class LearnerSummary:
    """What `ember summary DIR` prints: per split and metric, min and max epoch values."""

    artifact_dir: Path
    epochs: int
    model: str | None
    num_parameters: int | None
    metrics: tuple[MetricSummary, ...]
    matrices: tuple[MatrixSummary, ...] = ()
    outcome: str | None = None
    """How the run ended (`history.json`), or None while it runs or when unknown."""
    note: str | None = None
    """What the table does not show as it is: epochs missing from the history, or values
    of an epoch that did not end (read from its metric logs)."""

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> LearnerSummary:
        root = Path(directory)
        if not root.is_dir():
            raise EmberError(f"{root}: no such artifact directory.")
        rows: list[MetricSummary] = []
        series = epoch_values(root)
        note = None
        if not series and Artifacts(root).saved_history is not None:
            series, note = unfinished_epoch(root)
        seen = sorted({epoch for values in series.values() for epoch, _ in values})
        missing = sorted(set(range(1, seen[-1] + 1)).difference(seen)) if seen else []
        if missing and note is None:
            listing = ", ".join(map(str, missing))
            note = (
                f"no values of epoch(s) {listing} in the history: its lines were lost "
                f"({repair_hint(root)})"
            )
        for (split, name), values in series.items():
            low = min(values, key=lambda item: item[1])
            high = max(values, key=lambda item: item[1])
            rows.append(
                MetricSummary(split, name.replace("_", " "), low[1], low[0], high[1], high[0])
            )
        if not rows:
            raise EmberError(
                f"{root} holds no metric logs (expected train/epoch-N/<Metric>.log): "
                "is it an ember artifact directory?"
            )
        model, parameters, outcome = None, None, None
        history = Artifacts(root).saved_history
        if history is not None:
            saved = RunHistory.load(history)
            model, parameters, outcome = saved.model, saved.num_parameters, saved.outcome
        return cls(
            root, len(seen), model, parameters, tuple(rows), last_matrices(root), outcome, note
        )

    def table(self) -> str:
        """A plain-text table, for terminals and experiment.log alike."""
        header = ("Split", "Metric", "Min.", "Epoch", "Max.", "Epoch")
        body = [
            (
                printable(m.split),
                printable(m.name),
                format_value(m.minimum),
                str(m.min_epoch),
                format_value(m.maximum),
                str(m.max_epoch),
            )
            for m in self.metrics
        ]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

        def line(cells: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        model = (
            f"{printable(self.model)}, {self.num_parameters:,} parameters"
            if self.model
            else "model unknown"
        )
        ended = f"; outcome: {printable(self.outcome)}" if self.outcome is not None else ""
        where = printable(self.artifact_dir)
        lines = [f"Summary of {where}: {self.epochs} epochs, {model}{ended}"]
        if self.note is not None:
            lines.append(f"Note: {printable(self.note)}")
        lines += [line(header), rule]
        lines += [line(row) for row in body]
        for matrix in self.matrices:
            lines += ["", matrix.table()]
        return "\n".join(lines)
