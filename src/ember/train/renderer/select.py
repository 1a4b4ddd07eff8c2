"""Choosing a renderer for where output goes: a live display in a notebook, the dashboard
on a terminal, plain lines elsewhere."""

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


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Colab): IPython is
    loaded and its shell has a kernel. A terminal IPython is not a notebook. Imports
    nothing: without IPython already loaded, this is False."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if not callable(get_ipython):
        return False
    try:
        shell = get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def default_renderer() -> Renderer:
    """`NotebookRenderer()` in a Jupyter kernel, `TuiRenderer()` on an interactive
    terminal, otherwise `PlainRenderer()` (pipes, log files, CI, `TERM=dumb`)."""
    if in_notebook():
        from ember.train.renderer.notebook import NotebookRenderer

        return NotebookRenderer()
    if wants_dashboard():
        from ember.train.renderer.tui import TuiRenderer

        return TuiRenderer()
    from ember.train.renderer.plain import PlainRenderer

    return PlainRenderer()
