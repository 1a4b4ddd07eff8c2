"""The learner summary: each numeric metric's best and worst epoch, read from disk."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ember.errors import EmberError
from ember.train.logger.file import read_metric_log, weighted_mean
from ember.train.run import epoch_dirs

_PARAMETERS = re.compile(r"Training (\S+) \(([\d,]+) parameters\)")


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
        last_epoch = 0
        for split in ("train", "valid"):
            values: dict[str, list[tuple[int, float]]] = {}
            for epoch, folder in sorted(epoch_dirs(root / split).items()):
                last_epoch = max(last_epoch, epoch)
                for log in sorted(folder.glob("*.log")):
                    lines = read_metric_log(log)
                    if lines:
                        values.setdefault(log.stem, []).append((epoch, weighted_mean(lines)))
            for name, series in values.items():
                low = min(series, key=lambda item: item[1])
                high = max(series, key=lambda item: item[1])
                rows.append(MetricSummary(split, name, low[1], low[0], high[1], high[0]))
        if not rows:
            raise EmberError(
                f"{root} holds no metric logs (expected train/epoch-N/<Metric>.log): "
                "is it an ember artifact directory?"
            )
        model, parameters = None, None
        log_path = root / "experiment.log"
        if log_path.exists():
            for match in _PARAMETERS.finditer(log_path.read_text(encoding="utf-8", errors="replace")):
                model, parameters = match.group(1), int(match.group(2).replace(",", ""))
        return cls(root, last_epoch, model, parameters, tuple(rows))

    def table(self) -> str:
        """A plain-text table, for terminals and experiment.log alike."""
        header = ("Split", "Metric", "Min.", "Epoch", "Max.", "Epoch")
        body = [
            (m.split, m.name, f"{m.minimum:.6g}", str(m.min_epoch), f"{m.maximum:.6g}", str(m.max_epoch))
            for m in self.metrics
        ]
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

        def line(cells: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        model = f"{self.model}, {self.num_parameters:,} parameters" if self.model else "model unknown"
        lines = [f"Summary of {self.artifact_dir}: {self.epochs} epochs, {model}", line(header), rule]
        lines += [line(row) for row in body]
        return "\n".join(lines)
