"""Which process this is when training runs on several processes."""

from __future__ import annotations

import os


def is_main_process() -> bool:
    """True in the single process of a run, or in rank 0 of several. Guard work that
    must happen once (clearing a directory, saving a config) with it."""
    return os.environ.get("RANK", "0") == "0"
