"""Choosing a renderer for where output goes: a live display in a notebook, the dashboard
on a terminal, plain lines elsewhere."""

from __future__ import annotations

from ember.environment import in_notebook, wants_dashboard
from ember.train.renderer.base import Renderer

__all__ = ["default_renderer", "in_notebook", "wants_dashboard"]


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
