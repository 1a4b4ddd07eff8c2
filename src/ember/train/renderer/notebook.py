"""The notebook display: a live view of the run in the cell's output (Jupyter, VS Code,
Colab, any IPython kernel).

One display is opened when training starts and updated in place. Each update is a
MIME bundle with `text/html` (header, progress bars, metrics table, a chart per numeric
metric; see `htmlview`) and `text/plain` (a short summary, for front ends without HTML).
Drawing happens on the training thread, between steps: no other thread writes to the
kernel's output. It is spaced so that it takes a small, bounded share of the run.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

from ember.train.logger.base import MetricRecord
from ember.train.renderer.base import MetricView, Progress, RunInfo
from ember.train.renderer.htmlview import page, plain
from ember.train.renderer.state import RunTracker


def _open_display(bundle: dict[str, str]) -> Any:
    """Show `bundle` in the current cell's output; return the handle that updates it in
    place, or None outside an IPython shell."""
    from IPython import get_ipython
    from IPython.display import display

    if get_ipython() is None:
        return None
    return display(bundle, raw=True, display_id=True)


class NotebookRenderer:
    """A live view of the run in a notebook cell: the model, state and artifact
    directory; progress of the epoch and of the run, with speed, time elapsed and left;
    each metric's last and epoch values per split; and a small chart per numeric metric
    (iteration values as lines, epoch values as markers, x in epochs).

    The view is redrawn at most every `interval` seconds, and further apart when drawing
    takes long, so that it costs at most `render_budget` of the training time. The end
    of a split is drawn at once while the run's drawing share allows, and the end of the
    run always. At most `max_charts` metrics are charted (all are in the table). A
    drawing error stops the updates with a warning; it never stops the run.

    Outside IPython there is no display to update: the plain-text summary is printed
    when the run ends. Needs IPython, which every notebook kernel has.
    """

    def __init__(
        self,
        *,
        interval: float = 0.5,
        render_budget: float = 0.02,
        max_charts: int = 8,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if render_budget < 0:
            raise ValueError(f"render_budget must be >= 0, got {render_budget!r}")
        if max_charts < 0:
            raise ValueError(f"max_charts must be >= 0, got {max_charts!r}")
        self.interval = float(interval)
        self.render_budget = float(render_budget)
        """The largest share of the training time drawing may take; 0: no limit."""
        self.max_charts = int(max_charts)
        self._run = RunTracker(recent=1)  # no view of the recent raw values here
        self._handle: Any = None
        self._broken = False
        self._started = 0.0
        self._next = 0.0
        self.frames = 0
        """Views drawn and sent so far in this run (for tests and benchmarks)."""
        self.draw_seconds = 0.0
        """Seconds the training thread spent drawing and sending views in this run."""

    # Renderer protocol ----------------------------------------------------------
    def start(self, info: RunInfo) -> None:
        """Open the display of a new run."""
        self._run.start(info)
        self._handle = None
        self._broken = False
        self._started = time.perf_counter()
        self.frames = 0
        self.draw_seconds = 0.0
        self._draw(opening=True)

    def update(
        self, progress: Progress, metrics: Sequence[MetricView], records: Sequence[MetricRecord]
    ) -> None:
        """Keep the new values; redraw if the last view is old enough."""
        self._run.update(progress, metrics, records)
        if self._handle is not None and time.perf_counter() >= self._next:
            self._draw()

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        """Keep the split's epoch values; redraw unless drawing is over its share."""
        self._run.end_split(progress, metrics)
        if self._handle is not None:
            spent = time.perf_counter() - self._started
            if self.render_budget <= 0 or self.draw_seconds <= self.render_budget * spent:
                self._draw()

    def valid_point(
        self, iteration: int, progress: Progress, metrics: Sequence[MetricView]
    ) -> None:
        """A validation inside the epoch (`valid_every`): its values become the
        validation's last values in the table."""
        self._run.valid_point(iteration, progress, metrics)

    def end(self, reason: str) -> None:
        """Draw the final view, with how the run ended."""
        if self._run.info is None or self._run.reason is not None:
            return
        self._run.end(reason)
        if self._handle is not None:
            self._draw()
        elif not self._broken:
            print(self.mime_bundle()["text/plain"])

    # Views ------------------------------------------------------------------------
    def mime_bundle(self) -> dict[str, str]:
        """The current view: `text/html` and `text/plain` (empty before `start`)."""
        if self._run.info is None:
            return {"text/html": "", "text/plain": ""}
        snapshot = self._run.snapshot()
        names = self._run.names[: self.max_charts]
        series = {name: self._run.series(name) for name in names}
        hidden = len(self._run.names) - len(names)
        return {"text/html": page(snapshot, series, hidden), "text/plain": plain(snapshot)}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """IPython shows the renderer as its current view."""
        return self.mime_bundle()

    def _draw(self, opening: bool = False) -> None:
        """Build the view and send it, timing both; after an error, draw no more."""
        if self._broken:
            return
        began = time.perf_counter()
        try:
            bundle = self.mime_bundle()
            if opening:
                self._handle = _open_display(bundle)
            elif self._handle is not None:
                self._handle.update(bundle, raw=True)
        except Exception as error:  # the display must never take the run down
            self._broken = True
            self._handle = None
            warnings.warn(
                f"The notebook display of the run stopped updating ({type(error).__name__}: "
                f"{error}); training goes on. The artifact directory has every value.",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        cost = time.perf_counter() - began
        self.frames += 1
        if opening:  # before training, with one-time costs: not part of the budget
            self._next = time.perf_counter() + self.interval
            return
        self.draw_seconds += cost
        # Space the views so that each one costs at most `render_budget` of the time.
        spacing = cost / self.render_budget if self.render_budget > 0 else 0.0
        self._next = time.perf_counter() + max(self.interval, spacing)
