"""How floating-point weights of a module are stored: the `Precision` of a record."""

from __future__ import annotations

from enum import Enum
from typing import Literal, Union

import torch

from ember.errors import ConfigError


class Precision(str, Enum):
    """Storage dtype for the floating-point tensors of module records; other data stays exact.

    "full" loses nothing: float32, or float64 for a float64 tensor (a double-precision
    model resumes exactly). "half" and "bf16" round to 16 bits; "double" widens to 64.
    """

    FULL = "full"
    HALF = "half"
    BF16 = "bf16"
    DOUBLE = "double"

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype module weights are stored as (float64 ones stay float64 at
        "full": `stored`)."""
        return _DTYPES[self]

    def stored(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a floating-point tensor of `dtype` is stored as."""
        if self is Precision.FULL and dtype == torch.float64:
            return dtype  # never narrowed: "full" is lossless
        return _DTYPES[self]

    @classmethod
    def parse(cls, value: PrecisionLike) -> Precision:
        """Accept a `Precision`, its name ("half") or the matching torch dtype."""
        if isinstance(value, Precision):
            return value
        if isinstance(value, torch.dtype):
            for precision, dtype in _DTYPES.items():
                if dtype == value:
                    return precision
        elif isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(repr(p.value) for p in cls)
        raise ConfigError(f"unknown precision {value!r}; expected one of {names}")


_DTYPES: dict[Precision, torch.dtype] = {
    Precision.FULL: torch.float32,
    Precision.HALF: torch.float16,
    Precision.BF16: torch.bfloat16,
    Precision.DOUBLE: torch.float64,
}

PrecisionLike = Union[Precision, Literal["full", "half", "bf16", "double"], torch.dtype]
"""What recorder constructors accept as a precision."""
