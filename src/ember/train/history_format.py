"""The lines of `history.jsonl` and what a damaged one says.

`history.jsonl` (format "ember-history", version 3) is JSON Lines: a header, then
one record per change, each appended, flushed and fsynced as it happens, so an
epoch end costs one short line however long the run. Every line is sealed
(`ember.train.sealed`): it ends with the CRC-32 of its own bytes, and each record
carries its line number `n`, so a damaged line and a lost one are told apart from a
line never written:

```
{"format": "ember-history", "version": 3, "id": "5f0c...", "crc32": "..."}
{"model": "Model", "num_parameters": 7850, "n": 2, "crc32": "..."}
{"epoch": 1, "train": {"Loss": 0.3101...}, "valid": {"Loss": 0.22...}, "n": 3, "crc32": "..."}
{"checkpoints": {"add": [1], "remove": []}, "n": 4, "crc32": "..."}
{"epoch": 2, "train": {...}, "valid": {...}, "n": 5, "crc32": "..."}
{"checkpoints": {"add": [2], "remove": [1]}, "n": 6, "crc32": "..."}
{"point": {"epoch": 3, "iteration": 40, "valid": {"Loss": 0.21...}}, "n": 7, "crc32": "..."}
{"outcome": "completed", "stop_reason": {"reason": "completed"}, "n": 8, "crc32": "..."}
```

Reading replays the records in order: an epoch record adds the epoch (replacing
one of the same number), `keep_before` forgets the epochs from that one on (a run
resumed before them redoes them) and clears the outcome, `checkpoints` adds and
removes epochs with a complete checkpoint after retention, `point` adds a validation
inside an epoch (`valid_every`: the epoch, the training batches done in it, the
values), `keep_before` also forgets the points after `iteration` batches of its
epoch, and `outcome` comes with `stop_reason` (`Outcome.to_json()`, or null). A line cut
short by a kill (the last one, without its newline) is ignored; any other line that
is not what was written (its checksum differs, it is not JSON, a line number is
skipped) is damage: `load` refuses the file naming the line and the fix, and
`salvage` (what `ember repair` uses) keeps every intact record. A process that
starts writing a history (a new run, or one resumed) first rewrites the whole file
atomically (a new header `id`, and one record per fact), then appends; a checkpoint
notes the `id` and the lines the file had, so a resume tells lines lost from its end.

Values are the learner's epoch values at full precision (floats written as their
shortest round-tripping text); NaN and infinities are the strings "nan", "inf" and
"-inf". Files of version 2 (the same records without `n` and checksums) are read as
they are; the `history.json` of runs made by earlier versions (format version 1, one
JSON object rewritten at every epoch) is still read by `RunHistory.load`; `to_json`
gives that object's layout.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

from ember.errors import RunRecordError
from ember.train.sealed import seal


def repair_hint(directory: str | os.PathLike[str]) -> str:
    """The fix for a damaged or missing run record of the run in `directory`."""
    return (
        f"Run `ember repair {directory}`: it keeps every intact record, rebuilds the rest from "
        "the metric logs and the checkpoints, and keeps the damaged file beside them as "
        "<name>.damaged; or train again with LearnerBuilder(dir, overwrite=True)."
    )


def damaged(file: Path, problem: str, line: int | None = None) -> RunRecordError:
    """The error of a damaged or missing run record: the file (and line), the problem
    and the fix; the error's `problem` holds the problem alone."""
    where = f"{file}, line {line}" if line is not None else str(file)
    error = RunRecordError(f"{where}: {problem}. {repair_hint(file.parent)}")
    error.problem = f"line {line}: {problem}" if line is not None else problem
    error.path = file
    return error


def lost(first: int, last: int) -> str:
    if first == last:
        return f"the line before it is missing (record {first} was lost)"
    return f"{last - first + 1} lines before it are missing (records {first} to {last} were lost)"


def sealed_line(record: Mapping[str, Any], number: int) -> bytes:
    """One sealed line (without its newline): the record and its line number."""
    return seal({**record, "n": number})


def epoch_record(
    epoch: int,
    values: Mapping[str, Mapping[str, float]],
    counters: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    record = {"epoch": epoch, **{split: encode(v) for split, v in values.items()}}
    if counters is not None:
        record["counters"] = dict(counters)
    return record


def point_record(
    epoch: int,
    iteration: int,
    values: Mapping[str, Mapping[str, float]],
    counters: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    record = {"epoch": epoch, "iteration": iteration, **{s: encode(v) for s, v in values.items()}}
    if counters is not None:
        record["counters"] = dict(counters)
    return record


def decode_splits(entry: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    return {
        split: {str(k): decode(v) for k, v in split_values.items()}
        for split, split_values in entry.items()
        if split not in ("epoch", "counters")
    }


_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode(values: Mapping[str, float]) -> dict[str, float | str]:
    return {name: value if math.isfinite(value) else repr(value) for name, value in values.items()}


def decode(value: Any) -> float:
    if isinstance(value, str):
        if value not in _NON_FINITE:
            raise ValueError(f"not a number: {value!r}")
        return _NON_FINITE[value]
    return float(value)
