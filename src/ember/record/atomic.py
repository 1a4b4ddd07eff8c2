"""Crash-safe file replacement (`ember.durable`), kept under its record name."""

from ember.durable import atomic_write_bytes, fsync_directory

__all__ = ["atomic_write_bytes", "fsync_directory"]
