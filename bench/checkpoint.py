"""Checkpoint cost: how long the training loop stalls per checkpoint, per recorder,
beside `torch.save` of the same state, on a ~70 MB state (MLP 784-2048-2048-10 + Adam).

    python bench/checkpoint.py [--reps 3] [--out bench/results/checkpoint.md]

The stall is the time `FileCheckpointer.save` blocks the loop (a CPU snapshot; the
encoding, compression and writing run in a background thread); the write time is
until the files are on disk. Sizes are of the model file against its float32 bytes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn


def state() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        model(torch.randn(64, 784)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def measure(recorder, model, optimizer, directory: Path) -> tuple[float, float, int]:
    from ember.train.checkpoint import FileCheckpointer

    checkpointer = FileCheckpointer(directory, recorder)
    start = time.perf_counter()
    checkpointer.save(1, model, optimizer, {"epoch": 1})
    stall = time.perf_counter() - start
    checkpointer.wait()
    total = time.perf_counter() - start
    return stall, total, checkpointer.path("model", 1).stat().st_size


def torch_save(model, optimizer, directory: Path) -> tuple[float, int]:
    start = time.perf_counter()
    torch.save(model.state_dict(), directory / "model.pt")
    torch.save(optimizer.state_dict(), directory / "optim.pt")
    return time.perf_counter() - start, (directory / "model.pt").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default="bench/results/checkpoint.md")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from ember.record import (
        BinFileRecorder,
        BinGzFileRecorder,
        CompactRecorder,
        DefaultRecorder,
        NamedMpkGzFileRecorder,
        PrettyJsonFileRecorder,
        SafetensorsFileRecorder,
        SensitiveCompactRecorder,
    )

    model, optimizer = state()
    f32 = sum(p.numel() * 4 for p in model.parameters())
    total_state = f32 * 3  # weights + Adam's two moments
    recorders = {
        "DefaultRecorder (mpk, full)": DefaultRecorder(),
        "CompactRecorder (mpk.gz, half)": CompactRecorder(),
        "SensitiveCompactRecorder (bin.gz, half)": SensitiveCompactRecorder(),
        "NamedMpkGzFileRecorder (bf16)": NamedMpkGzFileRecorder("bf16"),
        "BinFileRecorder (full)": BinFileRecorder(),
        "BinGzFileRecorder (full)": BinGzFileRecorder(),
        "SafetensorsFileRecorder (full)": SafetensorsFileRecorder(),
        "PrettyJsonFileRecorder (full)": PrettyJsonFileRecorder(),
    }
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        saves = []
        for _rep in range(args.reps):
            seconds, torch_size = torch_save(model, optimizer, Path(scratch))
            saves.append(seconds)
        torch_median = statistics.median(saves)
        rows.append(("torch.save (pickle, f32)", torch_median, torch_median, torch_size))
        for name, recorder in recorders.items():
            results = [
                measure(recorder, model, optimizer, Path(scratch) / f"{name[:8]}-{rep}")
                for rep in range(args.reps)
            ]
            stall = statistics.median(r[0] for r in results)
            total = statistics.median(r[1] for r in results)
            rows.append((name, stall, total, results[0][2]))
    lines = [
        "# Checkpoint cost",
        "",
        f"State: MLP 784-2048-2048-10 + Adam, {total_state / 1e6:.1f} MB in float32 "
        f"(weights {f32 / 1e6:.1f} MB). Medians of {args.reps} runs, torch.set_num_threads(1).",
        f"Command: `python bench/checkpoint.py --reps {args.reps}`",
        "",
        "| how | loop stall s | write s | stall / torch.save | model file / f32 weights |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, stall, total, size in rows:
        lines.append(
            f"| {name} | {stall:.3f} | {total:.3f} | {stall / torch_median:.2f} | {size / f32:.3f} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
