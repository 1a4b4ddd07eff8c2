"""ember's cost per training step in CPU instructions: a figure no noisy neighbour moves.

    python bench/instructions.py [--model mlp] [--small 100] [--large 300] [--jobs 2] [--cache-sim]

Wall-clock and CPU times on a shared machine vary by 10 % or more from one process to
the next, more than the differences this benchmark is about. Instruction counts do
not: a busy neighbour does not move them, and the per-step figure of one tree moves
by a few tenths of a percent from one run to the next (ember / raw 1.004-1.008 for
the same code), so compare trees by more than one run each. Each variant of `bench/worker.py` (the raw loop and ember with its defaults)
runs under valgrind's callgrind twice, on `small` and on `large` training batches of
64 (640 validation samples both times). The difference between the two counts,
divided by the difference in batches, is the variant's instructions per training
step (data loading, forward, backward, optimizer, and for ember its metrics, logs and
checks); everything done once per process (imports, data generation, set-up, the
validation pass) cancels out. The ratio ember / raw of instructions per step is
ember's per-step overhead. Needs valgrind; takes a few minutes (callgrind runs about
50x slower than the CPU).

`--cache-sim` also simulates the caches (callgrind's `--cache-sim=yes`, about twice
as slow again) and adds estimated cycles per step, cachegrind's usual estimate
Ir + 10 x (first-level misses) + 100 x (last-level misses): memory traffic weighed in,
still free of noise. It models no branch predictor, so the Python interpreter's
share of the time remains undercounted.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
VALID = 640

CHILD = """
import contextlib, io, sys, tempfile, types
sys.path.insert(0, {here!r})
import torch
torch.set_num_threads(1)
import worker
variant, model, batches, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
scratch = tempfile.mkdtemp()
if variant == "ember":
    # Metric values reach the files every 0.1 s of wall time; under callgrind a step is
    # ~100x slower, so give the metrics processor a clock that advances by the native
    # step time at each read: the values are flushed as often, in steps, as natively.
    # The clock is made of C calls only, as time.monotonic is, so it adds no Python code.
    import functools, itertools
    import ember.train.processor as processor
    clock = functools.partial(next, itertools.count(step, step))
    processor.time = types.SimpleNamespace(monotonic=clock)
with contextlib.redirect_stdout(io.StringIO()):
    if variant == "raw":
        worker.run_raw(model, 64 * batches, {valid}, scratch)
    else:
        worker.run_ember(model, 64 * batches, {valid}, scratch, False, "ember", 3600.0)
"""


EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
"""callgrind's events with --cache-sim=yes, in the order of its "Collected" line."""


def cycles(events: list[int]) -> int:
    """cachegrind's estimate of cycles: an instruction each, 10 per first-level miss,
    100 per last-level miss."""
    named = dict(zip(EVENTS, events))
    first = named["I1mr"] + named["D1mr"] + named["D1mw"]
    last = named["ILmr"] + named["DLmr"] + named["DLmw"]
    return named["Ir"] + 10 * first + 100 * last


def count(
    variant: str, model: str, batches: int, step: float, scratch: Path, cache_sim: bool
) -> list[int]:
    """callgrind's event counts for one whole process of `variant` on `batches`
    batches: [instructions], or the nine of `EVENTS` with `cache_sim`."""
    out = scratch / f"callgrind.{variant}.{batches}"
    script = scratch / "child.py"
    script.write_text(CHILD.format(here=str(HERE), valid=VALID))
    # Without address-space randomisation (and with a fixed hash seed, below) a count
    # repeats to within a few hundred instructions; with it, it moves by millions.
    fixed = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
    result = subprocess.run(
        [
            *fixed,
            "valgrind",
            "--tool=callgrind",
            *(["--cache-sim=yes"] if cache_sim else []),
            f"--callgrind-out-file={out}",
            sys.executable,
            str(script),
            variant,
            model,
            str(batches),
            str(step),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"Collected : ([\d ]+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"{variant} on {batches} batches failed:\n{result.stderr[-2000:]}")
    return [int(number) for number in found.group(1).split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--small", type=int, default=100, help="training batches, first run")
    parser.add_argument("--large", type=int, default=300, help="training batches, second run")
    parser.add_argument("--jobs", type=int, default=2, help="callgrind runs at once")
    parser.add_argument(
        "--native-step-ms",
        type=float,
        default=None,
        help="a training step's native time, for how often metrics are flushed "
        "(default: 1.1 for the MLP, 30 for the CNN, as measured by bench/run.py)",
    )
    parser.add_argument(
        "--cache-sim",
        action="store_true",
        help="simulate the caches too and report estimated cycles per step (slower)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind).")
    if args.large <= args.small:
        raise SystemExit("--large must be greater than --small.")
    step_ms = args.native_step_ms or {"mlp": 1.1, "cnn": 30.0}[args.model]
    scratch = Path(tempfile.mkdtemp(prefix="ember-instructions-"))
    runs = [(v, b) for v in ("raw", "ember") for b in (args.small, args.large)]
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            counts = dict(
                zip(
                    runs,
                    pool.map(
                        lambda run: count(
                            run[0], args.model, run[1], step_ms / 1e3, scratch, args.cache_sim
                        ),
                        runs,
                    ),
                )
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    steps = args.large - args.small
    per_step = {
        v: (counts[(v, args.large)][0] - counts[(v, args.small)][0]) / steps
        for v in ("raw", "ember")
    }
    print(
        f"{args.model}: instructions per training step (batch 64), from {args.small} and "
        f"{args.large} batches under callgrind (metrics flushed as at {step_ms} ms a step)\n"
    )
    print("| variant | instructions, small run | instructions, large run | per step | / raw |")
    print("|---|---:|---:|---:|---:|")
    for v in ("raw", "ember"):
        print(
            f"| {v} | {counts[(v, args.small)][0]:,} | {counts[(v, args.large)][0]:,} | "
            f"{per_step[v]:,.0f} | {per_step[v] / per_step['raw']:.4f} |"
        )
    if args.cache_sim:
        print_cache(counts, args.small, args.large)


def print_cache(counts: dict[tuple[str, int], list[int]], small: int, large: int) -> None:
    """Per step: each simulated event and the estimated cycles, ember against raw."""
    per_step = {
        v: [(b - a) / (large - small) for a, b in zip(counts[(v, small)], counts[(v, large)])]
        for v in ("raw", "ember")
    }
    print("\nPer training step, with the caches simulated (Ir instructions; D reads/writes;")
    print("I1/D1 first-level misses; IL/DL last-level misses):\n")
    print("| event | raw | ember | ember - raw |")
    print("|---|---:|---:|---:|")
    for index, name in enumerate(EVENTS):
        raw, ember = per_step["raw"][index], per_step["ember"][index]
        print(f"| {name} | {raw:,.0f} | {ember:,.0f} | {ember - raw:+,.0f} |")
    estimate = {
        v: (cycles(counts[(v, large)]) - cycles(counts[(v, small)])) / (large - small)
        for v in ("raw", "ember")
    }
    print(
        f"\nEstimated cycles per step: raw {estimate['raw']:,.0f}, ember "
        f"{estimate['ember']:,.0f}, ember / raw {estimate['ember'] / estimate['raw']:.4f}"
    )


if __name__ == "__main__":
    main()
