"""Checkpointing: files per epoch, written atomically in the background, with retention."""

from ember.train.checkpoint.file import FileCheckpointer
from ember.train.checkpoint.load import load_checkpoint
from ember.train.checkpoint.strategy import (
    CheckpointingStrategy,
    ComposedCheckpointingStrategy,
    KeepLastNCheckpoints,
    MetricCheckpointingStrategy,
)

__all__ = [
    "CheckpointingStrategy",
    "ComposedCheckpointingStrategy",
    "FileCheckpointer",
    "KeepLastNCheckpoints",
    "MetricCheckpointingStrategy",
    "load_checkpoint",
]
