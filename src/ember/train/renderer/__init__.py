"""Renderers: how a run shows itself (plain text lines; the live dashboard)."""

from ember.train.renderer.base import MetricView, Progress, Renderer, RunInfo
from ember.train.renderer.plain import PlainRenderer
from ember.train.renderer.select import default_renderer
from ember.train.renderer.tui import TuiRenderer

__all__ = [
    "MetricView",
    "PlainRenderer",
    "Progress",
    "Renderer",
    "RunInfo",
    "TuiRenderer",
    "default_renderer",
]
