"""Which process this is when training runs on several processes."""

from __future__ import annotations

import os

from ember.environment import LaunchError, existing_group, placement


def is_main_process() -> bool:
    """True in the single process of a run, or in rank 0 of several. Guard work that
    must happen once (clearing a directory, saving a config) with it."""
    group = existing_group()
    if group is not None:
        return group[0] == 0
    try:
        found = placement()
    except LaunchError:  # refused when training starts, with the fix
        return os.environ.get("RANK", "0") == "0"
    return found is None or found.rank == 0
