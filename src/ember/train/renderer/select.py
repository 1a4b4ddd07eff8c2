"""Choosing a renderer for where output goes: the dashboard on a terminal, plain lines elsewhere."""

from __future__ import annotations

import os
import sys
from typing import IO, Mapping

from ember.train.renderer.base import Renderer

_OFF = ("", "0", "false", "no", "off")


def wants_dashboard(
    stream: IO[str] | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """True when `stream` (default stdout) is a terminal that takes UTF-8, `CI` is not set
    and `TERM` is not `dumb`."""
    stream = stream if stream is not None else sys.stdout
    environ = environ if environ is not None else os.environ
    try:
        terminal = bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        terminal = False
    if not terminal:
        return False
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
    if encoding != "utf8":  # the dashboard draws with box and braille characters
        return False
    if environ.get("CI", "").strip().lower() not in _OFF:
        return False
    return environ.get("TERM", "").strip().lower() != "dumb"


def default_renderer() -> Renderer:
    """`TuiRenderer()` on an interactive terminal, otherwise `PlainRenderer()` (pipes, log
    files, CI, `TERM=dumb`)."""
    if wants_dashboard():
        from ember.train.renderer.tui import TuiRenderer

        return TuiRenderer()
    from ember.train.renderer.plain import PlainRenderer

    return PlainRenderer()
