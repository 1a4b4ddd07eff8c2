"""bench/gpu_memory.py, on a synthetic allocation trace shaped like
`torch.cuda.memory._snapshot()`: the peak, the blocks live at it by the Python line
that allocated them, and the table of two runs side by side."""

from __future__ import annotations

from pathlib import Path

from ember_testing import load_example

memory = load_example(Path(__file__).parents[1] / "bench" / "gpu_memory.py", "gpu_memory")

TORCH = {"filename": "/venv/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "f"}


def at(filename, line, name):
    return [
        {"filename": "??", "line": 0, "name": "c10::alloc"},
        TORCH,
        {"filename": filename, "line": line, "name": name},
    ]


def snapshot(events, live_blocks):
    return {
        "device_traces": [events],
        "segments": [
            {
                "device": 0,
                "blocks": [{"size": size, "state": "active_allocated"} for size in live_blocks],
            }
        ],
    }


def test_the_peak_and_what_is_live_at_it_by_frame():
    model = at("/home/me/model.py", 12, "forward")
    step = at("/venv/site-packages/ember/train/fit/stepper.py", 170, "step")
    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": model},
        {"action": "alloc", "addr": 2, "size": 50, "frames": step},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 3, "size": 400, "frames": model},  # the peak: 450 + 1000
        {"action": "free_completed", "addr": 3, "size": 400},
        {"action": "free_completed", "addr": 9, "size": 10},  # from before the trace
    ]
    # now live: block 2 (50) and 990 bytes allocated before the trace began
    summary = memory.peak_by_frame(snapshot(events, [50, 990]))
    assert summary["by_frame"] == {
        "/home/me/model.py:12 (forward)": 400,
        "/venv/site-packages/ember/train/fit/stepper.py:170 (step)": 50,
        memory.UNKNOWN: 1000,
    }
    assert summary["peak_bytes"] == 1450


def test_the_table_lists_the_largest_difference_first():
    raw = {"peak_bytes": 2**30, "by_frame": {"a.py:1 (f)": 2**30}}
    ember = {"peak_bytes": 2**30 + 2**27, "by_frame": {"a.py:1 (f)": 2**30, "b.py:2 (g)": 2**27}}
    table = memory.diff_table(raw, ember)
    assert "peak: raw 1,024.0 MiB, ember 1,152.0 MiB (128.0 MiB more)" in table
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows[0] == "| `b.py:2 (g)` | 0.0 MiB | 128.0 MiB | 128.0 MiB |"
