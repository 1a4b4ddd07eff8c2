"""Where the wall-clock gap between ember and the hand-written loop lies, inside a fit.

    python bench/attribution.py [--batches 938] [--small 100] [--reps 9] [--valid 64]

Instruction counts (`bench/instructions.py`) weigh every instruction alike, but the
Python of a loop's bookkeeping runs far slower per instruction than the vectorised
kernels of a step, and slower inside a fit (whose forward and backward evict it from
the caches) than in a micro-benchmark. This script times, in one process and
alternating, four fits of `bench/worker.py`'s MLP workload (`--batches` training
batches of 64, `--valid` validation samples):

- `raw`: the hand-written loop, accuracy and loss summed on the device;
- `raw_bare`: the same loop without the accuracy and loss sums;
- `ember`: ember with Accuracy and Loss (its defaults in `bench/run.py`);
- `ember_no_metrics`: the same with the metric updates left out after the first step.

`raw - raw_bare` is what the hand-written loop's own metrics cost inside a fit;
`ember - ember_no_metrics` what ember's metric updates, log lines and ticks cost;
`ember_no_metrics - raw_bare` the rest of ember. Each fit runs with `--batches` and with
`--small` batches: the difference between the two, over the batches between, is the
cost per step, and what is left of the larger fit's the cost once per fit (the fit's
start and end, the first step's checks). Medians of `--reps` repetitions; the
machine's noise (several ms on a shared 2-core machine) bounds what the differences
resolve: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=938)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--valid", type=int, default=64)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    import worker

    from ember.train.processor import MetricsProcessor

    torch.set_num_threads(1)
    with_sums = worker.raw_train_epoch

    def without_sums(model, optimizer, batches):  # type: ignore[no-untyped-def]
        model.train()
        seen = 0
        for inputs, targets in batches:
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seen += targets.shape[0]
        return torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.int64), seen

    update = MetricsProcessor.update

    def first_update_only(self, item, iteration, batch_size, lr):  # type: ignore[no-untyped-def]
        self._iteration = iteration
        if iteration == 1:  # the first step's values, so that the epoch has some
            update(self, item, iteration, batch_size, lr)

    variants = ("raw", "raw_bare", "ember", "ember_no_metrics")
    sizes = (args.small, args.batches)
    times: dict[tuple[str, int], list[float]] = {(n, b): [] for n in variants for b in sizes}
    for _ in range(args.reps):
        for batches in sizes:
            for name in variants:
                worker.raw_train_epoch = without_sums if name == "raw_bare" else with_sums
                fast = name == "ember_no_metrics"
                MetricsProcessor.update = first_update_only if fast else update
                with (
                    tempfile.TemporaryDirectory() as scratch,
                    contextlib.redirect_stdout(io.StringIO()),
                ):
                    if name.startswith("raw"):
                        result = worker.run_raw("mlp", 64 * batches, args.valid, scratch)
                    else:
                        result = worker.run_ember(
                            "mlp",
                            64 * batches,
                            args.valid,
                            scratch,
                            checkpoint=False,
                            loader="ember",
                            plain_interval=3600.0,
                        )
                times[name, batches].append(result["fit_s"])
    MetricsProcessor.update = update
    worker.raw_train_epoch = with_sums
    median = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    print(
        f"MLP, batches of 64, {args.valid} validation samples; medians of {args.reps} "
        "alternating fits in one process\n"
    )
    print(f"| fit | ms, {args.small} batches | ms, {args.batches} batches |")
    print("|---|---:|---:|")
    for name in variants:
        print(f"| {name} | {median[name, args.small]:.1f} | {median[name, args.batches]:.1f} |")
    steps = args.batches - args.small

    def part(more: str, less: str) -> tuple[float, float]:
        """(µs per step, ms once per fit) of `more` over `less`."""
        big = median[more, args.batches] - median[less, args.batches]
        small = median[more, args.small] - median[less, args.small]
        per_step = (big - small) / steps * 1e3
        return per_step, big - per_step * args.batches / 1e3

    parts = {
        "the raw loop's accuracy and loss sums": part("raw", "raw_bare"),
        "ember's metric updates, log lines and ticks": part("ember", "ember_no_metrics"),
        "the rest of ember": part("ember_no_metrics", "raw_bare"),
        "ember over the raw loop": part("ember", "raw"),
    }
    print("\n| part | µs per step | ms once per fit |")
    print("|---|---:|---:|")
    for label, (per_step, once) in parts.items():
        print(f"| {label} | {per_step:.1f} | {once:.1f} |")
    ratio = median["ember", args.batches] / median["raw", args.batches]
    print(f"\nember / raw, {args.batches} batches: {ratio:.3f}")


if __name__ == "__main__":
    main()
