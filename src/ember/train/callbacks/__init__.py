"""Callbacks: hooks that may change training, whose state checkpoints keep."""

from ember.train.callbacks.base import HOOKS, Callback, Context
from ember.train.callbacks.ema import EMA

__all__ = ["EMA", "HOOKS", "Callback", "Context"]
