"""Recorders under the names most code should use, each with its precision preset."""

from __future__ import annotations

from ember.record.binary import BinGzFileRecorder
from ember.record.mpk import NamedMpkFileRecorder, NamedMpkGzFileRecorder
from ember.record.precision import PrecisionLike


class DefaultRecorder(NamedMpkFileRecorder):
    """Named msgpack at full precision (float32; float64 weights stay float64): fast and
    exact; the usual choice."""

    def __init__(self, precision: PrecisionLike = "full") -> None:
        super().__init__(precision)


class CompactRecorder(NamedMpkGzFileRecorder):
    """Gzipped named msgpack with float16 weights: about 0.42x the float32 size (0.35x with
    `precision="bf16"`)."""

    def __init__(self, precision: PrecisionLike = "half") -> None:
        super().__init__(precision)


class SensitiveCompactRecorder(BinGzFileRecorder):
    """Gzipped binary container with float16 weights, for when file size matters most."""

    def __init__(self, precision: PrecisionLike = "half") -> None:
        super().__init__(precision)
