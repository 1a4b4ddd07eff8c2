"""Costs against the length of a run: ember beside a hand-written loop.

    python bench/growth.py [--epochs 1000] [--steps 100000] [--sizes 10000,100000,1000000]
                           [--plot-epochs 10000] [--only epochs,memory,loader,dashboard,plot]

Each part prints a Markdown table:

- epochs: a tiny model (4 batches an epoch) trained for `--epochs` epochs with a
  compact checkpoint per epoch, ember beside a raw loop that `torch.save`s its state
  every epoch: the mean time per epoch over epochs 11-100 and over the last 100, and
  the checkpoint folder's size after 10 epochs and after `--epochs` (retention keeps
  the last two and the best). The history file is listed apart: it is appended, one
  line per epoch, and never rewritten.
- memory: the resident memory (RSS) of a fresh process every 10% of a one-epoch run of
  `--steps` steps (Loss and Accuracy, per-iteration files), ember beside the raw loop.
- loader: time to the first batch and the memory the sampler allocates (tracemalloc
  peak) for datasets of `--sizes` items, ember's DataLoaderBuilder beside
  torch's DataLoader, shuffled and in order.
- dashboard: the terminal dashboard's frame (snapshot and drawing) and the notebook
  view's HTML after 100 and after 100,000 epochs (and 1,000,000 steps), and the
  memory of the tracked state.
- plot: `ember plot` on a run of `--plot-epochs` epochs (3 iterations each).

Every timing is CPU time of this process (`time.process_time`, all its threads),
which other processes on a busy machine disturb far less than wall time; repeated
timings keep the best. Ratios compare ember with itself or with the raw loop in the
same run.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ember.data import DataLoaderBuilder
from ember.optim import AdamConfig
from ember.record import CompactRecorder
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.events import EndEpoch
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.renderer import PlainRenderer

FEATURES, CLASSES = 16, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(FEATURES, CLASSES)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layer(inputs)

    def step(self, batch: Any) -> ClassificationOutput:
        inputs, targets = batch
        output = self(inputs)
        return ClassificationOutput(F.cross_entropy(output, targets), output, targets)

    def train_step(self, batch: Any) -> TrainOutput:
        return TrainOutput(self.step(batch))

    def valid_step(self, batch: Any) -> ClassificationOutput:
        return self.step(batch)


class Blobs(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.targets = torch.randint(0, CLASSES, (size,), generator=generator)
        self.inputs = torch.randn(size, FEATURES, generator=generator) + self.targets[:, None]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def quiet() -> PlainRenderer:
    return PlainRenderer(interval=3600.0, stream=io.StringIO())


def size_of(path: Path) -> int:
    """Bytes in a file, or in every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


# Epochs -------------------------------------------------------------------------------
class EpochClock:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.last = time.process_time()

    def on_event(self, event: Any) -> None:
        if isinstance(event, EndEpoch):
            now = time.process_time()
            self.times.append(now - self.last)
            self.last = now


def ember_epochs(directory: Path, epochs: int) -> tuple[list[float], int, int]:
    data = Blobs(32)
    loader = DataLoaderBuilder().batch_size(8).shuffle(1).build(data)
    clock = EpochClock()
    learner = (
        LearnerBuilder(directory, overwrite=True)
        .metric_train_numeric(LossMetric())
        .metric_train_numeric(AccuracyMetric())
        .num_epochs(epochs)
        .with_file_checkpointer(CompactRecorder())
        .renderer(quiet())
        .listener(clock)
        .build(Net(), AdamConfig().init(), 1e-3)
    )
    clock.last = time.process_time()
    learner.fit(loader)
    return clock.times, size_of(directory / "checkpoint"), size_of(directory / "history.jsonl")


def raw_epochs(directory: Path, epochs: int) -> tuple[list[float], int]:
    data = Blobs(32)
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    directory.mkdir(parents=True, exist_ok=True)
    times, last = [], time.process_time()
    for epoch in range(1, epochs + 1):
        for inputs, targets in loader:
            loss = F.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save(state, directory / f"checkpoint-{epoch}.pt")
        (directory / f"checkpoint-{epoch - 2}.pt").unlink(missing_ok=True)
        now = time.process_time()
        times.append(now - last)
        last = now
    return times, size_of(directory)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def part_epochs(epochs: int, root: Path) -> None:
    print(f"\n## Cost per epoch and checkpoint size, {epochs} epochs\n")
    _, small_ckpt, small_history = ember_epochs(root / "ember10", 10)
    times, ckpt, history = ember_epochs(root / "ember", epochs)
    _, raw_small = raw_epochs(root / "raw10", 10)
    raw_times, raw_size = raw_epochs(root / "raw", epochs)
    early, late = slice(10, 100), slice(max(100, epochs - 100), epochs)
    print("| variant | ms/epoch, epochs 11-100 | ms/epoch, last 100 | late / early |")
    print("|---|---:|---:|---:|")
    for name, series in (("ember", times), ("raw loop", raw_times)):
        a, b = mean(series[early]) * 1000, mean(series[late]) * 1000
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
    print(f"\n| file | after 10 epochs | after {epochs} | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| ember checkpoint/ | {small_ckpt:,} B | {ckpt:,} B | {ckpt / small_ckpt:.3f} |")
    print(f"| raw checkpoints | {raw_small:,} B | {raw_size:,} B | {raw_size / raw_small:.3f} |")
    print(
        f"| ember history.jsonl (appended, one line an epoch) | {small_history:,} B | "
        f"{history:,} B | {history / small_history:.1f} |"
    )


# Memory against steps -----------------------------------------------------------------
def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Steps(torch.utils.data.Dataset):
    """`size` samples that are all one input (no data memory grows)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.inputs = torch.randn(FEATURES)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs, torch.tensor(index % CLASSES)


def memory_child(variant: str, steps: int) -> None:
    torch.set_num_threads(1)
    marks = [max(1, steps * k // 10) for k in range(1, 11)]
    samples: list[tuple[int, int]] = []
    model = Net()
    seen = 0

    def note() -> None:
        nonlocal seen
        seen += 1
        if seen in marks:
            samples.append((seen, rss()))

    data = Steps(steps)
    if variant == "raw":
        loader = torch.utils.data.DataLoader(data, batch_size=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        correct = torch.zeros(())
        total = torch.zeros((), dtype=torch.float64)
        for inputs, targets in loader:
            output = model(inputs)
            loss = F.cross_entropy(output, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (output.argmax(-1) == targets).sum()
            total += loss.detach()
            note()
    else:
        original = Net.train_step

        def train_step(self: Net, batch: Any) -> TrainOutput:
            note()
            return original(self, batch)

        Net.train_step = train_step  # type: ignore[method-assign]
        loader = DataLoaderBuilder().batch_size(1).build(data)
        directory = Path(tempfile.mkdtemp())
        from ember.optim import SgdConfig

        (
            LearnerBuilder(directory)
            .metric_train_numeric(LossMetric())
            .metric_train_numeric(AccuracyMetric())
            .num_epochs(1)
            .renderer(quiet())
            .build(model, SgdConfig().init(), 1e-3)
            .fit(loader)
        )
        shutil.rmtree(directory)
    print(json.dumps(samples))


def part_memory(steps: int) -> None:
    print(f"\n## Resident memory over a {steps:,}-step epoch (fresh process each)\n")
    results = {}
    for variant in ("raw", "ember"):
        done = subprocess.run(
            [sys.executable, __file__, "--memory-child", variant, "--steps", str(steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    print("| step | raw RSS MiB | ember RSS MiB |")
    print("|---:|---:|---:|")
    for (step, raw), (_, ember) in zip(results["raw"], results["ember"]):
        print(f"| {step:,} | {raw / 2**20:.1f} | {ember / 2**20:.1f} |")
    growth = {v: (s[-1][1] - s[0][1]) / 2**20 for v, s in results.items()}
    print(
        f"\nGrowth from step {results['raw'][0][0]:,} to {steps:,}: raw {growth['raw']:+.2f} MiB, "
        f"ember {growth['ember']:+.2f} MiB (ember - raw: {growth['ember'] - growth['raw']:+.2f} MiB)"
    )


# Time and memory to the first batch ---------------------------------------------------
class Indices(torch.utils.data.Dataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


def first_batch(make: Any, repeats: int = 5) -> tuple[float, int]:
    """The best time to the first batch, then (in a run of its own: tracing slows every
    allocation) the peak memory allocated on the way."""
    best = float("inf")
    for _ in range(repeats):
        loader = make()
        start = time.process_time()
        next(iter(loader))
        best = min(best, time.process_time() - start)
    loader = make()
    tracemalloc.start()
    next(iter(loader))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, peak


def part_loader(sizes: list[int]) -> None:
    print("\n## Time and memory to the first batch (batch 64)\n")
    print("| items | order | raw DataLoader ms | ember ms | ember / raw | raw MB | ember MB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for size in sizes:
        data = Indices(size)
        for order, shuffle in (("in order", False), ("shuffled", True)):
            raw = first_batch(
                lambda d=data, s=shuffle: torch.utils.data.DataLoader(d, batch_size=64, shuffle=s)
            )
            builder = DataLoaderBuilder().batch_size(64)
            if shuffle:
                builder = builder.shuffle(0)
            ember = first_batch(lambda d=data, b=builder: b.build(d))
            print(
                f"| {size:,} | {order} | {raw[0] * 1000:.2f} | {ember[0] * 1000:.2f} | "
                f"{ember[0] / raw[0]:.2f} | {raw[1] / 1e6:.1f} | {ember[1] / 1e6:.1f} |"
            )


# The dashboard and the notebook view --------------------------------------------------
def tracker_after(epochs: int, steps_per_epoch: int) -> Any:
    from ember.train.logger.base import MetricRecord
    from ember.train.renderer.base import MetricView, Progress, RunInfo
    from ember.train.renderer.state import RunTracker

    tracker = RunTracker()
    metrics = (("train", "Loss", "", True), ("valid", "Loss", "", True))
    tracker.start(RunInfo("run", 1, epochs, "Net", 1, ("cpu",), metrics))
    tick = min(steps_per_epoch, 1000)  # records per renderer tick
    for epoch in range(1, epochs + 1):
        for split in ("train", "valid"):
            view = MetricView(split, "Loss", "", True, 1.0 / epoch, 1.0 / epoch)
            for first in range(1, steps_per_epoch + 1, tick):
                last = min(steps_per_epoch, first + tick - 1)
                progress = Progress(split, epoch, epochs, last, steps_per_epoch, last, 1.0)
                records = [
                    MetricRecord("Loss", i, 1.0 / (epoch + i / steps_per_epoch), 1.0)
                    for i in range(first, last + 1)
                ]
                tracker.update(progress, [view], records)
            tracker.end_split(progress, [view])
    return tracker


def frame_cost(tracker: Any) -> tuple[float, float]:
    from ember.train.renderer.htmlview import page
    from ember.train.renderer.panels import dashboard

    def terminal() -> None:
        for view in ("history", "epochs"):
            dashboard(tracker.snapshot("Loss", view), 120, 40)

    def notebook() -> None:
        page(tracker.snapshot("Loss"), {"Loss": tracker.series("Loss")})

    return best_of(terminal), best_of(notebook)


def best_of(function: Any, repeats: int = 7) -> float:
    gc.collect()  # what building the run left behind is not charged to the timing
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        function()
        best = min(best, time.process_time() - start)
    return best


def part_dashboard() -> None:
    print("\n## Dashboard frame and notebook view against the run's length\n")
    print("| run | terminal frame ms | notebook view ms | tracked state KB |")
    print("|---|---:|---:|---:|")
    runs = []
    for label, epochs, steps in (
        ("100 epochs", 100, 1),
        ("100,000 epochs", 100_000, 1),
        ("1 epoch of 1,000,000 steps", 1, 1_000_000),
    ):
        tracemalloc.start()
        tracker = tracker_after(epochs, steps)
        state = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        runs.append((label, tracker, state))
    best = [(float("inf"), float("inf"))] * len(runs)
    for _ in range(3):  # round-robin, so that a busy moment does not favour one run
        for index, (_, tracker, _) in enumerate(runs):
            terminal, notebook = frame_cost(tracker)
            best[index] = (min(best[index][0], terminal), min(best[index][1], notebook))
    for (label, _, state), (terminal, notebook) in zip(runs, best):
        print(f"| {label} | {terminal * 1000:.2f} | {notebook * 1000:.2f} | {state / 1024:.0f} |")
    (t100, n100), (t100k, n100k) = best[0], best[1]
    print(f"\n100,000 / 100 epochs: terminal {t100k / t100:.2f}x, notebook {n100k / n100:.2f}x")


# ember plot ---------------------------------------------------------------------------
def part_plot(epochs: int, root: Path) -> None:
    from ember.plot import plot_run
    from ember.train.files.artifacts import Artifacts
    from ember.train.files.metric_files import format_line
    from ember.train.history import RunHistory

    print(f"\n## ember plot on a run of {epochs:,} epochs (3 iterations each)\n")
    artifacts = Artifacts(root / "plotted")
    history = RunHistory(artifacts.history)
    for epoch in range(1, epochs + 1):
        path = artifacts.metric_log("train", epoch, "Loss")
        path.parent.mkdir(parents=True)
        path.write_text("".join(format_line(1.0 / (epoch + i), 8) for i in range(3)))
        history.epochs.append((epoch, {"train": {"Loss": 1.0 / epoch}}))
    history.describe_model("Net", 68)  # the first write: the whole history at once
    history.finish("completed")
    elapsed = best_of(lambda: plot_run(artifacts.root, root / "plots"), repeats=3)
    print(f"plot_run: {elapsed:.2f} s for {epochs:,} epochs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--plot-epochs", type=int, default=10_000)
    parser.add_argument("--only", default="epochs,memory,loader,dashboard,plot")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.steps)
        return
    torch.set_num_threads(1)
    parts = set(args.only.split(","))
    print(f"# ember growth benchmark (torch {torch.__version__}, {os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        if "loader" in parts:
            part_loader([int(size) for size in args.sizes.split(",")])
        if "dashboard" in parts:
            part_dashboard()
        if "plot" in parts:
            part_plot(args.plot_epochs, root)
        if "memory" in parts:
            part_memory(args.steps)
        if "epochs" in parts:
            part_epochs(args.epochs, root)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nPeak RSS of this process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
