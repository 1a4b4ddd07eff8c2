"""How close the memory estimate comes to a real step's peak: a Markdown table.

    PYTHONPATH=src python bench/memory_estimate.py [--device cuda] [--out FILE]

For an MLP, a CNN and a small transformer language model (`tests/memory_workloads.py`,
their larger sizes), in float32 and under bf16 mixed precision, with Adam: the peak of
one training step as `Learner.memory_estimate` computes it on fake tensors, against
the peak of a real step after the first (its optimizer state made). On the CPU the
reference is the live-bytes high-water mark of a dispatch mode that counts every
storage an op creates until it is freed, with what was live before the step
(parameters, buffers, optimizer state, the batch); on CUDA it is
`torch.cuda.max_memory_allocated`, less what was allocated before the step that the
estimate does not count (cuBLAS workspaces).
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from memory_workloads import cuda_peak, measured_peak, workload  # noqa: E402

from ember.train import LearnerBuilder  # noqa: E402
from ember.train.renderer import PlainRenderer  # noqa: E402

NAMES = {"mlp": "MLP", "cnn": "CNN", "lm": "transformer LM"}
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def mib(size: float) -> str:
    return f"{size / 2**20:.2f} MiB"


def row(name: str, dtype: str, device: torch.device, directory: str) -> tuple[str, float]:
    model, optimizer, batch = workload(name, large=True)
    model.to(device)
    builder = LearnerBuilder(directory, overwrite=True).renderer(
        PlainRenderer(interval=3600, stream=io.StringIO())
    )
    if dtype == "bf16":
        builder = builder.mixed_precision("bf16")
    learner = builder.devices([str(device)]).build(model, optimizer)
    started = time.perf_counter()
    estimate = learner.memory_estimate(batch)
    seconds = time.perf_counter() - started
    model, optimizer, batch = workload(name, large=True)
    model.to(device)
    batch = batch.to(device) if isinstance(batch, torch.Tensor) else [t.to(device) for t in batch]
    measure = cuda_peak if device.type == "cuda" else measured_peak
    measured = measure(model, optimizer, batch, DTYPES[dtype])
    ratio = estimate.peak / measured
    return (
        f"| {NAMES[name]} | {dtype} | {mib(estimate.peak)} | {mib(measured)} | {ratio:.4f} "
        f"| {seconds:.2f} s |"
    ), ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", default=None, help="default: bench/results/memory-estimate[-cuda].md"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    suffix = "" if device.type == "cpu" else f"-{device.type}"
    out = Path(args.out or ROOT / "bench" / "results" / f"memory-estimate{suffix}.md")
    reference = (
        "torch.cuda.max_memory_allocated"
        if device.type == "cuda"
        else "live-bytes high-water mark of a real step"
    )
    lines = [
        f"| workload | dtype | estimated peak | measured peak ({reference}) | ratio | estimate took |",
        "|---|---|---|---|---|---|",
    ]
    ratios = []
    with tempfile.TemporaryDirectory() as directory:
        for name in NAMES:
            for dtype in DTYPES:
                line, ratio = row(name, dtype, device, directory)
                lines.append(line)
                ratios.append(ratio)
                print(line, flush=True)
    worst = max(abs(ratio - 1) for ratio in ratios)
    lines += ["", f"Largest difference: {worst:.1%} (torch {torch.__version__}, {device})."]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\n{lines[-1]}\nwritten to {out}")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
