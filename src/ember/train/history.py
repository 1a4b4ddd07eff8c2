"""The exact history of a run: every epoch's values, the checkpoint epochs, the outcome.

The learner keeps it in memory and writes it atomically to `history.json` in the
artifact directory at every epoch end (and when its checkpoints or its outcome
change). Summaries, plots, early stopping and the best-checkpoint choice read it;
nothing parses numbers back from `experiment.log`, which is text for people.

`history.json` (format "ember-history", version 1):

```
{"format": "ember-history", "version": 1,
 "model": "Model", "num_parameters": 7850,
 "epochs": [{"epoch": 1, "train": {"Loss": 0.3101..., "Accuracy": 91.2...},
             "valid": {"Loss": 0.2233...}}],
 "checkpoints": [1],
 "outcome": "completed", "stop_reason": {"reason": "completed"}}
```

Values are the learner's epoch values at full precision (floats written as their
shortest round-tripping text); NaN and infinities are the strings "nan", "inf" and
"-inf". `checkpoints` lists the epochs with a complete checkpoint after retention;
`outcome` and `stop_reason` are null while the run has not ended. `stop_reason` was
added later in version 1: readers take a missing key as null.

A run that validates inside its epochs (`valid_every`) adds `"points"`, one object per
mid-epoch validation, oldest first: `{"epoch": 2, "iteration": 40, "valid": {...}}`
(the epoch and the training batches done in it when the point ran). Files without
points (and readers that do not know the key) are unchanged: the key is written only
when a point exists, and a file without it reads as having none.
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from ember.errors import ConfigError, EmberError

History = Sequence[tuple[int, Mapping[str, Mapping[str, float]]]]
"""Completed epochs in order: (epoch, {split: {metric name: epoch value}})."""

Points = Sequence[tuple[int, "int | None", Mapping[str, Mapping[str, float]]]]
"""Validation points in order: (epoch, iteration, {"valid": {metric name: value}}), the
iteration being the training batches done in the epoch, or None for the validation at
the epoch's end."""

FORMAT = "ember-history"
VERSION = 1


def metric_name(metric: Any) -> str:
    """The name under which a metric (or a metric's name) appears in a history."""
    return metric if isinstance(metric, str) else str(metric.name)


@dataclass(frozen=True)
class Monitor:
    """One metric of one split, and which way is better: what early stopping and the
    best-checkpoint choice watch."""

    name: str
    split: str = "valid"
    direction: str = "lowest"

    @classmethod
    def of(
        cls,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
    ) -> Monitor:
        """A checked monitor: `aggregate` is the epoch value ("mean"), `direction` says
        which way is better, `split` which split's value is read."""
        if aggregate != "mean":
            raise ConfigError(f"aggregate must be 'mean' (the epoch value), got {aggregate!r}.")
        if direction not in ("lowest", "highest"):
            raise ConfigError(f"direction must be 'lowest' or 'highest', got {direction!r}.")
        if split not in ("train", "valid"):
            raise ConfigError(f"split must be 'train' or 'valid', got {split!r}.")
        return cls(metric_name(metric), split, direction)

    def series(self, history: History) -> list[tuple[int, float]]:
        """(epoch, value) of every epoch that has a value that is not NaN."""
        return [
            (epoch, float(values[self.split][self.name]))
            for epoch, values in history
            if self.name in values.get(self.split, {})
            and not math.isnan(values[self.split][self.name])
        ]

    def point_series(self, points: Points) -> list[tuple[int, int | None, float]]:
        """(epoch, iteration, value) of every point that has a value that is not NaN."""
        return [
            (epoch, iteration, float(values[self.split][self.name]))
            for epoch, iteration, values in points
            if self.name in values.get(self.split, {})
            and not math.isnan(values[self.split][self.name])
        ]

    def best(self, history: History) -> tuple[int, float] | None:
        """The best epoch and its value (the earliest one on a tie), or None."""
        sign = 1.0 if self.direction == "lowest" else -1.0
        best: tuple[int, float] | None = None
        for epoch, value in self.series(history):
            if best is None or sign * value < sign * best[1]:
                best = (epoch, value)
        return best


class RunHistory:
    """The history of one run, in memory and (with a `path`) in `history.json`.

    Methods may be called from the checkpoint writer's thread (`set_checkpoints`) and
    the training thread; a lock keeps each change and its file write together.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.epochs: list[tuple[int, dict[str, dict[str, float]]]] = []
        self.checkpoints: list[int] = []
        self.points: list[tuple[int, int, dict[str, dict[str, float]]]] = []
        """Mid-epoch validation points: (epoch, iteration, {"valid": {metric: value}})."""
        self.outcome: str | None = None
        self.stop_reason: dict[str, Any] | None = None
        """Why the run ended, once it has (`Outcome.to_json()`: "reason", and for early
        stopping "rule", "split", "metric", "epoch", "value", "reference")."""
        self.model: str | None = None
        self.num_parameters: int | None = None
        self._lock = threading.Lock()

    # Changes (each one written at once) ---------------------------------------------
    def describe_model(self, model: str, num_parameters: int) -> None:
        with self._lock:
            self.model, self.num_parameters = model, num_parameters
            self._write()

    def add_epoch(self, epoch: int, values: Mapping[str, Mapping[str, float]]) -> None:
        """The epoch values of a completed epoch (a redone epoch replaces the old one)."""
        entry = {split: dict(split_values) for split, split_values in values.items()}
        with self._lock:
            self.epochs = [(e, v) for e, v in self.epochs if e < epoch]
            self.epochs.append((epoch, entry))
            self._write()

    def add_point(
        self, epoch: int, iteration: int, values: Mapping[str, Mapping[str, float]]
    ) -> None:
        """The values of a validation point inside `epoch`, after `iteration` batches."""
        entry = {split: dict(split_values) for split, split_values in values.items()}
        with self._lock:
            self.points = [p for p in self.points if (p[0], p[1]) < (epoch, iteration)]
            self.points.append((epoch, iteration, entry))
            self._write()

    def keep_before(self, epoch: int, iteration: int = 0) -> None:
        """Forget the epochs from `epoch` on (a run resumed before them redoes them), and
        the validation points after `iteration` batches of `epoch`."""
        with self._lock:
            self.epochs = [(e, v) for e, v in self.epochs if e < epoch]
            self.points = [p for p in self.points if (p[0], p[1]) <= (epoch, iteration)]
            self.checkpoints = [e for e in self.checkpoints if e < epoch]
            self.outcome = None
            self.stop_reason = None
            self._write()

    def set_checkpoints(self, epochs: Sequence[int]) -> None:
        with self._lock:
            self.checkpoints = sorted(int(e) for e in epochs)
            self._write()

    def finish(self, outcome: str) -> None:
        """The run ended: its outcome text, and its reason when `outcome` is an `Outcome`."""
        to_json = getattr(outcome, "to_json", None)
        with self._lock:
            self.outcome = str(outcome)
            self.stop_reason = to_json() if callable(to_json) else None
            self._write()

    # Reading --------------------------------------------------------------------------
    def entries(self) -> list[tuple[int, dict[str, dict[str, float]]]]:
        """A copy of the epochs, as `History` (safe to hand to another thread)."""
        with self._lock:
            return [(e, {s: dict(v) for s, v in values.items()}) for e, values in self.epochs]

    def point_entries(self) -> list[tuple[int, int, dict[str, dict[str, float]]]]:
        """A copy of the mid-epoch validation points (safe to hand to another thread)."""
        with self._lock:
            return [(e, i, {s: dict(v) for s, v in values.items()}) for e, i, values in self.points]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "num_parameters": self.num_parameters,
            "epochs": [
                {"epoch": epoch, **{s: _encode(v) for s, v in values.items()}}
                for epoch, values in self.epochs
            ],
            "checkpoints": list(self.checkpoints),
            "outcome": self.outcome,
            "stop_reason": self.stop_reason,
        }
        if self.points:
            data["points"] = [
                {
                    "epoch": epoch,
                    "iteration": iteration,
                    **{s: _encode(v) for s, v in values.items()},
                }
                for epoch, iteration, values in self.points
            ]
        return data

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunHistory:
        """Read `history.json`; a missing, torn or foreign file is an `EmberError` naming it."""
        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EmberError(f"{file}: no such history file.") from None
        except (OSError, ValueError) as error:
            raise EmberError(f"{file} is not a readable run history: {error}.") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise EmberError(f"{file} is not an ember run history (no format {FORMAT!r}).")
        if data.get("version") != VERSION:
            raise EmberError(
                f"{file} has history version {data.get('version')!r}; this ember reads "
                f"version {VERSION}. Upgrade ember to read it."
            )
        history = cls(file)
        try:
            for entry in data["epochs"]:
                values = {
                    split: {str(k): _decode(v) for k, v in split_values.items()}
                    for split, split_values in entry.items()
                    if split != "epoch"
                }
                history.epochs.append((int(entry["epoch"]), values))
            history.checkpoints = [int(e) for e in data.get("checkpoints", [])]
            for entry in data.get("points", []):
                values = {
                    split: {str(k): _decode(v) for k, v in split_values.items()}
                    for split, split_values in entry.items()
                    if split not in ("epoch", "iteration")
                }
                history.points.append((int(entry["epoch"]), int(entry["iteration"]), values))
            history.outcome = data.get("outcome")
            history.stop_reason = data.get("stop_reason")
            history.model = data.get("model")
            history.num_parameters = data.get("num_parameters")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise EmberError(f"{file}: malformed run history ({error!r}).") from None
        return history

    def _write(self) -> None:
        if self.path is None:
            return
        from ember.record.atomic import atomic_write_bytes  # ember.record loads msgpack

        text = json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, text.encode("utf-8"))


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _encode(values: Mapping[str, float]) -> dict[str, float | str]:
    return {name: value if math.isfinite(value) else repr(value) for name, value in values.items()}


def _decode(value: Any) -> float:
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"not a number: {value!r}")
        return _NON_FINITE[value]
    return float(value)
