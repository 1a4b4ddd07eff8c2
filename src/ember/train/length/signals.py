"""Ctrl-C and SIGTERM during `fit`: the first asks for a graceful stop."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

from ember.environment import in_notebook
from ember.train.length.interrupter import Interrupter

_SIGINT_MESSAGE = "interrupted by Ctrl-C (press it again to stop at once)"
_SIGINT_MESSAGE_NOTEBOOK = "interrupted from the notebook (interrupt again to stop at once)"


@contextlib.contextmanager
def signal_handlers(interrupter: Interrupter, preemption: Any = None) -> Iterator[None]:
    """While training: SIGTERM and a first Ctrl-C stop gracefully (checkpoint, clean
    exit); a second Ctrl-C raises KeyboardInterrupt at once; the signal of `preemption`
    (a `Preemption`, if given) stops gracefully too. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
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
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
