"""Unpacking msgpack from a file that may be hostile, within a fixed budget.

msgpack refuses a container that declares more items than the bytes left could hold,
but a file can truly hold a million tiny items (one byte each): decoding them all would
take seconds and hundreds of MiB of Python objects. Here every map and array counts
itself and its items against one budget, and the decoding stops as soon as the file
has more than any record ember writes (a record's tensors are single byte strings, so
even a large model's record holds a few entries per tensor).
"""

from __future__ import annotations

import gc
from typing import Any

import msgpack

from ember.record.problem import RecordProblem

MAX_ENTRIES = 1 << 19
"""The most maps, arrays and items (a map's key-value pair is one) that one record may
hold: about 170,000 tensors with their dtype and shape."""

MAX_MAP_LEN = 1 << 17
"""The most keys one map may hold (a model's state dict has one per tensor)."""


def unpack_bounded(data: bytes | bytearray | memoryview) -> Any:
    """The msgpack object in `data`; `RecordProblem` as soon as it holds more than
    `MAX_ENTRIES` containers and items in all, or a map more than `MAX_MAP_LEN` keys."""
    spent = 0

    def over() -> RecordProblem:
        return RecordProblem(
            f"it declares more than {MAX_ENTRIES:,} entries, more than any record ember "
            "writes holds (the file is damaged or not an ember record)"
        )

    def array(items: list[Any]) -> list[Any]:
        nonlocal spent
        spent += len(items) + 1
        if spent > MAX_ENTRIES:
            raise over()
        return items

    def mapping(items: dict[Any, Any]) -> dict[Any, Any]:
        nonlocal spent
        spent += len(items) + 1
        if spent > MAX_ENTRIES:
            raise over()
        return items

    size = len(data)
    collecting = gc.isenabled()
    gc.disable()  # the objects made here cannot form cycles: no collection is needed
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            use_list=True,
            list_hook=array,
            object_hook=mapping,
            max_map_len=min(size // 2, MAX_MAP_LEN),
            max_array_len=min(size, MAX_ENTRIES),
        )
    except ValueError as error:
        if "exceeds max_" in str(error):
            raise RecordProblem(
                f"a map or array declares more items than a record can hold ({error})"
            ) from None
        raise
    finally:
        if collecting:
            gc.enable()
