"""Global steps for loggers that plot one series per metric across epochs."""

from __future__ import annotations


class GlobalSteps:
    """Counts iterations per split across epochs.

    The global step of an iteration is the number of iterations this counter has seen in
    that split so far, across epochs, counting this one: epoch 1 of 5 iterations gives
    steps 1..5 and epoch 2 continues at 6. Iteration numbers restart at 1 each epoch, so
    an epoch's length is the highest iteration number seen in it.
    """

    def __init__(self) -> None:
        self._epoch: dict[str, int | None] = {}
        self._before: dict[str, int] = {}
        self._highest: dict[str, int] = {}

    def step(self, split: str, epoch: int, iteration: int) -> int:
        """The global step of `iteration` of `epoch` in `split`."""
        if split not in self._epoch:
            self._epoch[split], self._before[split], self._highest[split] = epoch, 0, 0
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

    def _roll(self, split: str) -> None:
        self._before[split] += self._highest[split]
        self._highest[split] = 0
