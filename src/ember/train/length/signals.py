"""Ctrl-C and SIGTERM during `fit`: the first asks for a graceful stop; a second Ctrl-C
stops at once while the run trains, but not once it has ended and is writing its last
records (its outcome, its session): then it is told to wait, and only a third stops."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

from ember.environment import in_notebook
from ember.train.length.interrupter import Interrupter

_SIGINT_MESSAGE = "interrupted by Ctrl-C (press it again to stop at once)"
_SIGINT_MESSAGE_NOTEBOOK = "interrupted from the notebook (interrupt again to stop at once)"


_CLOSING_MESSAGE = (
    "ember: the run has ended and is writing its last records; press Ctrl-C once more to "
    "stop at once (they may be left incomplete)"
)


class Handlers:
    """The handlers installed for a fit: `closing()` once the training has ended."""

    def __init__(self) -> None:
        self.closed = False
        self.presses = 0
        """Ctrl-C presses since `closing()`."""

    def closing(self) -> None:
        """The run has ended (its last checkpoint is written): a Ctrl-C no longer cuts it
        short; it is told to wait, and a second one stops at once."""
        self.closed = True


@contextlib.contextmanager
def signal_handlers(interrupter: Interrupter, preemption: Any = None) -> Iterator[Handlers]:
    """While training: SIGTERM and a first Ctrl-C stop gracefully (checkpoint, clean
    exit); a second Ctrl-C raises KeyboardInterrupt at once (after `closing()`: the
    second is told to wait, the third raises); the signal of `preemption` (a
    `Preemption`, if given) stops gracefully too. Only in the main thread."""
    handlers = Handlers()
    if threading.current_thread() is not threading.main_thread():
        yield handlers
        return

    def on_sigint(signum: int, frame: Any) -> None:
        if handlers.closed:
            handlers.presses += 1
            if handlers.presses > 1:
                raise KeyboardInterrupt
            print(_CLOSING_MESSAGE, file=sys.stderr, flush=True)
            return
        if interrupter.should_stop():
            raise KeyboardInterrupt
        interrupter.stop(
            _SIGINT_MESSAGE_NOTEBOOK if in_notebook() else _SIGINT_MESSAGE, signal=signum
        )

    def on_sigterm(signum: int, frame: Any) -> None:
        interrupter.stop("terminated by SIGTERM", signal=signum)

    def on_preemption(signum: int, frame: Any) -> None:
        interrupter.stop(f"preempted by {signal.Signals(signum).name}", signal=signum)

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, on_sigint),
        signal.SIGTERM: signal.signal(signal.SIGTERM, on_sigterm),
    }
    if preemption is not None:
        replaced = signal.signal(preemption.signal, on_preemption)
        previous.setdefault(preemption.signal, replaced)  # SIGTERM: the original handler
    try:
        yield handlers
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
