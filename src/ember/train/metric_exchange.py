"""What the metric states exchange: with the other processes (each rank's rows of the
epoch gathered on rank 0, the whole-epoch states merged there), and with a checkpoint
taken inside an epoch (the whole-epoch states it keeps, merged back on resume). The
`MetricsProcessor` calls these on the current split's states."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

from ember.train.logger.base import MetricRecord
from ember.train.metric.state import MetricState

log = logging.getLogger("ember.train.processor")  # the processor's log


def merges(metric: Any) -> bool:
    """Whether `metric` keeps a whole-epoch state that merges with others' (AUROC,
    F-beta, ...): `epoch_state()` and `merge_epoch_states(states)`."""
    return callable(getattr(metric, "epoch_state", None)) and callable(
        getattr(metric, "merge_epoch_states", None)
    )


def warn_unmerged(states: Mapping[str, Sequence[MetricState]]) -> None:
    """Several processes: name the metrics whose epoch value will cover rank 0's
    share of the data only (whole-epoch metrics that cannot merge their state)."""
    for split, split_states in states.items():
        for state in split_states:
            metric = state.metric
            whole_epoch = callable(getattr(metric, "epoch_value", None))
            mergeable = callable(getattr(metric, "merge_epoch_states", None))
            if whole_epoch and not mergeable and not getattr(metric, "syncs_itself", False):
                log.warning(
                    "%s (%s) computes its epoch value from the whole epoch: under several "
                    "processes it covers rank 0's share of the data only.",
                    state.name,
                    split,
                )


def gather_rows(
    states: Sequence[MetricState],
    dist: Any,
    records: list[MetricRecord],
    items: int,
    next_iteration: int,
) -> int:
    """Several processes: rank 0 receives every other rank's rows of this split's
    epoch, adds them to its states and to `records` (so the files hold every
    sample's line and their weighted mean is the global epoch value); returns the
    epoch's items so far (on rank 0, every rank's; elsewhere, `items`).

    Each row travels with its iteration number. The processes step together, so
    iteration i of every rank is the same step: its records all carry i. The rows
    a rank drained now have their iterations in `records`; the ones drained at
    earlier ticks (whose records only rank 0 kept) are the iterations just before,
    one row per iteration (`next_iteration` follows the last when none is in
    `records`)."""
    mine: dict[str, list[tuple[int, float, float]]] = {}
    for state in states:
        rows = state.take_unshared()
        latest = [record.iteration for record in records if record.name == state.name]
        first = latest[0] if latest else next_iteration
        earlier = len(rows) - len(latest)
        iterations = [*range(first - earlier, first), *latest]
        mine[state.name] = [(i, value, weight) for i, (value, weight) in zip(iterations, rows)]
    everyone = dist.all_gather((items, mine))
    if not dist.main:
        return items
    for _, rows_of_rank in everyone[1:]:
        for state in states:
            numbered = rows_of_rank.get(state.name, [])
            state.add_rows(
                [value for _, value, _ in numbered], [weight for _, _, weight in numbered], True
            )
            records.extend(
                MetricRecord(state.name, iteration, value, weight)
                for iteration, value, weight in numbered
            )
    return sum(count for count, _ in everyone)


def merge_epoch_states(states: Sequence[MetricState], dist: Any) -> None:
    """Metrics whose epoch value needs the whole epoch receive the other processes'
    state on rank 0 before computing it."""
    for state in states:
        if merges(state.metric):
            everyone = dist.all_gather(state.metric.epoch_state())
            if dist.main:
                state.metric.merge_epoch_states(everyone[1:])


def epoch_states(states: Sequence[MetricState]) -> dict[str, Any]:
    """The whole-epoch metric states, by name: what a checkpoint taken mid-epoch
    keeps so a resumed epoch's value covers it all."""
    return {state.name: state.metric.epoch_state() for state in states if merges(state.metric)}


def restore_epoch_states(
    states: Sequence[MetricState], saved: list[dict[str, Any]], device: Any
) -> None:
    """Merge saved whole-epoch states (one dict per process whose share this process
    now covers) back into `states`' metrics, moved to `device`."""
    from ember.record.tree import map_tensors

    for state in states:
        parts = [one[state.name] for one in saved if state.name in one]
        if parts and callable(getattr(state.metric, "merge_epoch_states", None)):
            state.metric.merge_epoch_states(
                [map_tensors(part, lambda tensor: tensor.to(device)) for part in parts]
            )
