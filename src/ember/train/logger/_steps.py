"""Global steps for loggers that plot one series per metric across epochs, and the
merge of several processes' values into one value per step."""

from __future__ import annotations

import json
from typing import Any, Sequence

from ember.train.logger.base import MetricRecord, RunStart


class GlobalSteps:
    """Counts iterations per split across epochs.

    The global step of an iteration is the number of iterations this counter has seen in
    that split so far, across epochs, counting this one: epoch 1 of 5 iterations gives
    steps 1..5 and epoch 2 continues at 6. Iteration numbers restart at 1 each epoch, so
    an epoch's length is the highest iteration number seen in it.

    The lengths of the finished epochs are what a resumed run needs to place its steps
    after the earlier ones: `to_text` gives them in a short form that a logger stores
    beside its output, and `from_text` reads them back.
    """

    def __init__(self) -> None:
        self._epoch: dict[str, int | None] = {}
        self._before: dict[str, int] = {}
        self._highest: dict[str, int] = {}
        self._lengths: dict[str, dict[int, int]] = {}

    def step(self, split: str, epoch: int, iteration: int) -> int:
        """The global step of `iteration` of `epoch` in `split`."""
        if split not in self._epoch:
            self._epoch[split] = epoch
            self._before.setdefault(split, 0)
            self._highest[split] = 0
        elif self._epoch[split] != epoch:
            self._roll(split)
            self._epoch[split] = epoch
        if iteration > self._highest[split]:
            self._highest[split] = iteration
        return self._before[split] + iteration

    def end_epoch(self, split: str, epoch: int) -> None:
        """The split's epoch is over: later iterations count after its last one."""
        if split in self._epoch and self._epoch[split] == epoch:
            self._roll(split)
            self._epoch[split] = None

    def last(self, split: str) -> int:
        """The global step of the last iteration counted in `split` (0 before any)."""
        return self._before.get(split, 0) + self._highest.get(split, 0)

    def resume(self, run: RunStart) -> None:
        """Forget the epochs from `run.epoch` on, except the training iterations the
        resumed run has done already: the next steps continue after those."""
        for lengths in self._lengths.values():
            for epoch in [e for e in lengths if e >= run.epoch]:
                del lengths[epoch]
        self._before = {split: sum(lengths.values()) for split, lengths in self._lengths.items()}
        self._epoch, self._highest = {}, {}
        if run.iteration:
            self._epoch["train"] = run.epoch
            self._before.setdefault("train", 0)
            self._highest["train"] = run.iteration

    def to_text(self) -> str:
        """The finished epochs' lengths per split, as JSON: runs of `[length, count]`
        from epoch 1 (epochs without values count 0)."""
        return json.dumps(
            {split: _runs(lengths) for split, lengths in sorted(self._lengths.items())},
            separators=(",", ":"),
        )

    @classmethod
    def from_text(cls, text: str) -> GlobalSteps:
        """The counter `to_text` described, with no epoch in progress; ValueError if
        `text` is not such a description."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        steps = cls()
        for split, runs in data.items():
            lengths: dict[int, int] = {}
            epoch = 1
            for length, count in runs:
                if (
                    not (isinstance(length, int) and isinstance(count, int))
                    or min(length, count) < 0
                ):
                    raise ValueError(f"bad run {[length, count]!r}")
                for _ in range(count):
                    if length:
                        lengths[epoch] = length
                    epoch += 1
            steps._lengths[str(split)] = lengths
            steps._before[str(split)] = sum(lengths.values())
        return steps

    def _roll(self, split: str) -> None:
        epoch, highest = self._epoch[split], self._highest[split]
        if epoch is not None and highest:
            lengths = self._lengths.setdefault(split, {})
            lengths[epoch] = lengths.get(epoch, 0) + highest
        self._before[split] += highest
        self._highest[split] = 0


def _runs(lengths: dict[int, int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for epoch in range(1, max(lengths, default=0) + 1):
        length = lengths.get(epoch, 0)
        if runs and runs[-1][0] == length:
            runs[-1][1] += 1
        else:
            runs.append([length, 1])
    return runs


class ProcessMerge:
    """Joins the values that several processes give for the same iteration into one.

    Under N processes each iteration's value of a metric arrives N times (rank 0's
    as the run goes, the others' when the processes exchange them), all with the
    same iteration number. A series with one point per step wants one value: their
    weighted mean (the plain mean if the weights sum to 0), with the summed weight.
    An iteration is released once its N values are in and every earlier pending
    iteration of that metric is released too, so steps only ever increase;
    `release` gives out whatever is left (at a split's epoch end, on close). With
    one process, records pass straight through.
    """

    def __init__(self, processes: int = 1) -> None:
        self.processes = processes
        # (split, name) -> iteration -> [epoch, count, sum of value * weight, weight, values]
        self._pending: dict[tuple[str, str], dict[int, list[Any]]] = {}

    def add(
        self, split: str, epoch: int, records: Sequence[MetricRecord]
    ) -> list[tuple[int, MetricRecord]]:
        """`(epoch, record)` for each record ready to be written, in order."""
        if self.processes <= 1:
            return [(epoch, record) for record in records]
        touched: list[tuple[str, str]] = []
        for record in records:
            key = (split, record.name)
            pending = self._pending.setdefault(key, {})
            entry = pending.get(record.iteration)
            if entry is None:
                entry = pending[record.iteration] = [epoch, 0, 0.0, 0.0, 0.0]
            entry[1] += 1
            entry[2] += record.value * record.weight
            entry[3] += record.weight
            entry[4] += record.value
            if key not in touched:
                touched.append(key)
        ready: list[tuple[int, MetricRecord]] = []
        for key in touched:
            ready.extend(self._take(key, complete_only=True))
        return ready

    def release(self, split: str | None = None) -> list[tuple[str, int, MetricRecord]]:
        """`(split, epoch, record)` for everything still pending (of `split`, or all)."""
        out: list[tuple[str, int, MetricRecord]] = []
        for key in [k for k in self._pending if split is None or k[0] == split]:
            out.extend((key[0], epoch, record) for epoch, record in self._take(key, False))
        return out

    def _take(self, key: tuple[str, str], complete_only: bool) -> list[tuple[int, MetricRecord]]:
        pending = self._pending.get(key, {})
        taken: list[tuple[int, MetricRecord]] = []
        if complete_only:  # rank 0's values come first and in order: so do the iterations
            while pending:
                iteration = next(iter(pending))
                if pending[iteration][1] < self.processes:
                    break
                taken.append(_merged(key[1], iteration, pending.pop(iteration)))
        else:
            taken.extend(_merged(key[1], i, pending[i]) for i in sorted(pending))
            pending.clear()
        if not pending:
            self._pending.pop(key, None)
        return taken


def _merged(name: str, iteration: int, entry: list[Any]) -> tuple[int, MetricRecord]:
    epoch, count, weighted, weight, plain = entry
    value = weighted / weight if weight != 0 else plain / count
    return epoch, MetricRecord(name, iteration, value, weight)
