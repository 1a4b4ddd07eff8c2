"""The terminal dashboard: metrics, status, a chart of the selected metric and progress.

The training thread only appends values under a lock (`update`, `end_split`); a
background thread draws at most `refresh_per_second` frames, fewer when drawing gets
expensive, so the dashboard never slows the loop by more than a small fraction. A
second thread reads keys when stdin is a terminal.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from rich import get_console
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.live_render import LiveRender
from rich.segment import Segment
from rich.style import Style

from ember.train.logger.base import MetricRecord
from ember.train.logger.file import metric_file_name
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.history import History
from ember.train.renderer.keys import KeyReader
from ember.train.renderer.panels import VIEWS, Snapshot, dashboard, select_metric

STOP_MESSAGE = "stopped from the dashboard"
KILL_MESSAGE = "killed from the dashboard"
TAIL_LIMIT = 100_000
"""The most values read back from a log at a split's end (a few milliseconds at most)."""


def _last_values(path: Path, count: int) -> list[float]:
    """The values of the last `count` complete lines of a metric log (fewer if the file
    is shorter; none if it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            block = count * 48 + 256
            while True:
                start = max(0, size - block)
                handle.seek(start)
                lines = handle.read(size - start).split(b"\n")[:-1]
                if start > 0:
                    lines = lines[1:]  # the first one may be cut
                if len(lines) >= count or start == 0:
                    break
                block *= 2
    except OSError:
        return []
    values = []
    for line in lines[-count:]:
        try:
            values.append(float(line.split(b",", 1)[0]))
        except ValueError:
            pass
    return values


class _Frame:
    """The last drawn frame as segments: cheap to re-emit when output is printed above it."""

    def __init__(self) -> None:
        self.lines: list[list[Segment]] = []
        self.width = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        new_line = Segment.line()
        for line in self.lines:
            yield from line
            yield new_line


class _FrameRender(LiveRender):
    """Live's renderer, emitting a ready `_Frame` without laying it out again."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        frame = self.renderable
        if isinstance(frame, Group) and len(frame.renderables) == 1:
            frame = frame.renderables[0]
        if not isinstance(frame, _Frame) or not frame.lines:
            yield from super().__rich_console__(console, options)
            return
        lines = frame.lines
        if len(lines) > options.size.height or frame.width > options.max_width:
            yield from super().__rich_console__(console, options)
            return
        self._shape = (frame.width, len(lines))
        new_line = Segment.line()
        yield from lines[0]
        for line in lines[1:]:
            yield new_line
            yield from line


class TuiRenderer:
    """A live terminal dashboard. Keys (when stdin is a terminal): left/right choose the
    metric, up/down the chart view, `q` asks whether to stop gracefully (`s`), kill (`k`)
    or cancel (`c`)."""

    def __init__(
        self,
        *,
        refresh_per_second: float = 10.0,
        recent: int = 300,
        max_height: int = 36,
        console: Console | None = None,
        keys: bool = True,
        render_budget: float = 0.01,
    ) -> None:
        if refresh_per_second <= 0:
            raise ValueError(f"refresh_per_second must be > 0, got {refresh_per_second!r}")
        self.refresh_per_second = float(refresh_per_second)
        self.recent = int(recent)
        self.max_height = int(max_height)
        self.console = console
        self.keys = keys
        self.render_budget = float(render_budget)
        """The largest share of one CPU the drawing thread may use; frames are spaced to fit."""
        self._persistent = False
        self._reset()

    def _reset(self) -> None:
        """A fresh state for one run (a renderer may serve several `fit` calls in turn)."""
        self._lock = threading.Lock()
        self._shutdown_lock = threading.RLock()
        self._started = False
        self._closed_down = False
        self._info: RunInfo | None = None
        self._progress: Progress | None = None
        self._views: tuple[MetricView, ...] = ()
        self._histories: dict[tuple[str, str], History] = {}
        self._epoch_values: dict[tuple[str, str], dict[int, float]] = {}
        self._names: list[str] = []
        self._units: dict[str, str] = {}
        self._selected: str | None = None
        self._view = VIEWS[0]
        self._prompt = False
        self._notice: str | None = None
        self._reason: str | None = None
        self._closing = False
        self._version = 0
        self._urgent = False
        self._durations: dict[str, float] = {}
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}
        self._started_at = 0.0
        self._ended_at: float | None = None
        self._wake = threading.Event()
        self._stop_drawing = threading.Event()
        self._key_pressed = threading.Event()
        self._ended = threading.Event()
        self._frame = _Frame()
        self._styles: dict[str, Style] = {}
        self._live: Live | None = None
        self._reader: KeyReader | None = None
        self._drawer: threading.Thread | None = None
        self._swapped: list[tuple[logging.StreamHandler, Any]] = []
        self.frames = 0
        """Frames drawn so far (for tests and benchmarks)."""
        self.draw_seconds = 0.0
        """CPU seconds spent drawing so far."""

    def persistent(self) -> TuiRenderer:
        """Keep the dashboard on screen at the end until a key is pressed (terminals only)."""
        self._persistent = True
        return self

    # Renderer protocol ----------------------------------------------------------
    def start(self, info: RunInfo) -> None:
        """Take over the terminal: start the live display, the drawing and key threads."""
        if self._started:
            self._shutdown()
            self._reset()
        self._info = info
        self._started_at = time.monotonic()
        for _, name, unit, numeric in info.metrics:
            self._units.setdefault(name, unit)
            if numeric and name not in self._names:
                self._names.append(name)
        self._selected = self._names[0] if self._names else None
        # rich's shared console: rich.print and RichHandler output then show above the dashboard.
        console = self.console if self.console is not None else get_console()
        self.console = console
        before = sys.stdout, sys.stderr
        self._live = Live(
            self._frame,
            console=console,
            auto_refresh=False,
            redirect_stdout=True,
            redirect_stderr=True,
            transient=False,
        )
        if isinstance(getattr(self._live, "_live_render", None), LiveRender):
            self._live._live_render = _FrameRender(self._frame, vertical_overflow="ellipsis")
        self._started = True
        atexit.register(self._restore)
        try:
            self._draw()
            self._live.start(refresh=True)
        except BaseException:
            self._shutdown()
            raise
        self._redirect_logging(*before)
        if console.is_terminal and not console.is_dumb_terminal:
            if self.keys:
                reader = KeyReader(self.press)
                if reader.start():
                    self._reader = reader
            self._drawer = threading.Thread(
                target=self._draw_loop, name="ember-dashboard", daemon=True
            )
            self._drawer.start()

    def update(
        self, progress: Progress, metrics: Sequence[MetricView], records: Sequence[MetricRecord]
    ) -> None:
        """Keep the new values for the next frame (called on the training thread)."""
        with self._lock:
            self._progress = progress
            self._views = tuple(metrics)
            if records:
                self._append(progress, records)
            self._version += 1

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        """Record the split's epoch values (and the values logged after the last tick)."""
        tails = self._missing_tails(progress)
        with self._lock:
            for name, values in tails.items():
                self._history(progress.split, name).extend(
                    progress.epoch,
                    progress.num_iterations,
                    values,
                    progress.iteration - len(values) + 1,
                )
            self._progress = progress
            self._views = tuple(metrics)
            self._durations[progress.split] = progress.elapsed
            for view in metrics:
                if view.split == progress.split and isinstance(view.epoch_value, (int, float)):
                    key = (view.split, view.name)
                    self._epoch_values.setdefault(key, {})[progress.epoch] = float(view.epoch_value)
            self._version += 1

    def end(self, reason: str) -> None:
        """Draw the last frame and give the terminal back (after a key press if persistent)."""
        if not self._started:
            return
        with self._lock:
            self._reason = reason
            self._ended_at = time.monotonic()
            self._prompt = False
            self._version += 1
        try:
            reader = self._reader
            if (
                self._persistent
                and reader is not None
                and reader.active
                and not self._closed_down
                and not reason.startswith("interrupted")
            ):
                with self._lock:
                    self._closing = True
                    self._key_pressed.clear()
                    self._version += 1
                self._wake.set()
                while not self._key_pressed.wait(0.2) and reader.active:
                    pass
                with self._lock:
                    self._closing = False
                    self._version += 1
        finally:
            self._shutdown()
            self._ended.set()

    # Keys -----------------------------------------------------------------------
    def press(self, key: str) -> None:
        """Act on a key as if typed: "left", "right", "up", "down", "q", then "s", "k" or "c"."""
        action = None
        with self._lock:
            if self._closing:
                self._key_pressed.set()
                return
            if self._prompt:
                if key in ("s", "S"):
                    self._prompt, action = False, "stop"
                elif key in ("k", "K"):
                    self._prompt, action = False, "kill"
                elif key in ("c", "C", "q", "Q", "escape"):
                    self._prompt = False
            elif key in ("q", "Q"):
                if self._reason is None:
                    self._prompt = True
            elif key in ("left", "right"):
                self._selected = select_metric(
                    self._names, self._selected, 1 if key == "right" else -1
                )
            elif key in ("up", "down"):
                index = VIEWS.index(self._view) + (1 if key == "down" else -1)
                self._view = VIEWS[index % len(VIEWS)]
            self._version += 1
            self._urgent = True
        if action == "stop":
            self._stop_run()
        elif action == "kill":
            self._kill_run()
        self._wake.set()

    def _stop_run(self) -> None:
        interrupter = self._info.interrupter if self._info is not None else None
        if interrupter is None:
            with self._lock:
                self._notice = "this run has no interrupter: it cannot be stopped from here"
            return
        interrupter.stop(STOP_MESSAGE)
        with self._lock:
            self._notice = "stopping: finishing this step, then the epoch's checkpoint"

    def _kill_run(self) -> None:
        """Give the terminal back, then interrupt the main thread with SIGINT."""
        with self._lock:
            self._notice = "killed from the dashboard"
        self._shutdown()
        interrupter = self._info.interrupter if self._info is not None else None
        if interrupter is not None:
            # ember's SIGINT handler stops gracefully on a first Ctrl-C and raises
            # KeyboardInterrupt once a stop is pending: make this SIGINT the second.
            interrupter.stop(KILL_MESSAGE)
        os.kill(os.getpid(), signal.SIGINT)
        if not self._ended.wait(5.0):
            os.kill(os.getpid(), signal.SIGINT)

    # Drawing --------------------------------------------------------------------
    def _history(self, split: str, name: str) -> History:
        history = self._histories.get((split, name))
        if history is None:
            history = self._histories[(split, name)] = History(recent=self.recent)
            if name not in self._names:
                self._names.append(name)
                if self._selected is None:
                    self._selected = name
        return history

    def _append(self, progress: Progress, records: Sequence[MetricRecord]) -> None:
        """New iteration values, grouped into runs of one metric (the processor's order)."""
        split, epoch, total = progress.split, progress.epoch, progress.num_iterations
        start, count = 0, len(records)
        while start < count:
            name = records[start].name
            end = start + 1
            while end < count and records[end].name == name:
                end += 1
            values = [r.value for r in records[start:end]]
            self._history(split, name).extend(epoch, total, values, records[start].iteration)
            self._seen[(split, name)] = (epoch, records[end - 1].iteration)
            start = end

    def _missing_tails(self, progress: Progress) -> dict[str, list[float]]:
        """The values of the split's last iterations that came after the last tick: the
        loop hands them to the loggers only, so read them back from the metric logs
        (a few lines at the end of each file)."""
        info = self._info
        if info is None or not progress.iteration:
            return {}
        names = {
            name for split, name, _, numeric in info.metrics if split == progress.split and numeric
        }
        names.update(name for split, name in self._histories if split == progress.split)
        tails = {}
        for name in names:
            epoch, last = self._seen.get((progress.split, name), (progress.epoch, 0))
            missing = progress.iteration - (last if epoch == progress.epoch else 0)
            if 0 < missing <= TAIL_LIMIT:
                path = Path(info.artifact_dir) / progress.split / f"epoch-{progress.epoch}"
                values = _last_values(path / metric_file_name(name), missing)
                if values:
                    tails[name] = values
                    self._seen[(progress.split, name)] = (progress.epoch, progress.iteration)
        return tails

    def _snapshot(self) -> Snapshot:
        with self._lock:
            assert self._info is not None
            name = self._selected
            histories = {}
            epochs = {}
            for split in ("train", "valid"):
                history = self._histories.get((split, name)) if name is not None else None
                if history is not None:
                    histories[split] = history.view()
                values = self._epoch_values.get((split, name)) if name is not None else None
                if values:
                    epochs[split] = dict(values)
            last = {
                key: values[max(values)] for key, values in self._epoch_values.items() if values
            }
            end = self._ended_at if self._ended_at is not None else time.monotonic()
            elapsed = end - self._started_at
            fraction = self._fraction()
            eta = None
            if fraction and self._reason is None and fraction > 0.002:
                eta = elapsed * (1 - fraction) / fraction
            return Snapshot(
                info=self._info,
                progress=self._progress,
                views=self._views,
                names=tuple(self._names),
                selected=name,
                view=self._view,
                units=dict(self._units),
                histories=histories,
                epoch_values=epochs,
                last_epoch_values=last,
                elapsed=elapsed,
                fraction=fraction,
                eta=eta,
                recent=self.recent,
                prompt=self._prompt,
                notice=self._notice or self._interrupted(),
                reason=self._reason,
                closing=self._closing,
            )

    def _interrupted(self) -> str | None:
        interrupter = self._info.interrupter if self._info is not None else None
        if interrupter is not None and interrupter.should_stop():
            return f"stopping: {interrupter.message}"
        return None

    def _fraction(self) -> float | None:
        """The share of the run done: epochs done plus the current one, whose train and
        valid parts are weighed by how long each took in the previous epoch."""
        info, progress = self._info, self._progress
        if info is None or progress is None:
            return None
        epochs = info.num_epochs - info.start_epoch + 1
        if epochs <= 0:
            return None
        within = progress.iteration / progress.num_iterations if progress.num_iterations else 0.0
        train = self._durations.get("train")
        valid = self._durations.get("valid")
        if progress.split == "train":
            share = train / (train + valid) if train and valid else 1.0
            done = share * within
        else:
            if not train:
                share = 0.5
            elif valid:
                share = train / (train + valid)
            else:
                estimate = progress.elapsed / within if within > 0 else train
                share = train / (train + estimate)
            done = share + (1 - share) * within
        value = (progress.epoch - info.start_epoch + min(1.0, done)) / epochs
        if self._reason == "completed":
            value = 1.0
        return min(1.0, max(0.0, value))

    def _size(self) -> tuple[int, int]:
        assert self.console is not None
        size = self.console.size
        return size.width, max(16, min(self.max_height, size.height - 1))

    def _draw(self) -> None:
        """Build the next frame (in the calling thread) and keep it for the next refresh."""
        if self._info is None or self.console is None:
            return
        width, height = self._size()
        styles = self._styles
        frame = []
        for line in dashboard(self._snapshot(), width, height):
            segments = []
            for text, style in line:
                parsed = styles.get(style)
                if parsed is None:
                    parsed = styles[style] = Style.parse(style) if style else Style.null()
                segments.append(Segment(text, parsed))
            frame.append(segments)
        self._frame.lines, self._frame.width = frame, width

    def _draw_loop(self) -> None:
        interval = 1.0 / self.refresh_per_second
        drawn, last, gap = -1, 0.0, interval
        while not self._stop_drawing.is_set():
            pending = self._urgent or drawn != self._version
            # Poll for new values every `gap` (no wake-up call costs the training thread).
            wait = last + gap - time.monotonic() if pending else gap
            if wait > 0:
                self._wake.wait(timeout=wait)
            self._wake.clear()
            if self._stop_drawing.is_set():
                return
            now = time.monotonic()
            urgent, self._urgent = self._urgent, False
            due = now >= last + gap and (drawn != self._version or now >= last + 1.0)
            if not (urgent or due):
                continue
            cpu = time.thread_time()
            drawn = self._version
            try:
                self._draw()
                live = self._live
                if live is not None and not self._stop_drawing.is_set():
                    live.refresh()
            except Exception:  # drawing must never take the run down
                pass
            cost = time.thread_time() - cpu
            self.frames += 1
            self.draw_seconds += cost
            last = time.monotonic()
            # Keep the drawing thread's share of CPU (and of the GIL) under the budget.
            budget = cost / self.render_budget if self.render_budget > 0 else 0.0
            gap = min(max(interval, budget), 1.0)

    # Terminal -------------------------------------------------------------------
    def _redirect_logging(self, stdout: Any, stderr: Any) -> None:
        """Logging handlers that write to the terminal write above the dashboard instead."""
        if sys.stdout is stdout and sys.stderr is stderr:
            return
        targets = {id(stdout): sys.stdout, id(sys.__stdout__): sys.stdout}
        targets.update({id(stderr): sys.stderr, id(sys.__stderr__): sys.stderr})
        loggers = [logging.getLogger()] + [
            item
            for item in logging.Logger.manager.loggerDict.values()
            if isinstance(item, logging.Logger)
        ]
        for logger in loggers:
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler and id(handler.stream) in targets:
                    target = targets[id(handler.stream)]
                    if target is not handler.stream:
                        self._swapped.append((handler, handler.setStream(target)))

    def _restore_logging(self) -> None:
        for handler, stream in reversed(self._swapped):
            try:
                handler.setStream(stream)
            except Exception:
                pass
        self._swapped.clear()

    def _shutdown(self) -> None:
        """Stop drawing and reading keys, draw the final frame, give the terminal back."""
        with self._shutdown_lock:
            if self._closed_down:
                return
            self._closed_down = True
            self._stop_drawing.set()
            self._wake.set()
            drawer = self._drawer
            if drawer is not None and drawer is not threading.current_thread():
                drawer.join(timeout=2.0)
            try:
                self._draw()
            except Exception:
                pass
            try:
                if self._live is not None:
                    self._live.stop()
            except Exception:  # a terminal that fails to draw must still be given back
                pass
            finally:
                self._restore_logging()
                if self._reader is not None:
                    self._reader.stop()
                try:
                    atexit.unregister(self._restore)
                except Exception:
                    pass

    def _restore(self) -> None:
        """At interpreter exit, if `end` never ran: give the terminal back."""
        try:
            if self._live is not None and self._live.is_started:
                self._live.stop()
        except Exception:
            pass
        self._restore_logging()
        if self._reader is not None:
            self._reader.restore()
