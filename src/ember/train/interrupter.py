"""`Interrupter`: a handle to stop training gracefully from anywhere."""

from __future__ import annotations

import threading


class Interrupter:
    """Call `stop(message)` from any thread (a key handler, a signal, a callback); the
    loop finishes the current step, checkpoints and ends cleanly."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.message: str | None = None
        self.signal: int | None = None
        """The signal that asked for the stop (SIGTERM, SIGINT), if one did."""

    def stop(self, message: str | None = None, *, signal: int | None = None) -> None:
        self.message = message or "stop requested"
        self.signal = signal
        self._event.set()

    def should_stop(self) -> bool:
        return self._event.is_set()

    def reset(self) -> None:
        self._event.clear()
        self.message = None
        self.signal = None
