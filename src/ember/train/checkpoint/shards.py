"""Reading a checkpoint written in shards (FSDP's `sharded_checkpoints=True`) on any
number of processes.

Each process that wrote the checkpoint wrote its shards of the model and optimizer
states into files of its own (`model-3.rank-1.mpk`), and rank 0 an index in place of
the parts (`model-3.mpk`): which files there are and, for every value split between
them, its whole shape and the rows (first dimension) each file holds. A process reads
only the files that hold rows it needs, one at a time, and cuts out those rows: a
sharded process its own rows, one process or DDP every row. Values not split (buffers,
step counts) are read from the first file. Nothing is unpickled: every file is an
ember record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ember.errors import TrainingError

SHARDED = "ember.sharded_checkpoint"
"""The key of the index that stands for the model and optimizer parts of a checkpoint
written in shards."""

Path = tuple[Any, ...]
"""Where a value is in a part's tree: its keys, outermost first."""
Rows = tuple[int, int]
Wanted = Callable[[Path, tuple[int, ...]], "Rows | None"]
"""The rows a process needs of the value at a path with a whole shape (None: all)."""


@dataclass
class _Piece:
    path: Path
    shape: tuple[int, ...]
    rows: list[Rows]  # the rows each file holds
    start: int = 0
    stop: int = 0
    out: torch.Tensor | None = None


def index_record(processes: int, files: list[int], parts: dict[str, list[Any]]) -> dict[str, Any]:
    """The index rank 0 writes for a checkpoint in shards: the processes that ran,
    the ranks whose files hold the shards (in order), and per part the split values
    as `[path, whole shape, rows of each file]`."""
    return {SHARDED: {"processes": processes, "files": files, **parts}}


class ShardIndex:
    """The index of one part (`model` or `optim`) of a checkpoint written in shards."""

    def __init__(self, checkpointer: Any, epoch: int, part: str) -> None:
        self.checkpointer, self.epoch, self.part = checkpointer, epoch, part
        record = checkpointer.load(epoch, part, None)
        index = record.get(SHARDED) if isinstance(record, dict) else None
        if not isinstance(index, dict) or part not in index or "files" not in index:
            raise TrainingError(
                f"The {part} part of the checkpoint of epoch {epoch} is not the index of a "
                "checkpoint in shards that this version of ember reads (it lists no files "
                "and rows). Resume it on as many processes with the version that wrote it, "
                "or from another checkpoint."
            )
        self.processes = int(index["processes"])
        self.files = [int(rank) for rank in index["files"]]
        self.pieces = [
            _Piece(tuple(path), tuple(int(n) for n in shape), [(int(a), int(b)) for a, b in rows])
            for path, shape, rows in index[part]
        ]
        for piece in self.pieces:
            self._check(piece)

    def _check(self, piece: _Piece) -> None:
        """The files' rows of a value follow one another and cover it."""
        end = 0
        for start, stop in piece.rows:
            if start != end or stop < start:
                break
            end = stop
        else:
            if len(piece.rows) == len(self.files) and end == piece.shape[0]:
                return
        raise TrainingError(
            f"The index of the checkpoint of epoch {self.epoch} is damaged: the rows of "
            f"{'/'.join(map(str, piece.path))} in the {self.part} shards are {piece.rows}, "
            f"which do not cover its {piece.shape[0]} rows. Resume from another checkpoint."
        )

    def read(self, wanted: Wanted) -> Any:
        """The part's tree, each split value cut to the rows `wanted` gives it (all rows
        when None). The first file gives the tree and every value not split."""
        base = self._load(0)
        for piece in self.pieces:
            rows = wanted(piece.path, piece.shape)
            piece.start, piece.stop = rows if rows is not None else (0, piece.shape[0])
            piece.out = None
        for position in range(len(self.files)):
            needed = [p for p in self.pieces if _overlap(p.rows[position], p.start, p.stop)]
            if not needed:
                continue
            tree = base if position == 0 else self._load(position)
            for piece in needed:
                _copy_rows(piece, _at(tree, piece.path, self), piece.rows[position])
        for piece in self.pieces:
            out = piece.out
            if out is None:  # no rows wanted: an empty slice of the value's kind
                out = _at(base, piece.path, self)[:0].clone()
            _put(base, piece.path, out)
        return base

    def _load(self, position: int) -> Any:
        return self.checkpointer.load_shard(self.epoch, self.part, self.files[position])


def _overlap(rows: Rows, start: int, stop: int) -> bool:
    return max(rows[0], start) < min(rows[1], stop)


def _copy_rows(piece: _Piece, value: Any, rows: Rows) -> None:
    """Copy the rows of `value` (a file's slice: `rows` of the whole) that `piece` wants."""
    if not isinstance(value, torch.Tensor) or value.shape[0] != rows[1] - rows[0]:
        raise TrainingError(f"its shard of {'/'.join(map(str, piece.path))} is not {rows} rows")
    if piece.out is None:
        piece.out = value.new_empty((piece.stop - piece.start, *value.shape[1:]))
    low, high = max(rows[0], piece.start), min(rows[1], piece.stop)
    piece.out[low - piece.start : high - piece.start] = value[low - rows[0] : high - rows[0]]


def _at(tree: Any, path: Path, index: ShardIndex) -> Any:
    for key in path:
        node = tree.get(key) if isinstance(tree, dict) else None
        if node is None and isinstance(tree, dict):  # integer keys, as text in some records
            node = tree.get(str(key), tree.get(int(key)) if str(key).isdigit() else None)
        if node is None:
            raise TrainingError(
                f"the {index.part} shards of the checkpoint of epoch {index.epoch} have no "
                f"{'/'.join(map(str, path))}, which their index lists"
            )
        tree = node
    return tree


def _put(tree: Any, path: Path, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key] if key in tree else tree[str(key)]
    last = path[-1]
    tree[last if last in tree else str(last)] = value


def load_whole(checkpointer: Any, epoch: int, model: Any, optimizer: Any) -> None:
    """Load a checkpoint written in shards into a whole model (one process, DDP) and,
    if given, its optimizer: every value is joined from the files that hold its rows."""
    from ember.record.target import load_module

    index = ShardIndex(checkpointer, epoch, "model")
    load_module(model, index.read(lambda path, shape: None), checkpointer.path("model", epoch))
    if optimizer is None:
        return
    state = ShardIndex(checkpointer, epoch, "optim").read(lambda path, shape: None)
    try:
        optimizer.load_state_dict(state)
    except Exception as error:
        raise TrainingError(
            f"The optimizer state of the checkpoint of epoch {epoch} (in shards) does not fit "
            f"this run's {type(optimizer).__name__}: {type(error).__name__}: {error}"
        ) from error
