"""The renderer of processes that show nothing (every rank but 0)."""

from __future__ import annotations

from typing import Any


class SilentRenderer:
    """What ranks other than 0 render: nothing."""

    def start(self, info: Any) -> None:
        pass

    def update(self, progress: Any, metrics: Any, records: Any) -> None:
        pass

    def end_split(self, progress: Any, metrics: Any) -> None:
        pass

    def end(self, reason: str) -> None:
        pass
