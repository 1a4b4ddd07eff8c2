"""The checksum stored inside a record's own bytes (`ember.checksum`), under its record name."""

from ember.checksum import CHANGED, DIGITS, PLACEHOLDER, seal, verify

__all__ = ["CHANGED", "DIGITS", "PLACEHOLDER", "seal", "verify"]
