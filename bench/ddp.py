"""Samples per second of the guide's CNN on 1 vs 2 CPU processes (gloo).

    python bench/ddp.py [--samples 8000] [--reps 3]

Each run is a fresh `python bench/ddp.py --run N` process; with N = 2, ember starts
the second process itself. The global batch is 64 in both cases (2 x 32 on two
processes), one torch thread per process. On a 2-core machine the point is that
several processes train correctly, not speed: the figures are printed as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(processes: int, samples: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import ember
    from ember.data import DataLoaderBuilder
    from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
    from ember.train.metric import AccuracyMetric, LossMetric
    from ember.train.renderer import PlainRenderer

    torch.set_num_threads(1)
    ember.seed(0)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(samples, 28, 28, generator=generator)
    targets = (images[:, 10:18, 10:18].mean(dim=(1, 2)) * 10).long().clamp(max=9)
    data = torch.utils.data.TensorDataset(images, targets)

    class Batcher:
        def batch(self, items):
            return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    class Cnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 8, 3), nn.Conv2d(8, 16, 3)
            self.pool = nn.AdaptiveAvgPool2d((8, 8))
            self.linear1, self.linear2 = nn.Linear(1024, 512), nn.Linear(512, 10)

        def forward(self, x):
            x = self.pool(F.relu(self.conv2(self.conv1(x.unsqueeze(1)))))
            return self.linear2(F.relu(self.linear1(x.flatten(1))))

        def classify(self, batch):
            x, y = batch
            out = self(x)
            return ClassificationOutput(F.cross_entropy(out, y), out, y)

        def train_step(self, batch):
            return TrainOutput(self.classify(batch))

        def valid_step(self, batch):
            return self.classify(batch)

    loader = DataLoaderBuilder(Batcher()).batch_size(64 // processes).shuffle(0).build(data)
    directory = (
        Path(tempfile.mkdtemp()) if ember.is_main_process() else Path(os.environ["EMBER_BENCH_DIR"])
    )
    os.environ["EMBER_BENCH_DIR"] = str(directory)
    model = Cnn()
    learner = (
        LearnerBuilder(directory / "run")
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .devices(["cpu"] * processes)
        .num_epochs(1)
        .renderer(PlainRenderer(interval=3600))
        .build(model, torch.optim.Adam(model.parameters(), 1e-3), 1e-3)
    )
    start = time.perf_counter()
    learner.fit(loader)
    seconds = time.perf_counter() - start
    if ember.is_main_process():
        loss = learner.history[-1][1]["train"]["Loss"]
        print(json.dumps({"processes": processes, "seconds": seconds, "loss": loss}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, default=None)
    parser.add_argument("--samples", type=int, default=8000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.run is not None:
        run(args.run, args.samples)
        return
    results: dict[int, list[dict]] = {1: [], 2: []}
    for _ in range(args.reps):
        for processes in (1, 2):
            out = subprocess.run(
                [sys.executable, __file__, "--run", str(processes), "--samples", str(args.samples)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            results[processes].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"CNN, {args.samples} samples, global batch 64, {args.reps} runs each (median):")
    print("| processes | samples/s | loss |")
    print("|---:|---:|---:|")
    for processes, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        loss = statistics.median(r["loss"] for r in runs)
        print(f"| {processes} | {args.samples / seconds:,.0f} | {loss:.4f} |")


if __name__ == "__main__":
    main()
