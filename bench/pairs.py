"""ember's time over the raw loop as a fresh process pays it, with the machine's noise
between processes left out.

    python bench/pairs.py [--reps 8] [--threads 1] [--sizes 6400,60000]

Two processes of the same loop differ by 1-3% on a shared machine, as much as the
figures `bench/run.py` is after. Here each process (no byte-code cache, glibc's malloc
as in `bench/run.py`) runs both fits of `bench/worker.py`'s MLP workload, the raw
loop's and ember's, one after the other, and times each from its first batch to the end
of validation (10,000 samples). Whichever runs first also pays torch's own first-call
costs, so the order alternates from one process to the next: with `R` and `E` the two
fits' times and `c` torch's first-call cost, raw first gives `E - (R + c)`, ember first
`(E + c) - R`, and the mean of their medians is `E - R`. ember's own first-call costs
(its code running for the first time in the process) stay in `E`, as in a user's
script. At two training sizes (`--sizes`, samples), the difference between the sizes
gives ember's cost per step, the rest its cost once per fit (validation included).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

VALID = 10_000


def child(order: list[str], threads: int, samples: int) -> None:
    """One process: the fits of `order`, one after the other; prints their times."""
    import torch

    torch.set_num_threads(threads)
    import worker

    import ember.train  # noqa: F401  (imported before either clock starts)

    times = {}
    for variant in order:
        with tempfile.TemporaryDirectory() as scratch:
            if variant == "raw":
                result = worker.run_raw("mlp", samples, VALID, scratch)
            else:
                result = worker.run_ember("mlp", samples, VALID, scratch, checkpoint=False)
        times[variant] = result["fit_s"]
    print(json.dumps(times), flush=True)


def measure(reps: int, threads: int, samples: int) -> dict[str, list[float]]:
    """ember - raw in ms, per process, for each order."""
    from processes import child_env, python

    env = child_env(threads)
    found: dict[str, list[float]] = {"raw first": [], "ember first": []}
    for _ in range(reps):
        for order in ("raw,ember", "ember,raw"):
            args = [str(Path(__file__)), "--child", order, "--threads", str(threads)]
            done, _ = python(
                [*args, "--samples", str(samples)], env, check=True, capture_output=True
            )
            times = json.loads(done.stdout.decode().strip().splitlines()[-1])
            key = "raw first" if order.startswith("raw") else "ember first"
            found[key].append((times["ember"] - times["raw"]) * 1e3)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8, help="processes of each order, per size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="6400,60000", help="training samples")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child.split(","), args.threads, args.samples)
        return
    from worker import BATCH_SIZE

    sizes = [int(size) for size in args.sizes.split(",")]
    print(
        f"MLP, {args.threads} torch thread(s), {VALID:,} validation samples; "
        f"{args.reps} processes of each order per size\n"
    )
    print("| training batches | ember − raw, raw first (ms) | ember first | ember's cost (ms) |")
    print("|---:|---:|---:|---:|")
    costs = {}
    for samples in sizes:
        found = measure(args.reps, args.threads, samples)
        first, second = (statistics.median(found[key]) for key in ("raw first", "ember first"))
        batches = -(-samples // BATCH_SIZE)
        costs[batches] = (first + second) / 2
        print(f"| {batches} | {first:+.1f} | {second:+.1f} | {costs[batches]:+.1f} |")
    if len(costs) >= 2:
        ordered = sorted(costs.items())
        (small, low), (large, high) = ordered[0], ordered[-1]
        per_step = (high - low) / (large - small) * 1e3
        print(
            f"\nember's cost per step {per_step:.1f} µs; once per fit "
            f"{low - per_step * small / 1e3:.1f} ms (the validation pass included)"
        )


if __name__ == "__main__":
    main()
