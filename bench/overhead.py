"""Where ember's per-iteration time goes, beyond what a hand-written loop spends.

    python bench/overhead.py [--iterations 1000] [--runs 15] [--threads 1]

Part 1 times the whole loop on a nearly free workload: 1,000 pre-built batches
(64 x 784 inputs, no DataLoader) through a single Linear(784, 10), so that the
framework's own work is a large share of each iteration. It alternates, in one
process, a raw loop (the same on-device accumulation of accuracy and loss as
`bench/worker.py`'s raw variant), ember with the default metrics (Accuracy and Loss
on train, per-iteration files, plain renderer), and ember with no metric, and
reports the fastest run of each (the fastest run is the one least disturbed by
other processes). The difference, per iteration, is ember's overhead.

Part 2 times each piece of work ember's training iteration adds, in isolation and
with the objects the loop uses (minimum over repeats of `timeit`), to attribute
that overhead. It reads some private helpers of `ember.train.learner`; it is a
diagnostic tool, not an API user.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import shutil
import tempfile
import time
import timeit

import torch
import torch.nn.functional as F
from torch import nn
from worker import raw_train_epoch  # bench/ is this script's directory

from ember.data.device import first_dim, to_device
from ember.lr.base import LrDriver
from ember.lr.constant import ConstantLr
from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
from ember.train.guard import LossGuard
from ember.train.logger.file import FileMetricLogger
from ember.train.metric import AccuracyMetric, LossMetric
from ember.train.metric.base import RegisteredMetric
from ember.train.optimization import Optimization
from ember.train.processor import MetricsProcessor
from ember.train.renderer import PlainRenderer


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(784, 10)

    def forward(self, inputs):
        return self.linear(inputs)

    def classify(self, batch):
        inputs, targets = batch
        output = self(inputs)
        return ClassificationOutput(F.cross_entropy(output, targets), output, targets)

    def train_step(self, batch):
        return TrainOutput(self.classify(batch))

    def valid_step(self, batch):
        return self.classify(batch)


def make_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(64, 784, generator=generator),
            torch.randint(0, 10, (64,), generator=generator),
        )
        for _ in range(count)
    ]


def raw_run(batches) -> float:
    torch.manual_seed(0)
    model = Linear()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    loss_sum, correct, _ = raw_train_epoch(model, optimizer, batches)
    loss_sum.item(), correct.item()
    return time.perf_counter() - start


def ember_run(batches, metrics: bool) -> float:
    torch.manual_seed(0)
    model = Linear()
    scratch = tempfile.mkdtemp(prefix="ember-overhead-")
    builder = LearnerBuilder(scratch + "/run").renderer(PlainRenderer(3600.0, stream=io.StringIO()))
    if metrics:
        builder = builder.metric_train_numeric(AccuracyMetric()).metric_train_numeric(LossMetric())
    learner = builder.build(model, torch.optim.Adam(model.parameters(), lr=1e-3), 1e-3)
    try:
        start = time.perf_counter()
        learner.fit(batches)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def part1(iterations: int, runs: int) -> dict[str, float]:
    batches = make_batches(iterations)
    cases = {
        "raw loop": lambda: raw_run(batches),
        "ember, Accuracy + Loss": lambda: ember_run(batches, True),
        "ember, no metric": lambda: ember_run(batches, False),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for run in range(runs + 1):
        for name, case in cases.items():
            elapsed = case()
            if run:  # the first round warms caches and lazy imports
                times[name].append(elapsed)
    best = {name: min(values) / iterations * 1e6 for name, values in times.items()}
    print(
        f"Part 1: {iterations} iterations of Linear(784, 10) on pre-built batches, best of {runs} runs"
    )
    print(f"{'':28s}{'us/iteration':>14s}{'over raw':>10s}")
    for name, value in best.items():
        print(f"{name:28s}{value:14.1f}{value - best['raw loop']:+10.1f}")
    return best


def part2() -> list[tuple[str, float]]:
    torch.manual_seed(0)
    model = Linear()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    device = torch.device("cpu")
    optim = Optimization(model, optimizer, LrDriver(ConstantLr(1e-3), optimizer), device)
    inputs, targets = make_batches(1)[0]
    batch = (inputs, targets)
    logits = model(inputs)
    loss = F.cross_entropy(logits, targets)
    item = ClassificationOutput(loss, logits, targets)
    guard = LossGuard("stop", device)
    scratch = tempfile.mkdtemp(prefix="ember-overhead-")
    metrics = {
        "train": [RegisteredMetric(AccuracyMetric(), True), RegisteredMetric(LossMetric(), True)],
        "valid": [],
    }
    loggers = {"train": [FileMetricLogger(scratch)], "valid": []}
    processor = MetricsProcessor(
        metrics, loggers, PlainRenderer(3600.0, stream=io.StringIO()), 1, tick=1e9
    )
    processor.start_split("train", 1, 10**9)
    counter = itertools.count(1)

    def update():
        processor.update(item, next(counter), 64, 1e-3)

    def flush_90():  # one 0.1 s tick's worth of iterations of a ~1 ms loop, then the flush
        for _ in range(90):
            update()
        processor.flush()

    def groups_one():
        iterator = iter(range(2))
        list(itertools.islice(iterator, 1))

    def wrap_output():  # what train_step adds to a plain forward: the two output objects
        TrainOutput(ClassificationOutput(loss, logits, targets))

    sums = [torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.int64)]

    def raw_accumulate():
        with torch.no_grad():
            sums[0] += loss.detach() * targets.shape[0]
            sums[1] += (logits.argmax(dim=1) == targets).sum()

    def step_wrapper_only():  # Optimization.step minus optimizer.step and zero_grad
        optim._clip()
        optim.lr.after_step()

    pieces = [
        ("to_device(batch) (2 tensors, same device)", lambda: to_device(batch, device), 1),
        ("batch size: first_dim(batch)", lambda: first_dim(batch), 1),
        ("optim.begin_group() (LR written to the param groups)", optim.begin_group, 1),
        ("autocast() null context, enter + exit", lambda: optim.autocast().__enter__(), 1),
        ("TrainOutput(ClassificationOutput(...)) per step", wrap_output, 1),
        ("guard.check(loss) (float(loss) on the CPU)", lambda: guard.check(loss, 1, 1), 1),
        ("processor.update: Accuracy + Loss, no flush", update, 1),
        ("flush per iteration (90 iterations per 0.1 s tick)", flush_90, 90),
        ("_groups: one group of 1 batch (islice + list)", groups_one, 1),
        ("Optimization.step wrapper (clip check, LR after_step)", step_wrapper_only, 1),
    ]

    def best_of(function, number: int) -> float:
        return min(timeit.repeat(function, number=number, repeat=7)) / number

    results: list[tuple[str, float]] = []
    for name, function, per in pieces:
        best = best_of(function, max(1, 2000 // per)) / per
        results.append((name, best * 1e6))
    flush_line = results[7]
    results[7] = (flush_line[0], flush_line[1] - results[6][1])  # flush_90 includes 90 updates
    raw_acc = min(timeit.repeat(raw_accumulate, number=2000, repeat=7)) / 2000 * 1e6
    shutil.rmtree(scratch, ignore_errors=True)
    print("\nPart 2: each piece of ember's training iteration, best of 7 timeit repeats")
    total = 0.0
    for name, micros in results:
        total += micros
        print(f"{micros:8.2f} us  {name}")
    print(f"{total:8.2f} us  sum")
    print(
        f"{-raw_acc:8.2f} us  minus the raw loop's own on-device accumulation (ember does not do it)"
    )
    print(f"{total - raw_acc:8.2f} us  net")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with contextlib.redirect_stdout(io.StringIO()):
        ember_run(make_batches(4), True)  # lazy imports and first-call costs
    part1(args.iterations, args.runs)
    part2()


if __name__ == "__main__":
    main()
