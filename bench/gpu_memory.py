"""Where a step's peak CUDA memory goes, by the Python line that allocated it.

`peak_by_frame(snapshot)` replays the allocation trace of a
`torch.cuda.memory._snapshot()` (recorded with
`torch.cuda.memory._record_memory_history(stacks="python")`), finds the moment the
most bytes were allocated, and sums the blocks live at that moment by the frame that
allocated each one: the innermost Python frame outside torch (ember's frames count,
so that ember's own allocations show as such). `diff_table(raw, ember)` puts two such
summaries side by side, largest difference first: `bench/gpu.py --snapshot DIR` writes
one per variant and workload and prints the table, so one GPU run answers "where do
the extra bytes come from". Reading a snapshot never loads a pickle: the child process
that recorded the history summarises its own snapshot and writes JSON.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

UNKNOWN = "(allocated before the trace began)"


def frame_of(frames: Iterable[Mapping[str, Any]]) -> str:
    """`file:line (function)` of the innermost Python frame outside torch."""
    python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    for frame in python:
        path = str(frame.get("filename", "")).replace("\\", "/")
        if "/torch/" not in path and not path.endswith(("/contextlib.py", "/functools.py")):
            return f"{path}:{frame.get('line')} ({frame.get('name')})"
    if python:
        frame = python[0]
        return f"{frame.get('filename')}:{frame.get('line')} ({frame.get('name')})"
    return "(no Python frame)"


def peak_by_frame(snapshot: Mapping[str, Any], device: int = 0) -> dict[str, Any]:
    """The peak of the trace and the bytes live at it by allocating frame:
    `{"peak_bytes": int, "by_frame": {frame: bytes}}`. Blocks live when the trace began
    (the ring buffer's start) are counted once, under `UNKNOWN`, from the snapshot's
    segments minus what the trace allocated and did not free."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    live: dict[int, tuple[int, str]] = {}
    freed_unknown = 0
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for event in events:
        action, address, size = event.get("action"), event.get("addr"), int(event.get("size", 0))
        if action == "alloc":
            live[address] = (size, frame_of(event.get("frames") or ()))
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action == "free_completed":
            if address in live:
                total -= live.pop(address)[0]
            else:  # allocated before the trace began
                freed_unknown += size
                total -= size
    allocated_now = sum(
        int(block.get("size", 0))
        for segment in snapshot.get("segments", ())
        if segment.get("device", device) == device
        for block in segment.get("blocks", ())
        if block.get("state") == "active_allocated"
    )
    before = max(0, allocated_now - sum(size for size, _ in live.values()) + freed_unknown)
    by_frame: dict[str, int] = {}
    for size, frame in at_peak.values():
        by_frame[frame] = by_frame.get(frame, 0) + size
    if before:
        by_frame[UNKNOWN] = by_frame.get(UNKNOWN, 0) + before
    return {"peak_bytes": peak + before, "by_frame": by_frame}


def diff_table(raw: Mapping[str, Any], ember: Mapping[str, Any], rows: int = 12) -> str:
    """A markdown table of the live bytes at each one's peak, by frame, ember minus raw,
    largest difference first."""
    frames = set(raw["by_frame"]) | set(ember["by_frame"])
    lines = [
        f"peak: raw {_mib(raw['peak_bytes'])}, ember {_mib(ember['peak_bytes'])} "
        f"({_mib(ember['peak_bytes'] - raw['peak_bytes'])} more)",
        "",
        "| allocated at | raw | ember | ember - raw |",
        "|---|---:|---:|---:|",
    ]
    ordered = sorted(
        frames,
        key=lambda f: -abs(ember["by_frame"].get(f, 0) - raw["by_frame"].get(f, 0)),
    )
    for frame in ordered[:rows]:
        a, b = raw["by_frame"].get(frame, 0), ember["by_frame"].get(frame, 0)
        lines.append(f"| `{frame}` | {_mib(a)} | {_mib(b)} | {_mib(b - a)} |")
    return "\n".join(lines)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"
