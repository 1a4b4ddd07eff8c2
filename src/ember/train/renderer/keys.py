"""Key presses from a terminal: stdin in cbreak mode, read on a background thread."""

from __future__ import annotations

import os
import sys
import threading
from typing import IO, Any, Callable

_ARROWS = {"A": "up", "B": "down", "C": "right", "D": "left"}
_TILDE = {"5": "pageup", "6": "pagedown"}
"""Keys sent as ESC [ number ~."""


def parse_keys(data: bytes) -> list[str]:
    """Key names in a chunk read from a terminal: "up", "down", "left", "right",
    "pageup", "pagedown", "escape", "enter", or the character typed."""
    keys: list[str] = []
    text = data.decode("utf-8", errors="ignore")
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\x1b":
            if index + 1 < len(text) and text[index + 1] in "[O":
                # CSI / SS3: parameters, then a final letter (arrows: A-D).
                end = index + 2
                while end < len(text) and not ("@" <= text[end] <= "~"):
                    end += 1
                final = text[end] if end < len(text) else ""
                if final in _ARROWS:
                    keys.append(_ARROWS[final])
                elif final == "~" and text[index + 2 : end] in _TILDE:
                    keys.append(_TILDE[text[index + 2 : end]])
                index = end + 1
                continue
            keys.append("escape")
        elif char in "\r\n":
            keys.append("enter")
        elif char.isprintable():
            keys.append(char)
        index += 1
    return keys


def stdin_is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether `stream` (default stdin) is a terminal whose modes can be set."""
    stream = stream if stream is not None else sys.stdin
    try:
        import termios  # noqa: F401 - POSIX only

        return bool(stream is not None and stream.isatty())
    except (ImportError, AttributeError, ValueError, OSError):
        return False


class KeyReader:
    """Puts the terminal on `stream` (default stdin) in cbreak mode (keys arrive one by one,
    unechoed; Ctrl-C still interrupts) and calls `on_key(name)` from a daemon thread."""

    def __init__(self, on_key: Callable[[str], None], stream: IO[str] | None = None) -> None:
        self._on_key = on_key
        self._stream = stream if stream is not None else sys.stdin
        self._fd: int | None = None
        self._saved: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Enter cbreak mode and start reading; False (and nothing changed) if stdin is not
        a terminal or this process runs in the background."""
        if not stdin_is_terminal(self._stream):
            return False
        import termios
        import tty

        try:
            fd = self._stream.fileno()
            if os.tcgetpgrp(fd) != os.getpgrp():
                return False  # a background job: touching the terminal would stop it
            self._saved = termios.tcgetattr(fd)
            tty.setcbreak(fd, termios.TCSANOW)
        except (OSError, termios.error, ValueError):
            self._saved = None
            return False
        self._fd = fd
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ember-keys", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        import select

        fd = self._fd
        assert fd is not None
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    self._keep_cbreak(fd)
                    continue
                data = os.read(fd, 64)
            except (OSError, ValueError):
                return
            if not data:
                return
            for key in parse_keys(data):
                if self._stop.is_set():
                    return
                try:
                    self._on_key(key)
                except Exception:  # a key handler must not end the reader
                    pass

    def _keep_cbreak(self, fd: int) -> None:
        """Enter cbreak mode again if the terminal left it: after Ctrl-Z and `fg` the shell
        hands the terminal back in its own (line-by-line, echoing) mode. Only while this
        process is the foreground job: setting modes from the background would stop it."""
        import termios
        import tty

        with self._lock:
            if self._saved is None or self._stop.is_set():
                return
            try:
                if os.tcgetpgrp(fd) != os.getpgrp():
                    return
                if termios.tcgetattr(fd)[3] & (termios.ICANON | termios.ECHO):
                    tty.setcbreak(fd, termios.TCSANOW)
            except (OSError, termios.error, ValueError):
                pass

    def restore(self) -> None:
        """Give the terminal its saved modes back (idempotent, safe from any thread)."""
        with self._lock:
            if self._saved is None or self._fd is None:
                return
            import termios

            try:
                termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            except (OSError, termios.error, ValueError):
                pass
            self._saved = None

    def stop(self) -> None:
        """Stop reading and restore the terminal."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
        self.restore()
