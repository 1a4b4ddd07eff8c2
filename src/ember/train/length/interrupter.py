"""`Interrupter`: a handle to stop training gracefully from anywhere."""

from __future__ import annotations


class Interrupter:
    """Call `stop(message)` from any thread (a key handler, a signal, a callback); the
    loop finishes the current step, checkpoints and ends cleanly."""

    def __init__(self) -> None:
        self.requested = False
        """Set once a stop is asked for (a plain flag: the loop reads it every step)."""
        self.message: str | None = None
        self.signal: int | None = None
        """The signal that asked for the stop (SIGTERM, SIGINT), if one did."""

    def stop(self, message: str | None = None, *, signal: int | None = None) -> None:
        self.message = message or "stop requested"
        self.signal = signal
        self.requested = True

    def should_stop(self) -> bool:
        return self.requested

    def reset(self) -> None:
        self.requested = False
        self.message = None
        self.signal = None
