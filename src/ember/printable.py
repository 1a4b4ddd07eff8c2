"""Text read from a run's files, made safe to print on a terminal.

A run directory's name, a stop reason, a model class name or a metric name can hold
escape sequences, BEL, carriage returns or newlines: printed raw they can clear the
screen, retitle the terminal or add rows that are not there. Every text that ember
prints from a run's records goes through `printable`, which shows such characters
escaped (`\\x1b`, `\\n`, `\\u202e`) and leaves everything else as it is.
"""

from __future__ import annotations

__all__ = ["printable", "printable_lines"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """`str(text)` with every character that is not printable (C0 and C1 controls, DEL,
    line and paragraph separators, format characters such as bidirectional overrides)
    escaped; a space stays a space."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def printable_lines(text: object) -> str:
    """`printable` of each line of `text`, the newlines between them kept: for output
    whose lines ember laid out itself (its fields escaped with `printable` first)."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def _escaped(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
