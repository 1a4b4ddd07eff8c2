"""Where a rank is: what its training thread waits in (a collective, a barrier, a wait
named by `name_wait`), the line of the user's code it is at, and the learner's epoch
and iteration, read from the stack of that thread or from a traceback."""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import torch

_TORCH = os.path.dirname(torch.__file__) + os.sep
_EMBER = str(Path(__file__).resolve().parents[2]) + os.sep
_STDLIB = tuple(
    {sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep}
)

# What a rank waits for while its thread runs a code object, for the hang reports: the
# group's own waits are named in `joining`, the others' by `name_wait`
_LABELS: dict[types.CodeType, str] = {}


def name_wait(code: types.CodeType, label: str) -> None:
    """Name what a rank waits for while its thread runs `code` (e.g. the setup of a
    parallel strategy), for the hang reports."""
    _LABELS[code] = label


def frame_of(thread: int) -> types.FrameType | None:
    return sys._current_frames().get(thread)


def stack(frame: types.FrameType | None, limit: int = 200) -> list[types.FrameType]:
    """`frame` and its callers, innermost first."""
    frames: list[types.FrameType] = []
    while frame is not None and len(frames) < limit:
        frames.append(frame)
        frame = frame.f_back
    return frames


def traceback_frames(tb: types.TracebackType | None) -> list[types.FrameType]:
    """The frames a traceback went through, innermost first."""
    frames: list[types.FrameType] = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames[::-1]


def waiting_in(frames: list[types.FrameType]) -> str | None:
    """What the thread whose stack is `frames` waits in for the other ranks, or None
    when it runs code of its own (computing, loading data, sleeping)."""
    if not frames:
        return None
    if frames[0].f_code in _LABELS:  # e.g. waiting for a CUDA result of a collective
        return _LABELS[frames[0].f_code]
    if not frames[0].f_code.co_filename.startswith(_TORCH):
        return None
    for frame in frames:
        label = _LABELS.get(frame.f_code)
        if label is not None:
            return label
        path = frame.f_code.co_filename
        if path.startswith(_TORCH + "autograd" + os.sep):
            return "the gradient synchronisation"
        if path.startswith(_TORCH + os.path.join("distributed", "algorithms", "join")):
            return "the end of the epoch's batches (DDP join)"
        if not path.startswith((_TORCH, _EMBER)):
            break
    if frames[0].f_code.co_filename.startswith(_TORCH + "distributed" + os.sep):
        return f"a torch.distributed collective ({frames[0].f_code.co_name})"
    return None


def _location(frames: list[types.FrameType]) -> str:
    """The innermost frame of the user's code (else of ember, else any), as
    `path:line in function (source)`."""

    def own(path: str) -> bool:
        return not path.startswith((_TORCH, _EMBER, *_STDLIB)) and not path.startswith("<")

    for test in (own, lambda path: not path.startswith(_STDLIB), lambda path: True):
        for frame in frames:
            path = frame.f_code.co_filename
            if test(path):
                source = linecache.getline(path, frame.f_lineno).strip()
                try:
                    relative = os.path.relpath(path)
                except ValueError:  # another drive
                    relative = path
                shown = path if relative.startswith("..") else relative
                text = f"{shown}:{frame.f_lineno} in {frame.f_code.co_name}"
                return f"{text} ({source})" if source else text
    return "an unknown place"


def learner_position(frames: list[types.FrameType]) -> str | None:
    """The learner's epoch and iteration, read from the `Learner` on the stack."""
    validating = False
    for frame in frames:
        code = frame.f_code
        validating = validating or code.co_name == "valid_epoch"
        if code.co_varnames[:1] != ("self",):
            continue
        owner = frame.f_locals.get("self")
        if not any(c.__name__ == "Learner" for c in type(owner).__mro__):
            continue
        epoch, iteration = getattr(owner, "epoch", None), getattr(owner, "iteration", None)
        if isinstance(epoch, int) and isinstance(iteration, int):
            if epoch == 0:  # fit's checks on its first batches, before any epoch
                return "the checks before training"
            if validating:
                return f"the validation of epoch {epoch}"
            return f"epoch {epoch}, iteration {iteration}"
    return None


def whereabouts(frames: list[types.FrameType]) -> dict[str, Any]:
    """Where a thread is (its stack `frames`, innermost first), for the other ranks."""
    return {
        "waiting": waiting_in(frames),
        "location": _location(frames),
        "position": learner_position(frames),
    }
