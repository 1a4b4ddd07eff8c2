"""How much the terminal dashboard slows training, compared with the plain renderer.

    python bench/tui_overhead.py [--runs 5] [--steps 3000] [--terminal]

Trains the same 784-128-10 MLP on synthetic data, alternating plain and dashboard
runs, and prints the median wall time of each and their ratio. By default the
dashboard draws into a console forced to terminal mode that writes to /dev/null (all
the drawing and terminal encoding happens, no terminal emulator is involved); with
`--terminal` it draws on this process's real terminal (run it in one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

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


def batches(count: int, size: int, seed: int) -> list[Batch]:
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 784, generator=torch.Generator().manual_seed(0))
    out = []
    for _ in range(count):
        targets = torch.randint(0, 10, (size,), generator=generator)
        inputs = centres[targets] + 2 * torch.randn(size, 784, generator=generator)
        out.append(Batch(inputs, targets))
    return out


def run(renderer: object, train: list[Batch], valid: list[Batch], epochs: int) -> tuple[float, float]:
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs of each renderer (alternated)")
    parser.add_argument("--steps", type=int, default=3000, help="training steps per run")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--terminal", action="store_true", help="draw on the real terminal")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: steady timings on a shared machine)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    per_epoch = max(1, args.steps // args.epochs)
    train = batches(per_epoch, args.batch_size, seed=1)
    valid = batches(max(1, per_epoch // 10), args.batch_size, seed=2)
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the benchmark

    def tui() -> TuiRenderer:
        if args.terminal:
            return TuiRenderer(keys=False)
        from rich.console import Console

        console = Console(file=sink, force_terminal=True, width=120, height=40, color_system="truecolor")
        return TuiRenderer(console=console, keys=False)

    run(PlainRenderer(stream=sink), train, valid, 1)  # warm up: allocator, kernels, imports
    times: dict[str, list[float]] = {"plain": [], "tui": []}
    cpu: dict[str, list[float]] = {"plain": [], "tui": []}
    frames, draw = [], []
    for index in range(args.runs):
        order = ("plain", "tui") if index % 2 == 0 else ("tui", "plain")
        for name in order:
            renderer = PlainRenderer(stream=sink) if name == "plain" else tui()
            seconds, cpu_seconds = run(renderer, train, valid, args.epochs)
            times[name].append(seconds)
            cpu[name].append(cpu_seconds)
            if isinstance(renderer, TuiRenderer):
                frames.append(renderer.frames / seconds)
                draw.append(renderer.draw_seconds / seconds)

    def line(name: str) -> str:
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        return (
            f"{name:<6} median {statistics.median(times[name]):.3f} s, best {min(times[name]):.3f} s,"
            f" CPU median {statistics.median(cpu[name]):.3f} s  (runs: {runs})"
        )

    plain, dashboard = statistics.median(times["plain"]), statistics.median(times["tui"])
    report = "\n".join([
        f"{per_epoch * args.epochs} train + {len(valid) * args.epochs} valid steps per run, "
        f"{args.runs} runs each, torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs",
        line("plain"),
        line("tui"),
        f"dashboard: {statistics.median(frames):.1f} frames/s, drawing thread "
        f"{100 * statistics.median(draw):.2f} % of one CPU",
        f"ratio tui/plain: median {dashboard / plain:.4f}, best {min(times['tui']) / min(times['plain']):.4f},"
        f" CPU {statistics.median(cpu['tui']) / statistics.median(cpu['plain']):.4f}",
    ])
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
