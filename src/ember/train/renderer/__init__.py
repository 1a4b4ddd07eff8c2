"""Renderers: how a run shows itself (plain text lines; the live dashboard)."""

from typing import TYPE_CHECKING

from ember._lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        "MetricView": "ember.train.renderer.base",
        "PlainRenderer": "ember.train.renderer.plain",
        "Progress": "ember.train.renderer.base",
        "Renderer": "ember.train.renderer.base",
        "RunInfo": "ember.train.renderer.base",
        "TuiRenderer": "ember.train.renderer.tui",
        "default_renderer": "ember.train.renderer.select",
    },
)

if TYPE_CHECKING:
    from ember.train.renderer.base import MetricView, Progress, Renderer, RunInfo
    from ember.train.renderer.plain import PlainRenderer
    from ember.train.renderer.select import default_renderer
    from ember.train.renderer.tui import TuiRenderer
