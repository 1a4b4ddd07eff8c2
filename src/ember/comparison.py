"""Comparing runs: `ember compare DIR...` and `ember runs ROOT`, and the same in Python.

Everything is read from the artifact directories alone: the epoch values and outcome
from `history.jsonl` (through `ember.train.history`), the hyperparameters from
`hparams.json`, the time spent training from `sessions.json`, and whether a run is
going on from its lock. Runs in progress are read as they stand; a run missing one of
these files (written by an older ember, or not by the learner) is shown with what
it has and a note that names what is missing; a run whose records are damaged (or
whose history a resume from its newest checkpoint would refuse) is shown as
"damaged", with what can still be read and the fix (`ember repair DIR`).

```python
import ember

table = ember.compare(["runs/a", "runs/b"])
print(table)                # one row per run
table.rows[0].metrics       # {(split, metric): MetricStats(best, best_epoch, final, ...)}
table.chart("Loss")         # a figure (shown inline in a notebook)
table.plot("charts")        # one PNG per metric
```
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ember.durable import atomic_write_bytes
from ember.errors import EmberError, RunRecordError
from ember.figures import (
    LEGEND_ROWS,
    colours,
    legend_beside,
    markers_whole,
    matplotlib,
    significant,
)
from ember.printable import printable
from ember.train.files.artifacts import SPLITS, Artifacts
from ember.train.files.lock import read_lock
from ember.train.files.metric_files import metric_stem
from ember.train.files.run_record import (
    check_latest,
    flatten_hparams,
    read_hparams,
    read_sessions,
    wall_time,
)
from ember.train.history import RunHistory
from ember.train.summary import epoch_values

HIGHER_IS_BETTER: tuple[str, ...] = (
    *("accuracy", "auroc", "auc", "precision", "recall", "f1", "fbeta", "f-beta"),
    *("hamming", "speed", "score", "iou", "dice", "r2"),
)
"""Words that mark a metric whose best value is its highest (case does not matter)."""

RESUME_HINT = "resume with LearnerBuilder(dir).checkpoint('latest')"
SPLIT_LINES: dict[str, Any] = {"train": "--", "valid": "-"}
"""How a chart tells the splits apart: training dashed, validation solid."""


def higher_is_better(name: str) -> bool:
    """Whether the best value of a metric named `name` is its highest: its name holds
    one of `HIGHER_IS_BETTER` (Accuracy, AUROC, Precision, Recall, F1...)."""
    lowered = name.lower()
    return any(word in lowered for word in HIGHER_IS_BETTER)


@dataclass(frozen=True)
class MetricStats:
    """One metric of one split over a run's epochs."""

    best: float
    best_epoch: int
    final: float
    final_epoch: int
    higher_is_better: bool


@dataclass(frozen=True)
class RunRow:
    """One run, as `ember compare` and `ember runs` show it."""

    directory: Path
    status: str
    """"completed", "stopped", "stopped early", "pruned", "failed", "interrupted",
    "running", "damaged" (a record does not read back as written, or the history lacks
    what the newest checkpoint says it held, as a resume from it would find: `detail`
    names it and the fix) or "unknown" (no history and no checkpoint that needs one: an
    older run, or not one of the learner)."""
    detail: str
    """The outcome in words, with what to do next (the resume hint of a stopped run)."""
    epochs: int
    """Completed epochs."""
    wall_time: float | None
    """Seconds spent in `fit` over all its sessions; None when not recorded."""
    hparams: dict[str, Any] | None
    """The hyperparameters, flattened to dotted keys; None when none were recorded."""
    metrics: dict[tuple[str, str], MetricStats] = field(default_factory=dict)
    series: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    """Per (split, metric): (epoch, value) of every completed epoch."""
    notes: tuple[str, ...] = ()
    """What is missing from the directory."""
    damage: str | None = None
    """For a "damaged" run: its first damaged record and what is wrong with it, in full
    (`detail` says it in short, with the fix)."""


DETAIL_WIDTH = 64
"""A damaged run's problem is cut to this many characters in `detail` (the table's
Details cell); the tables print it whole below themselves."""


def read_run(directory: str | os.PathLike[str]) -> RunRow:
    """The state of the run in `directory`, read from its files alone (a damaged record
    makes it "damaged", with what can still be read)."""
    root = Path(directory)
    if not root.is_dir():
        raise EmberError(f"{root}: no such artifact directory.")
    artifacts = Artifacts(root)
    notes: list[str] = []
    damage: list[RunRecordError] = []
    history: RunHistory | None = None
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    saved = artifacts.saved_history
    if saved is not None:
        try:
            history = RunHistory.load(saved)
        except RunRecordError as error:
            damage.append(error)
            try:
                history = RunHistory.salvage(saved)[0]
            except RunRecordError:
                history = None
        for epoch, values in history.epochs if history is not None else []:
            for split in SPLITS:
                for name, value in values.get(split, {}).items():
                    series.setdefault((split, name), []).append((epoch, value))
    else:
        notes.append("no history.jsonl: epoch values are the means of the metric logs")
        series.update(epoch_values(root))
    hparams = _readable(read_hparams, root, damage)
    if hparams is None and not damage:
        notes.append("no hparams.json")
    sessions = _readable(read_sessions, root, damage) or []
    if not sessions and not damage:
        notes.append("no sessions.json: wall time unknown")
    lock = read_lock(artifacts.lock)
    running = lock is not None and lock.running
    if not running and not damage:
        try:  # what a resume from the newest checkpoint would find wrong
            check_latest(artifacts, history)
        except RunRecordError as error:
            damage.append(error)
    last_write = saved.stat().st_mtime if saved is not None else None
    ended = sessions[-1].outcome if sessions and sessions[-1].ended is not None else None
    status, detail = _status(history, lock, running, bool(sessions), ended)
    problem = None
    if damage and not running:
        problem = _problem(damage[0])
        status, detail = "damaged", f"{_clipped(problem)}; run `ember repair {root}`"
        if damage[0].path is None:  # not the fix: the message says what is
            detail = _clipped(problem)
    epochs = max((epoch for values in series.values() for epoch, _ in values), default=0)
    return RunRow(
        directory=root,
        status=status,
        detail=detail,
        epochs=epochs,
        wall_time=wall_time(sessions, running, last_write),
        hparams=flatten_hparams(hparams) if hparams is not None else None,
        metrics={key: _stats(key[1], values) for key, values in series.items() if values},
        series=series,
        notes=tuple(notes),
        damage=problem,
    )


def _readable(read: Any, root: Path, damage: list[RunRecordError]) -> Any:
    """What `read(root)` returns, or None when the record is damaged (said in `damage`)."""
    try:
        return read(root)
    except RunRecordError as error:
        damage.append(error)
        return None


def _problem(error: RunRecordError) -> str:
    """A damaged record's file (by name: the row names the run) and what is wrong with
    it, without the fix's long text ("history.jsonl, line 6: the file ends ...")."""
    path, problem = error.path, error.problem
    if not isinstance(path, Path) or problem is None:
        return str(error)
    return f"{path.name}{', ' if problem.startswith('line ') else ': '}{problem}"


def _clipped(text: str, width: int = DETAIL_WIDTH) -> str:
    """`text`, cut at a word to at most `width` characters ("..." says it was)."""
    if len(text) <= width:
        return text
    cut = text[: width - 3]
    return (cut[: cut.rfind(" ")] if " " in cut else cut).rstrip(" ,:;") + "..."


def _status(
    history: RunHistory | None,
    lock: Any,
    running: bool,
    sessions: bool = False,
    ended: str | None = None,
) -> tuple[str, str]:
    """A run's status and its detail. `sessions`: sessions.json lists the run's fits;
    `ended`: how the last one ended, as it says (the history's last lines, which say it
    too, may have been lost)."""
    if running:
        if lock.unreadable is not None:  # damaged, or being written
            return "running", lock.unreadable
        return "running", f"training: {lock.owner.describe()}"
    if history is None and sessions:  # a run of this ember, with no checkpoint to check
        return "unknown", "no history.jsonl, and no checkpoint: nothing says how the run ended"
    if history is None:
        return "unknown", "no history.jsonl (a run of an older ember, or not a learner's run)"
    outcome = history.outcome
    if outcome is None and lock is None:  # (a lock left behind: a kill came after)
        outcome = ended
    resumable = bool(history.checkpoints)
    hint = f"; {RESUME_HINT}" if resumable else ""
    if outcome is None:
        why = f"killed ({lock.stale_reason})" if lock is not None else "ended without an outcome"
        return "failed", f"{why}{hint}"
    text = str(outcome)
    if text == "completed":
        return "completed", "completed"
    for status in ("stopped early", "stopped", "preempted", "pruned", "interrupted", "failed"):
        if text.startswith(status):
            resumes = ("stopped", "preempted", "interrupted", "failed")
            return status, text + (hint if status in resumes else "")
    return "unknown", text


def _twins(rows: Sequence[RunRow], metric: str) -> list[tuple[RunRow, int]]:
    """For each run drawn on `metric`'s chart: the first run with the same values of it
    (itself when none comes before), and how many runs after it have them too. A chart
    draws those under the later ones, wider, so that no colour hides another."""
    keys = [
        tuple(
            (
                split,
                tuple((epoch, repr(value)) for epoch, value in row.series.get((split, metric), [])),
            )
            for split in SPLITS
        )
        for row in rows
    ]
    return [
        (rows[keys.index(key)], sum(1 for other in keys[index + 1 :] if other == key))
        for index, key in enumerate(keys)
    ]


def _stats(name: str, values: list[tuple[int, float]]) -> MetricStats:
    higher = higher_is_better(name)
    finite = [(e, v) for e, v in values if not math.isnan(v)] or values
    sign = -1.0 if higher else 1.0
    best = min(finite, key=lambda item: (sign * item[1], item[0]))
    return MetricStats(best[1], best[0], values[-1][1], values[-1][0], higher)


def find_runs(root: str | os.PathLike[str]) -> list[Path]:
    """The artifact directories under `root` (itself included), in path order: folders
    with a `history.jsonl`, a run lock, `hparams.json` or metric logs. The folders
    inside a run are not searched."""
    top = Path(root)
    if not top.is_dir():
        raise EmberError(f"{top}: no such folder.")
    found: list[Path] = []

    def visit(folder: Path) -> None:
        if _is_run(folder):
            found.append(folder)
            return
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir())
        except OSError:
            return
        for child in children:
            visit(child)

    visit(top)
    return found


def _is_run(folder: Path) -> bool:
    artifacts = Artifacts(folder)
    files = (artifacts.history, artifacts.legacy_history, artifacts.lock, artifacts.hparams)
    if any(p.exists() for p in files):
        return True
    return any(artifacts.epoch_dirs(split) for split in SPLITS)


def runs(root: str | os.PathLike[str]) -> list[RunRow]:
    """Every run under `root` with its status (`ember runs ROOT`)."""
    return [read_run(directory) for directory in find_runs(root)]


def runs_table(rows: Sequence[RunRow], root: str | os.PathLike[str] | None = None) -> str:
    """`ember runs`: one line per run, its status, epochs, time and what to do next."""
    if not rows:
        return f"No runs under {root}." if root is not None else "No runs."
    header = ("Run", "Status", "Epochs", "Time", "Details")
    body = [
        (_name(row.directory, root), row.status, str(row.epochs), _time(row.wall_time), row.detail)
        for row in rows
    ]
    below = [
        f"{_name(row.directory, root)}: {printable(_whole(row))}"
        for row in rows
        if _whole(row) != row.detail
    ]
    return "\n".join([_table(header, body), *below])


def _whole(row: RunRow) -> str:
    """`row.detail` with a damaged run's problem in full, not cut to the Details cell."""
    if row.damage is None:
        return row.detail
    return row.damage + row.detail[len(_clipped(row.damage)) :]


@dataclass
class Comparison:
    """Several runs side by side: `rows` (one per run), the hyperparameters that
    differ between them, and each metric's curves (`chart`, `plot`)."""

    rows: list[RunRow]

    @property
    def differing(self) -> list[str]:
        """The hyperparameter keys whose values are not the same in every run (a key a
        run lacks counts as differing)."""
        recorded = [row.hparams or {} for row in self.rows]
        keys = sorted({key for values in recorded for key in values})
        missing = object()
        return [
            key
            for key in keys
            if len({repr(values.get(key, missing)) for values in recorded}) > 1
            or any(key not in values for values in recorded)
        ]

    @property
    def metrics(self) -> list[tuple[str, str]]:
        """Every (split, metric) of any run, train first."""
        keys = {key for row in self.rows for key in row.metrics}
        return sorted(keys, key=lambda key: (SPLITS.index(key[0]), key[1].lower()))

    def table(self) -> str:
        """One row per run: status, epochs, time, the differing hyperparameters, then
        each metric's best value (with its epoch) and final value."""
        differing = self.differing
        header = ["Run", "Status", "Epochs", "Time", *differing]
        for split, name in self.metrics:
            header += [f"{split} {name} best", f"{split} {name} final"]
        body = []
        for row in self.rows:
            cells = [_name(row.directory), row.status, str(row.epochs), _time(row.wall_time)]
            cells += [_hparam(row.hparams, key) for key in differing]
            for key in self.metrics:
                stats = row.metrics.get(key)
                if stats is None:
                    cells += ["-", "-"]
                else:
                    cells += [f"{_number(stats.best)} @{stats.best_epoch}", _number(stats.final)]
            body.append(tuple(cells))
        lines = [_table(tuple(header), body)]
        for row in self.rows:
            if row.status != "completed":
                lines.append(f"{_name(row.directory)}: {printable(_whole(row))}")
            if row.notes:
                lines.append(f"{_name(row.directory)}: {printable('; '.join(row.notes))}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        from html import escape

        return f"<pre>{escape(self.table())}</pre>"

    def chart(self, metric: str) -> Chart:
        """The epoch values of `metric` in every run, one colour per run, training
        dashed and validation solid; beside the plot, a legend of the runs with their
        final values (validation's if they have it) and one of the line styles (in a
        notebook, the chart shows inline). Runs with the same values are drawn one over
        the other, the earlier ones wider (the legend names the run each repeats), and
        every marker is drawn whole, the last ones too."""
        names = {name for _, name in self.metrics}
        if metric not in names:
            raise EmberError(
                f"No run has a metric {metric!r}; the runs have: {', '.join(sorted(names))}."
            )
        Figure, _ = _matplotlib()
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator

        drawn = [row for row in self.rows if any((s, metric) in row.series for s in SPLITS)]
        legend_columns = math.ceil(max(1, len(drawn)) / LEGEND_ROWS)
        figure = Figure(figsize=(9 + 2.2 * legend_columns, 5), layout="constrained")
        ax = figure.subplots()
        handles, labels = [], []
        twins = _twins(drawn, metric)
        for row, colour, (first, later) in zip(drawn, colours(len(drawn)), twins):
            widen = 1.0 + 0.9 * later  # drawn under the `later` runs with the same values
            for split in SPLITS:
                values = row.series.get((split, metric), [])
                if not values:
                    continue
                ax.plot(
                    [e for e, _ in values],
                    [v for _, v in values],
                    SPLIT_LINES[split],
                    color=colour,
                    marker="o" if split == "valid" else ".",
                    markersize=6.0 * (1.0 + 0.6 * later),
                    linewidth=(2.0 if split == "valid" else 1.4) * widen,
                )
            final = row.metrics.get(("valid", metric)) or row.metrics.get(("train", metric))
            handles.append(Line2D([], [], color=colour, linewidth=2.0))
            last = significant(final.final) if final is not None else ""
            same = f"same values as {_name(first.directory)}" if first is not row else ""
            said = "; ".join(text for text in (last, same) if text)
            labels.append(f"{_name(row.directory)}" + (f" ({said})" if said else ""))
        direction = "higher is better" if higher_is_better(metric) else "lower is better"
        ax.set_title(f"{metric} per epoch ({direction})", fontsize=13, fontweight="bold")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
        if drawn:
            splits = [s for s in SPLITS if any((s, metric) in row.series for row in drawn)]
            keys = [Line2D([], [], color="black", linestyle=SPLIT_LINES[s]) for s in splits]
            ax.add_artist(legend_beside(ax, keys, splits, bottom=True))
            legend_beside(ax, handles, labels, title="run (final value)")
            markers_whole(ax)
        return Chart(metric, figure)

    def plot(self, output_dir: str | os.PathLike[str]) -> list[Path]:
        """Write `chart(metric)` of every metric as `<Metric>.png` in `output_dir`."""
        _matplotlib()
        target = Path(output_dir)
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise EmberError(f"Cannot create the output directory {target}: {error}.") from None
        names = sorted({name for _, name in self.metrics}, key=str.lower)
        return [self.chart(name).save(target / f"{metric_stem(name)}.png") for name in names]


@dataclass
class Chart:
    """A matplotlib figure of one metric across runs; a notebook shows it inline."""

    metric: str
    figure: Any

    def png(self) -> bytes:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(self.figure)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def save(self, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        atomic_write_bytes(target, self.png())
        return target


def compare(directories: Iterable[str | os.PathLike[str]]) -> Comparison:
    """The runs in `directories`, side by side (`ember compare DIR...`)."""
    paths = [Path(directory) for directory in directories]
    if not paths:
        raise EmberError("compare needs at least one artifact directory.")
    return Comparison([read_run(path) for path in paths])


# Formatting ---------------------------------------------------------------------------
def _matplotlib() -> Any:
    return matplotlib("Charts")


def _name(directory: Path, root: str | os.PathLike[str] | None = None) -> str:
    """How a table names a run: its folder's name (its path under `root`), control
    characters escaped."""
    if root is not None:
        try:
            relative = directory.relative_to(root)
            return printable(relative if str(relative) != "." else directory.name)
        except ValueError:
            pass
    return printable(directory.name or directory)


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def _number(value: float) -> str:
    return significant(value)


def _hparam(hparams: dict[str, Any] | None, key: str) -> str:
    if hparams is None or key not in hparams:
        return "-"
    value = hparams[key]
    return f"{value:.6g}" if isinstance(value, float) else str(value)  # as the run was set


def _table(header: tuple[str, ...], body: Sequence[tuple[str, ...]]) -> str:
    header = tuple(map(printable, header))
    body = [tuple(map(printable, row)) for row in body]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in body)])


__all__ = [
    "Chart",
    "Comparison",
    "MetricStats",
    "RunRow",
    "compare",
    "find_runs",
    "read_run",
    "runs",
    "runs_table",
]
