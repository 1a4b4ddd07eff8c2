"""The learner summary: each numeric metric's best and worst epoch, read from disk."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.train.logger.file import metric_file_name, read_metric_log, weighted_mean
from ember.train.run import epoch_dirs

_PARAMETERS = re.compile(r"Training (\S+) \(([\d,]+) parameters\)")
_EPOCH_LINE = re.compile(r" Epoch (\d+) (train|valid): (.*)$")
_PAIR = re.compile(r"(.+?) (-?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|nan|-?inf)(?:, |$)")


def logged_epoch_values(directory: Path) -> dict[tuple[str, int, str], float]:
    """Epoch values as the learner computed them, from `experiment.log` (the last line
    per epoch wins, so a resumed run's values replace the ones it redid). These are
    exact for metrics whose epoch value is not a mean of batches (AUROC, F-beta...)."""
    values: dict[tuple[str, int, str], float] = {}
    path = directory / "experiment.log"
    if not path.exists():
        return values
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _EPOCH_LINE.search(line)
        if not match:
            continue
        epoch, split = int(match.group(1)), match.group(2)
        for name, number in _PAIR.findall(match.group(3)):
            values[(split, epoch, metric_file_name(name)[: -len(".log")])] = float(number)
    return values


def epoch_values(
    directory: str | os.PathLike[str],
) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """Per (split, metric file name): the epoch values of a run, oldest first. A value
    the learner logged is used as is; otherwise the weighted mean of the log's lines."""
    root = Path(directory)
    logged = logged_epoch_values(root)
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for split in ("train", "valid"):
        for epoch, folder in sorted(epoch_dirs(root / split).items()):
            for log in sorted(folder.glob("*.log")):
                value = logged.get((split, epoch, log.stem))
                if value is None:
                    lines = read_metric_log(log)
                    if not lines:
                        continue
                    value = weighted_mean(lines)
                series.setdefault((split, log.stem), []).append((epoch, value))
    return series


@dataclass(frozen=True)
class MetricSummary:
    split: str
    name: str
    minimum: float
    min_epoch: int
    maximum: float
    max_epoch: int


@dataclass(frozen=True)
class LearnerSummary:
    """What `ember summary DIR` prints: per split and metric, min and max epoch values."""

    artifact_dir: Path
    epochs: int
    model: str | None
    num_parameters: int | None
    metrics: tuple[MetricSummary, ...]

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> LearnerSummary:
        root = Path(directory)
        if not root.is_dir():
            raise EmberError(f"{root}: no such artifact directory.")
        rows: list[MetricSummary] = []
        series = epoch_values(root)
        last_epoch = max((epoch for values in series.values() for epoch, _ in values), default=0)
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
        model, parameters = None, None
        log_path = root / "experiment.log"
        if log_path.exists():
            for match in _PARAMETERS.finditer(
                log_path.read_text(encoding="utf-8", errors="replace")
            ):
                model, parameters = match.group(1), int(match.group(2).replace(",", ""))
        return cls(root, last_epoch, model, parameters, tuple(rows))

    def table(self) -> str:
        """A plain-text table, for terminals and experiment.log alike."""
        header = ("Split", "Metric", "Min.", "Epoch", "Max.", "Epoch")
        body = [
            (
                m.split,
                m.name,
                f"{m.minimum:.6g}",
                str(m.min_epoch),
                f"{m.maximum:.6g}",
                str(m.max_epoch),
            )
            for m in self.metrics
        ]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

        def line(cells: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        model = (
            f"{self.model}, {self.num_parameters:,} parameters" if self.model else "model unknown"
        )
        lines = [
            f"Summary of {self.artifact_dir}: {self.epochs} epochs, {model}",
            line(header),
            rule,
        ]
        lines += [line(row) for row in body]
        return "\n".join(lines)
