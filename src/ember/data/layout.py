"""How each optimizer step's samples are dealt to micro-batches and processes.

A run's `Layout` is fixed when it starts: every optimizer step takes the next
`global_batch` samples of the epoch's order, in `blocks` blocks of `columns * micro`
samples each; the `i`-th sample of column `s` in block `j` is sample
`j * columns * micro + i * columns + s` of the step. Shard `v = j * columns + s` is
one micro-batch. On `world` processes, process `r` runs the shards `v` with
`v % world == r`, in order, as its accumulated micro-batches.

A run started on `W` processes with `grads_accumulation(a)` and a per-process batch of
`m` has the layout `(m, W, a)`: process `r` runs the shards of column `r`, which is how
torch's `DistributedSampler` deals too. Resumed on another number of processes, the
same shards make the same steps; when the shards cannot be divided among them, each
column is split (`for_processes`), which keeps every step's samples but not which
micro-batch each sample is in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Layout:
    micro: int
    """Samples of a full micro-batch."""
    columns: int
    """Shards per block (the processes of the run's first launch)."""
    blocks: int = 1
    """Blocks per step (the accumulation of the run's first launch)."""
    own_streams: bool = False
    """Every shard's forward draws from a random stream of its own (`global_batch(n)`);
    otherwise each column's shards share one, as on the process that ran the column."""

    @property
    def global_batch(self) -> int:
        """Samples of a full optimizer step, over every process."""
        return self.micro * self.columns * self.blocks

    @property
    def shards(self) -> int:
        """Micro-batches of a full optimizer step, over every process."""
        return self.columns * self.blocks

    def state(self) -> dict[str, int]:
        return {
            "micro": self.micro,
            "columns": self.columns,
            "blocks": self.blocks,
            "own_streams": int(self.own_streams),
        }

    @classmethod
    def from_state(cls, state: Any) -> Layout | None:
        """The layout a checkpoint noted (None when it noted none, or not one of these)."""
        if not isinstance(state, dict):
            return None
        values = [state.get(key) for key in ("micro", "columns", "blocks")]
        counts = [value for value in values if type(value) is int and value > 0]
        if len(counts) != 3:
            return None
        micro, columns, blocks = counts
        return cls(micro, columns, blocks, own_streams=state.get("own_streams") == 1)

    @classmethod
    def for_global_batch(cls, samples: int, world: int, largest: int) -> Layout | None:
        """`samples` per step in one block of micro-batches of at most `largest` samples,
        as few as `world` processes can share, each with a random stream of its own: the
        same layout on every number of processes that divides them (None when `world`
        does not divide `samples`)."""
        if samples % world:
            return None
        for shards in range(world, samples + 1, world):
            if samples % shards == 0 and samples // shards <= largest:
                return cls(samples // shards, shards, 1, own_streams=True)
        return None  # unreachable: shards == samples divides it

    def for_processes(self, world: int, largest: int | None = None) -> Layout | None:
        """The layout the same steps take on `world` processes with micro-batches of at
        most `largest` samples (None: any): this one when its shards divide among them,
        else this one with each column dealt in turn to `t` columns (the smallest `t`
        that makes them divide and fit); None when no split of the micro-batches does."""
        for parts in range(1, self.micro + 1):
            if self.micro % parts or (self.shards * parts) % world:
                continue
            if largest is None or self.micro // parts <= largest:
                micro, columns = self.micro // parts, self.columns * parts
                return Layout(micro, columns, self.blocks, self.own_streams)
        return None

    @property
    def streams(self) -> int:
        """Random streams the forwards of a step draw from: one per shard, or per column."""
        return self.shards if self.own_streams else self.columns

    def stream(self, shard: int) -> int:
        """The random stream the forward of `shard` draws from."""
        return shard if self.own_streams else shard % self.columns

    def streams_kept(self, world: int) -> bool:
        """Every stream's shards run on one process (each stream goes on as in the run's
        first launch)."""
        return self.own_streams or self.columns % world == 0

    def own(self, rank: int, world: int) -> list[int]:
        """The shards process `rank` runs, in order."""
        return list(range(rank, self.shards, world))

    def _bases(self, rank: int, world: int) -> np.ndarray:
        """Where each of the process's shards starts within a step."""
        own = np.arange(rank, self.shards, world, dtype=np.int64)
        return (own // self.columns) * (self.micro * self.columns) + own % self.columns

    def tail_sizes(self, rank: int, world: int, tail: int) -> list[int]:
        """Samples of each of the process's micro-batches in a last step of `tail`
        (< global_batch) samples, empty ones left out (they are the last ones)."""
        sizes = []
        for base in self._bases(rank, world).tolist():
            size = min(self.micro, max(0, -(-(tail - base) // self.columns)))
            if size == 0:
                break
            sizes.append(size)
        return sizes

    def positions(self, rank: int, world: int, samples: int) -> tuple[np.ndarray, list[int]]:
        """The positions (among `samples`, from a step's start) of the samples process
        `rank` reads, micro-batch after micro-batch, and the size of each one."""
        step = self.global_batch
        full, tail = divmod(samples, step)
        bases = self._bases(rank, world)
        inner = np.arange(self.micro, dtype=np.int64) * self.columns
        grid = bases[:, None] + inner[None, :]  # (shards of the process, micro)
        whole = (np.arange(full, dtype=np.int64) * step)[:, None, None] + grid[None]
        sizes = [self.micro] * (full * len(bases))
        if not tail:
            return whole.reshape(-1), sizes
        last = full * step + grid
        kept = grid < tail
        tail_sizes = [int(n) for n in kept.sum(axis=1).tolist() if n]
        return np.concatenate([whole.reshape(-1), last[kept]]), sizes + tail_sizes
