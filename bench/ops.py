"""torch operations dispatched per training step: ember against the hand-written loop.

    python bench/ops.py [--model mlp] [--small 5] [--large 25]

A count no noisy neighbour moves. Every aten operation dispatched (forward, backward,
optimizer, metric bookkeeping, checks; `.item()` reads count as
`aten._local_scalar_dense`) is counted with a `TorchDispatchMode`, over one training
epoch of `small` and of `large` batches of 64, for the raw loop of `bench/worker.py`
(accuracy and loss summed on the device) and for ember with the worker's metrics
(Accuracy and Loss), on the CPU. The difference between the two counts, divided by the
difference in batches, is the operations per step: once-per-run work cancels out.
Printed: the total per step, and each operation whose count differs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _worker() -> Any:
    """bench/worker.py: the same models and loops (imported on first use, so that
    importing this module for `OpCounter` changes nothing else)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import worker

    return worker


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched while it is active, by name (`ops`).
    `tests/test_step_ops.py` counts with it too."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def batches(model: str, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (torch.randn(64, 28, 28, generator=generator), torch.randint(0, 10, (64,)))
        for _ in range(count)
    ]


def raw(model_name: str, count: int) -> collections.Counter[str]:
    worker = _worker()
    model = worker.torch_net(model_name)
    optimizer = torch.optim.Adam(model.parameters(), lr=worker.LR, eps=worker.ADAM_EPS)
    data = batches(model_name, count)
    with OpCounter() as counter:
        loss_sum, correct, _ = worker.raw_train_epoch(model, optimizer, data)
        loss_sum.item(), correct.item()
    return counter.ops


def ember(model_name: str, count: int) -> collections.Counter[str]:
    from ember.train import LearnerBuilder
    from ember.train.metric import AccuracyMetric, LossMetric
    from ember.train.renderer import PlainRenderer

    worker = _worker()
    model = worker.ember_model(model_name)
    learner = (
        LearnerBuilder(tempfile.mkdtemp(prefix="ember-ops-"))
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600.0, stream=io.StringIO()))
        .num_epochs(1)
        .build(model, torch.optim.Adam(model.parameters(), lr=worker.LR, eps=worker.ADAM_EPS), 1e-3)
    )
    data = batches(model_name, count)
    with contextlib.redirect_stdout(io.StringIO()), OpCounter() as counter:
        learner.fit(data)
    return counter.ops


def main() -> None:
    worker = _worker()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=worker.MODELS, default="mlp")
    parser.add_argument("--small", type=int, default=5)
    parser.add_argument("--large", type=int, default=25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = args.large - args.small
    per_step = {}
    for name, run in (("raw", raw), ("ember", ember)):
        small, large = run(args.model, args.small), run(args.model, args.large)
        per_step[name] = {op: (large[op] - small[op]) / steps for op in {*small, *large}}
    totals = {name: sum(ops.values()) for name, ops in per_step.items()}
    print(f"{args.model}: torch ops dispatched per training step (batch 64, CPU), from")
    print(f"epochs of {args.small} and {args.large} batches\n")
    print("| variant | ops per step | / raw |")
    print("|---|---:|---:|")
    for name, total in totals.items():
        print(f"| {name} | {total:g} | {total / totals['raw']:.3f} |")
    print("\n| op | raw | ember |")
    print("|---|---:|---:|")
    for op in sorted({*per_step["raw"], *per_step["ember"]}):
        a, b = per_step["raw"].get(op, 0.0), per_step["ember"].get(op, 0.0)
        if a != b:
            print(f"| `{op}` | {a:g} | {b:g} |")


if __name__ == "__main__":
    main()
