"""Where the process runs: a terminal, a notebook kernel, CI, a torchrun launch.

Neutral ground: any module may ask, so this one imports only the standard library.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Mapping

__all__ = ["from_environment", "in_notebook", "wants_dashboard"]

_OFF = ("", "0", "false", "no", "off")


def wants_dashboard(
    stream: IO[str] | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """True when `stream` (default stdout) is a terminal that takes UTF-8, `CI` is not set
    and `TERM` is not `dumb`."""
    stream = stream if stream is not None else sys.stdout
    environ = environ if environ is not None else os.environ
    try:
        terminal = bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        terminal = False
    if not terminal:
        return False
    encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
    if encoding != "utf8":  # the dashboard draws with box and braille characters
        return False
    if environ.get("CI", "").strip().lower() not in _OFF:
        return False
    return environ.get("TERM", "").strip().lower() != "dumb"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (JupyterLab, Notebook, VS Code, Colab): IPython is
    loaded and its shell has a kernel. A terminal IPython is not a notebook. Imports
    nothing: without IPython already loaded, this is False."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if not callable(get_ipython):
        return False
    try:
        shell = get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def existing_group() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) of a default process group of several processes
    that the user's script has already made (`torch.distributed.init_process_group`),
    else None. Asks torch.distributed only when something already imported it."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    world = int(distributed.get_world_size())
    if world <= 1:
        return None
    rank = int(distributed.get_rank())
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def from_environment() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when the process group exists already, or when
    launched by torchrun or by ember, else None."""
    group = existing_group()
    if group is not None:
        return group
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or "RANK" not in os.environ:
        return None
    rank = int(os.environ["RANK"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))
