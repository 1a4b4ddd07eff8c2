"""Warnings a user must see where they watch the run, not only in `experiment.log`.

While a fit runs, `ConsoleNotices` (a logging handler on the `ember` logger, at
WARNING) shows each warning once: through the renderer's optional `notice(text)`
(the plain renderer's stream, above the dashboard, in the notebook cell's output),
else on standard error, escaped (`ember.printable`: names and texts read from a run
can hold control characters). A warning about the run's numbers or settings (a learning
rate falling by 100x within the first epoch, a loss that looks summed over the batch,
hyperparameters kept from the checkpoint, a damaged checkpoint skipped) is missed by
anyone who does not read the log file otherwise.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ember.printable import printable
from ember.train.logger.application import LOGGER_NAME


class ConsoleNotices(logging.Handler):
    """Shows the run's warnings once each, through `renderer.notice` or on stderr."""

    def __init__(self, renderer: Any) -> None:
        super().__init__(logging.WARNING)
        self.renderer = renderer
        self.shown: set[str] = set()
        self.pending: list[str] | None = []
        """Warnings logged before the renderer started, shown right after its first
        lines (`ready`), so that they follow the run's heading instead of preceding it
        (or being cleared with the screen a dashboard takes)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:
            return
        if record.levelno != logging.WARNING or text in self.shown:
            return
        if getattr(record, "ember_console", True) is False:  # shown by its own code
            return
        self.shown.add(text)
        if self.pending is not None:
            self.pending.append(text)
            return
        self.show(text)

    def show(self, text: str) -> None:
        notice = getattr(self.renderer, "notice", None)
        try:
            if callable(notice):
                notice(text)
            else:
                print(f"ember: warning: {printable(text)}", file=sys.stderr, flush=True)
        except Exception:  # showing a warning never ends a run
            pass

    def ready(self) -> None:
        """The renderer has started: show what waited for it, and the rest at once."""
        pending, self.pending = self.pending or [], None
        for text in pending:
            self.show(text)

    def install(self) -> ConsoleNotices:
        logging.getLogger(LOGGER_NAME).addHandler(self)
        return self

    def uninstall(self) -> None:
        """Stop showing warnings; any still waiting for the renderer are shown now."""
        logging.getLogger(LOGGER_NAME).removeHandler(self)
        self.ready()
