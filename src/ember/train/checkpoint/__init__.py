"""Checkpointing: files per epoch, written atomically."""

from ember.train.checkpoint.file import FileCheckpointer

__all__ = ["FileCheckpointer"]
