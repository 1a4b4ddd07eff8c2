"""Reading W&B's offline run files back with wandb's own record type.

An offline run writes `wandb/offline-run-<time>-<id>/run-<id>.wandb`: a header
(`:W&B`, a magic number, a version) and then W&B's records, each a
`wandb.proto.wandb_internal_pb2.Record`, framed in 32 KiB blocks the way LevelDB's
log is (a 7-byte header per chunk: CRC-32 of the chunk type and data, length, type).
wandb 0.31 reads these files in its Go core only, so the framing is undone here and
every record is parsed by wandb's protobuf class.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

HEADER = b":W&B"
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    data = Path(path).read_bytes()
    assert data[:4] == HEADER, f"{path} is not a W&B run file"
    out, pending, offset = [], b"", 7
    while offset + 7 <= len(data):
        room = BLOCK - offset % BLOCK
        if room < 7:
            offset += room
            continue
        checksum, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        if kind == 0 and length == 0:  # zero padding up to the block end
            offset += room
            continue
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum
        offset += 7 + length
        if kind == FULL:
            out.append(wandb_internal_pb2.Record.FromString(chunk))
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(wandb_internal_pb2.Record.FromString(pending + chunk))
    return out


@dataclass
class OfflineRun:
    """What the offline sessions of one W&B run hold, in the order they were written."""

    run_ids: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    def series(self, key: str, step: str) -> list[tuple[int, float]]:
        return [(row[step], row[key]) for row in self.history if key in row]


def read_offline_runs(wandb_dir: Path) -> OfflineRun:
    """Every `offline-run-*` folder under `wandb_dir`, oldest first, read as one run."""
    run = OfflineRun()
    folders = sorted(Path(wandb_dir).glob("offline-run-*"))
    assert folders, f"no offline run under {wandb_dir}"
    for folder in folders:
        for record in records(next(folder.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.run_ids.append(record.run.run_id)
                for item in record.run.config.update:
                    run.config[item.key] = json.loads(item.value_json)
            elif kind == "config":
                for item in record.config.update:
                    run.config[item.key] = json.loads(item.value_json)
            elif kind == "history":
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                run.history.append(row)
            elif kind == "summary":
                for item in record.summary.update:
                    run.summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return run
