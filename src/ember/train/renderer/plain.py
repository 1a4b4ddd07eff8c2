"""The plain renderer: short progress lines, no terminal control codes (logs, CI, pipes)."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import IO, Sequence

from ember.printable import printable
from ember.train.logger.base import MetricRecord
from ember.train.renderer.base import MetricView, Progress, RunInfo, printable_info
from ember.train.renderer.format import format_duration, format_number

DEFAULT_INTERVAL = 10.0
INTERVAL_ENV = "EMBER_PROGRESS_INTERVAL"


def interval_from_env() -> float:
    """Seconds between progress lines: `EMBER_PROGRESS_INTERVAL` if set, else 10."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        from ember.errors import ConfigError

        raise ConfigError(f"{INTERVAL_ENV} must be a number of seconds >= 0, got {raw!r}.")
    return value


class PlainRenderer:
    """Prints a progress line at most every `interval` seconds (default: the
    `EMBER_PROGRESS_INTERVAL` environment variable, else 10) and one line per split per
    epoch. Plain text only, so it reads well in a log file."""

    def __init__(self, interval: float | None = None, stream: IO[str] | None = None) -> None:
        if interval is None:
            interval = interval_from_env()
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        self.interval = float(interval)
        self.stream = stream
        self._last = 0.0
        self._info: RunInfo | None = None

    def _write(self, line: str) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        stream.write(line + "\n")
        stream.flush()

    def start(self, info: RunInfo) -> None:
        self._last = time.monotonic()
        self._info = info = printable_info(info)
        where = f"epoch {info.start_epoch}/{info.num_epochs}"
        if info.resumed and info.start_iteration:
            where += f", iteration {info.start_iteration}"
        first = "resuming at" if info.resumed or info.start_epoch > 1 else "training"
        if info.evaluation is not None:  # one pass, no epochs
            first, where = info.activity, ""
        self._write(
            f"{first}{f' {where}' if where else ''}: {info.model_name} "
            f"({info.num_parameters:,} parameters) on {', '.join(info.devices)}; "
            f"artifacts in {info.artifact_dir}"
        )
        if info.model_summary:
            self._write(info.model_summary)

    def update(
        self, progress: Progress, metrics: Sequence[MetricView], records: Sequence[MetricRecord]
    ) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        total = progress.num_iterations
        if total:
            position = f"iter {progress.iteration}/{total} ({100 * progress.iteration // total}%)"
            rate = progress.iterations_per_second
            eta = f"  eta {format_duration((total - progress.iteration) / rate)}" if rate else ""
        else:
            position, eta = f"iter {progress.iteration}", ""
        values = _values(progress.split, metrics)
        run = f"  {progress.run}" if progress.run else ""
        self._write(
            f"{self._where(progress)}  {position}{run}  "
            f"{progress.items_per_second:,.0f} items/s{eta}  {values}".rstrip()
        )

    def _where(self, progress: Progress) -> str:
        """ "train epoch 2/5", or "evaluating 'test'" for an evaluation."""
        if self._info is not None and self._info.evaluation is not None:
            return self._info.activity
        return f"{progress.split:<5} epoch {progress.epoch}/{progress.num_epochs}"

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        values = _values(progress.split, metrics)
        run = f" ({progress.run})" if progress.run and progress.split == "train" else ""
        what = self._where(progress)
        if self._info is not None and self._info.evaluation is not None:
            what = self._info.noun
        self._write(
            f"{what} done: {progress.iteration} iterations, {_counts(progress)}{run} in "
            f"{format_duration(progress.elapsed)}  {values}".rstrip()
        )
        self._last = time.monotonic()

    def valid_point(
        self, iteration: int, progress: Progress, metrics: Sequence[MetricView]
    ) -> None:
        """A validation inside the epoch (`valid_every`), after `iteration` training batches."""
        values = _values("valid", metrics)
        self._write(
            f"valid epoch {progress.epoch}/{progress.num_epochs} at iteration {iteration}: "
            f"{progress.iteration} iterations, {_counts(progress)} in "
            f"{format_duration(progress.elapsed)}  {values}".rstrip()
        )

    def notice(self, text: str) -> None:
        """A warning about the run, shown once (`experiment.log` has it too)."""
        self._write(f"warning: {printable(text)}")

    def end(self, reason: str) -> None:
        info, self._info = self._info, None
        if info is not None and info.evaluation is not None and reason == "completed":
            return  # "evaluation 'name' done" said it
        self._write(f"{info.noun if info is not None else 'training'} {printable(reason)}")


def _counts(progress: Progress) -> str:
    """ "200 items", or "200 items, 3,120 tokens" when the batches told their tokens."""
    tokens = f", {progress.tokens:,} tokens" if progress.tokens is not None else ""
    return f"{progress.items:,} items{tokens}"


def _values(split: str, metrics: Sequence[MetricView]) -> str:
    """`Name value unit` for each metric of `split` (epoch value when known)."""
    return "  ".join(
        f"{printable(m.name)} {format_number(m.epoch_value if m.epoch_value is not None else m.last, m.unit)}"
        for m in metrics
        if m.split == split
    )
