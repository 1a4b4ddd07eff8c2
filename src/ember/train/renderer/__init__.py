"""Renderers: how a run shows itself (plain text lines; the live dashboard)."""

from ember.train.renderer.base import MetricView, Progress, Renderer, RunInfo
from ember.train.renderer.plain import PlainRenderer

__all__ = ["MetricView", "PlainRenderer", "Progress", "Renderer", "RunInfo"]
