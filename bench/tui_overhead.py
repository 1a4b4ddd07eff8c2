"""How much the terminal dashboard slows training, compared with the plain renderer.

    python bench/tui_overhead.py [--runs 7] [--steps 3000] [--terminal]

Trains the same 784-128-10 MLP on synthetic data, alternating plain and dashboard
runs, and prints the median wall time of each and their ratio. By default the
dashboard draws into a console forced to terminal mode that writes to /dev/null (all
the drawing and terminal encoding happens, no terminal emulator is involved); with
`--terminal` it draws on this process's real terminal (run it in one).

Wall times on a shared machine are noisy, so it also prints what the dashboard costs
directly: the training thread's time in renderer calls and the drawing thread's CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.optim import AdamConfig
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer, TuiRenderer


@dataclass
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.net(inputs)

    def step(self, batch: Batch) -> ClassificationOutput:
        output = self(batch.inputs)
        return ClassificationOutput(F.cross_entropy(output, batch.targets), output, batch.targets)

    def train_step(self, batch: Batch) -> TrainOutput:
        return TrainOutput(self.step(batch))

    def valid_step(self, batch: Batch) -> ClassificationOutput:
        return self.step(batch)


class Timed:
    """A renderer wrapper that adds up the time the training thread spends in it: in
    `update` and `end_split` (while training) and in `start` and `end` (once a run)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = {"start": 0.0, "update": 0.0, "end_split": 0.0, "end": 0.0}

    def _call(self, name: str, *args: Any) -> None:
        start = time.perf_counter()
        getattr(self.inner, name)(*args)
        self.seconds[name] += time.perf_counter() - start

    @property
    def ticks(self) -> float:
        return self.seconds["update"] + self.seconds["end_split"]

    @property
    def once(self) -> float:
        return self.seconds["start"] + self.seconds["end"]

    def start(self, info: Any) -> None:
        self._call("start", info)

    def update(self, progress: Any, metrics: Any, records: Any) -> None:
        self._call("update", progress, metrics, records)

    def end_split(self, progress: Any, metrics: Any) -> None:
        self._call("end_split", progress, metrics)

    def end(self, reason: str) -> None:
        self._call("end", reason)


def batches(count: int, size: int, seed: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 784, generator=torch.Generator().manual_seed(0))
    out = []
    for _ in range(count):
        targets = torch.randint(0, 10, (size,), generator=generator)
        inputs = centres[targets] + 2 * torch.randn(size, 784, generator=generator)
        out.append(Batch(inputs, targets))
    return out


def fit(renderer: Any, train: list[Batch], valid: list[Batch], epochs: int) -> tuple[float, float]:
    """Wall and process CPU seconds of one `fit`."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        learner = (
            LearnerBuilder(directory)
            .metric_train_numeric(AccuracyMetric())
            .metric_train_numeric(LossMetric())
            .metric_valid_numeric(AccuracyMetric())
            .metric_valid_numeric(LossMetric())
            .num_epochs(epochs)
            .renderer(renderer)
            .with_application_logger(False)
            .build(Mlp(), AdamConfig().init(), 1e-3)
        )
        start, cpu = time.perf_counter(), time.process_time()
        learner.fit(train, valid)
        return time.perf_counter() - start, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7, help="runs of each renderer (alternated)")
    parser.add_argument("--steps", type=int, default=3000, help="training steps per run")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--terminal", action="store_true", help="draw on the real terminal")
    parser.add_argument("--report", help="also write the report to this file")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: steadier timings)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    per_epoch = max(1, args.steps // args.epochs)
    train = batches(per_epoch, args.batch_size, seed=1)
    valid = batches(max(1, per_epoch // 10), args.batch_size, seed=2)
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the benchmark

    def make(name: str) -> Timed:
        if name == "plain":
            return Timed(PlainRenderer(stream=sink))
        if args.terminal:
            return Timed(TuiRenderer(keys=False))
        from rich.console import Console

        console = Console(file=sink, force_terminal=True, width=120, height=40)
        return Timed(TuiRenderer(console=console, keys=False))

    fit(make("plain"), train, valid, 1)  # warm up: allocator, kernels, imports
    wall: dict[str, list[float]] = {"plain": [], "tui": []}
    cpu: dict[str, list[float]] = {"plain": [], "tui": []}
    calls: dict[str, list[float]] = {"plain": [], "tui": []}
    once: dict[str, list[float]] = {"plain": [], "tui": []}
    frames, drawing = [], []
    for index in range(args.runs):
        for name in ("plain", "tui") if index % 2 == 0 else ("tui", "plain"):
            renderer = make(name)
            seconds, cpu_seconds = fit(renderer, train, valid, args.epochs)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
            calls[name].append(renderer.ticks / seconds)
            once[name].append(renderer.once)
            if name == "tui":
                frames.append(renderer.inner.frames / seconds)
                drawing.append(renderer.inner.draw_seconds / seconds)

    def summary(name: str) -> str:
        runs = ", ".join(f"{t:.3f}" for t in wall[name])
        return (
            f"{name:<6} median {statistics.median(wall[name]):.3f} s, best {min(wall[name]):.3f} s"
            f", CPU median {statistics.median(cpu[name]):.3f} s  (runs: {runs})"
        )

    median = statistics.median(wall["tui"]) / statistics.median(wall["plain"])
    pairs = statistics.median(t / p for t, p in zip(wall["tui"], wall["plain"]))
    best = min(wall["tui"]) / min(wall["plain"])
    direct = (  # while training, per second of training
        statistics.median(calls["tui"])
        - statistics.median(calls["plain"])
        + statistics.median(drawing)
    )
    steps = f"{per_epoch * args.epochs} train + {len(valid) * args.epochs} valid steps per run"
    report = (
        f"{steps}, {args.runs} runs each, torch threads {torch.get_num_threads()}, "
        f"{os.cpu_count()} CPUs\n"
        f"{summary('plain')}\n{summary('tui')}\n"
        f"dashboard: {statistics.median(frames):.1f} frames/s; drawing thread "
        f"{100 * statistics.median(drawing):.2f} % of one CPU; training thread in update and "
        f"end_split {100 * statistics.median(calls['tui']):.3f} % (plain "
        f"{100 * statistics.median(calls['plain']):.3f} %), in start and end "
        f"{1000 * statistics.median(once['tui']):.1f} ms a run (plain "
        f"{1000 * statistics.median(once['plain']):.1f} ms)\n"
        f"ratio tui/plain: median {median:.4f} (per pair {pairs:.4f}, best {best:.4f}); "
        f"direct cost while training {1 + direct:.4f}"
    )
    print(report)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as handle:
            handle.write(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
