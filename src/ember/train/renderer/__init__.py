"""Renderers: how a run shows itself (plain text lines, the terminal dashboard, the
notebook display)."""

from typing import TYPE_CHECKING

from ember._lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "MetricView": "ember.train.renderer.base",
        "NotebookRenderer": "ember.train.renderer.notebook",
        "PlainRenderer": "ember.train.renderer.plain",
        "Progress": "ember.train.renderer.base",
        "Renderer": "ember.train.renderer.base",
        "RunInfo": "ember.train.renderer.base",
        "TuiRenderer": "ember.train.renderer.tui",
        "default_renderer": "ember.train.renderer.select",
        "in_notebook": "ember.train.renderer.select",
    },
)

if TYPE_CHECKING:
    from ember.train.renderer.base import MetricView, Progress, Renderer, RunInfo
    from ember.train.renderer.notebook import NotebookRenderer
    from ember.train.renderer.plain import PlainRenderer
    from ember.train.renderer.select import default_renderer, in_notebook
    from ember.train.renderer.tui import TuiRenderer
