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
from typing import Any, Sequence

from rich import get_console
from rich.console import Console
from rich.live import Live
from rich.live_render import LiveRender
from rich.segment import Segment
from rich.style import Style

from ember.train.logger.base import MetricRecord
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.frame import Frame, FrameRender
from ember.train.renderer.keys import KeyReader
from ember.train.renderer.panels import VIEWS, dashboard, metrics_scroll, select_metric
from ember.train.renderer.state import RunTracker, Snapshot

STOP_MESSAGE = "stopped from the dashboard"
KILL_MESSAGE = "killed from the dashboard"


class TuiRenderer:
    """A live terminal dashboard. Keys (when stdin is a terminal): left/right choose the
    metric, up/down the chart view, PgUp/PgDn scroll the metrics table when it has more
    rows than fit, `q` asks whether to stop gracefully (`s`), kill (`k`) or cancel (`c`)."""

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
        self._run = RunTracker(recent=self.recent)
        self._selected: str | None = None
        self._view = VIEWS[0]
        self._scroll = 0
        """The first metrics table row shown (as last drawn, or as asked by a key)."""
        self._follow = False
        """Whether the next frame scrolls the metrics table to the selected metric."""
        self._page = 1
        self._rows = 0
        self._prompt = False
        self._notice: str | None = None
        self._closing = False
        self._version = 0
        self._urgent = False
        self._wake = threading.Event()
        self._stop_drawing = threading.Event()
        self._key_pressed = threading.Event()
        self._ended = threading.Event()
        self._frame = Frame()
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
        self._run.start(info)
        self._select_first()
        # rich's shared console: rich.print and RichHandler output then show above the dashboard.
        console = self.console if self.console is not None else get_console()
        self.console = console
        summary = self._run.info.model_summary if self._run.info is not None else ""
        if summary:  # into the scrollback, above the dashboard
            console.print(summary, markup=False, highlight=False, soft_wrap=True)
        if console.is_terminal and not console.is_dumb_terminal:
            # A clean screen: what was printed so far scrolls up into the terminal's
            # history (none of it shows as cut rows above the dashboard), and the
            # dashboard draws from the top line.
            console.file.write("\n" * console.size.height + "\x1b[H")
            console.file.flush()
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
            self._live._live_render = FrameRender(self._frame, vertical_overflow="ellipsis")
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
            self._run.update(progress, metrics, records)
            self._select_first()
            self._version += 1

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        """Record the split's epoch values."""
        with self._lock:
            self._run.end_split(progress, metrics)
            self._select_first()
            self._version += 1

    def valid_point(
        self, iteration: int, progress: Progress, metrics: Sequence[MetricView]
    ) -> None:
        """A validation inside the epoch (`valid_every`): its values become the
        validation's last values in the table."""
        with self._lock:
            self._run.valid_point(iteration, progress, metrics)
            self._version += 1

    def end(self, reason: str) -> None:
        """Draw the last frame and give the terminal back (after a key press if persistent)."""
        if not self._started:
            return
        with self._lock:
            self._run.end(reason)
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
        """Act on a key as if typed: "left", "right", "up", "down", "pageup", "pagedown",
        "q", then "s", "k" or "c"."""
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
                if self._run.reason is None:
                    self._prompt = True
            elif key in ("left", "right"):
                self._selected = select_metric(
                    self._run.names, self._selected, 1 if key == "right" else -1
                )
                self._follow = True
            elif key in ("pageup", "pagedown"):
                step = self._page if key == "pagedown" else -self._page
                self._scroll = max(0, min(self._scroll + step, self._rows - self._page))
                self._follow = False
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
        interrupter = self._run.info.interrupter if self._run.info is not None else None
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
        interrupter = self._run.info.interrupter if self._run.info is not None else None
        if interrupter is not None:
            # ember's SIGINT handler stops gracefully on a first Ctrl-C and raises
            # KeyboardInterrupt once a stop is pending: make this SIGINT the second.
            interrupter.stop(KILL_MESSAGE)
        os.kill(os.getpid(), signal.SIGINT)
        if not self._ended.wait(5.0):
            os.kill(os.getpid(), signal.SIGINT)

    # Drawing --------------------------------------------------------------------
    def _select_first(self) -> None:
        """Chart the first numeric metric until one is chosen (called under the lock)."""
        if self._selected is None and self._run.names:
            self._selected = self._run.names[0]

    def _snapshot(self) -> Snapshot:
        with self._lock:
            return self._run.snapshot(
                self._selected,
                self._view,
                prompt=self._prompt,
                notice=self._notice,
                closing=self._closing,
                scroll=self._scroll,
                follow=self._follow,
            )

    def _size(self) -> tuple[int, int]:
        assert self.console is not None
        size = self.console.size
        return size.width, max(3, min(self.max_height, size.height - 1))

    def _draw(self) -> None:
        """Build the next frame (in the calling thread) and keep it for the next refresh."""
        if self._run.info is None or self.console is None:
            return
        width, height = self._size()
        styles = self._styles
        frame = []
        snapshot = self._snapshot()
        first, shown, count = metrics_scroll(snapshot, height)
        with self._lock:  # keep where the table is, unless a key moved it meanwhile
            if self._scroll == snapshot.scroll and self._follow == snapshot.follow:
                self._scroll, self._follow = first, False
            self._page, self._rows = max(1, shown), count
        for line in dashboard(snapshot, width, height):
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
