"""`Interrupter`: a handle to stop training gracefully from anywhere."""

from __future__ import annotations

import threading


class Interrupter:
    """Call `stop(message)` from any thread (a key handler, a signal, a callback); the
    loop finishes the current step, checkpoints and ends cleanly."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.message: str | None = None

    def stop(self, message: str | None = None) -> None:
        self.message = message or "stop requested"
        self._event.set()

    def should_stop(self) -> bool:
        return self._event.is_set()

    def reset(self) -> None:
        self._event.clear()
        self.message = None
