"""ember's cost per training step in CPU instructions: a figure no noisy neighbour moves.

    python bench/instructions.py [--model mlp] [--small 100] [--large 300] [--jobs 2]

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
        worker.run_ember(model, 64 * batches, {valid}, scratch, False)
"""


def count(variant: str, model: str, batches: int, step: float, scratch: Path) -> int:
    """Instructions executed by one whole process of `variant` on `batches` batches."""
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
    found = re.search(r"Collected : (\d+)", result.stderr)
    if result.returncode != 0 or found is None:
        raise SystemExit(f"{variant} on {batches} batches failed:\n{result.stderr[-2000:]}")
    return int(found.group(1))


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
                        lambda run: count(run[0], args.model, run[1], step_ms / 1e3, scratch), runs
                    ),
                )
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    steps = args.large - args.small
    per_step = {
        v: (counts[(v, args.large)] - counts[(v, args.small)]) / steps for v in ("raw", "ember")
    }
    print(
        f"{args.model}: instructions per training step (batch 64), from {args.small} and "
        f"{args.large} batches under callgrind (metrics flushed as at {step_ms} ms a step)\n"
    )
    print("| variant | instructions, small run | instructions, large run | per step | / raw |")
    print("|---|---:|---:|---:|---:|")
    for v in ("raw", "ember"):
        print(
            f"| {v} | {counts[(v, args.small)]:,} | {counts[(v, args.large)]:,} | "
            f"{per_step[v]:,.0f} | {per_step[v] / per_step['raw']:.4f} |"
        )


if __name__ == "__main__":
    main()
