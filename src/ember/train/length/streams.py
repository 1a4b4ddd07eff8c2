"""The random streams of a layout's columns (`Layout`): the forward of each micro-batch
draws from its column's stream, as it did on the process that ran the column when the
run started, so a run resumed on fewer processes draws the same dropout masks."""

from __future__ import annotations

from typing import Any

import torch


def stream_state(device: torch.device) -> dict[str, Any]:
    """This process's random stream now: torch's CPU generator and, on a CUDA device,
    that device's generator."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def put_stream(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"].cpu().to(torch.uint8), device)


def saved_streams(learner: dict[str, Any], columns: int) -> list[dict[str, Any]] | None:
    """Each column's stream in a checkpoint's state (None when it did not keep them):
    the columns it noted, or the processes' own streams when each ran one column."""
    noted = learner.get("columns")
    if isinstance(noted, list) and len(noted) == columns:
        return noted
    ranks = learner.get("rng_ranks")
    if isinstance(ranks, list) and len(ranks) == columns:
        return [{"torch": rank["torch"]} for rank in ranks]
    return None


class ColumnStreams:
    """The streams of the columns this process runs: `enter` before a micro-batch's
    forward puts its column's stream in place, `leave` after its backward keeps it."""

    def __init__(
        self, columns: list[int], states: list[dict[str, Any]], device: torch.device
    ) -> None:
        self.device = device
        self.states = {column: states[column] for column in columns}

    def enter(self, column: int) -> None:
        put_stream(self.states[column], self.device)

    def leave(self, column: int) -> None:
        self.states[column] = stream_state(self.device)

    def state(self) -> list[tuple[int, dict[str, Any]]]:
        """Each column's stream, for a checkpoint."""
        return sorted(self.states.items())
