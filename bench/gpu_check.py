"""Every check that needs a CUDA GPU, in one command, with one markdown report.

    make gpu-check            (PYTHONPATH=src python3 bench/gpu_check.py)
    python bench/gpu_check.py [--out bench/results/gpu-check.md] [--quick]

Runs in the Python environment it is started from (a GPU machine's own CUDA build of
torch: no virtualenv, nothing installed or fetched), with ember from this checkout's
`src/`. It stops at once, saying so, where torch sees no CUDA device, and names every
package it lacks. In order, each with a time limit, about 6 minutes on one GPU:

1. `pytest -m cuda`: the CUDA tests (exact resume with fp16 and bf16, host syncs,
   checkpoints of device tensors, the out-of-memory post-mortem naming the test's own
   line; FSDP and DDP over NCCL when two GPUs are there);
2. the NVML and system metric tests on the real driver;
3. `bench/gpu_oom.py`: grads_accumulation("auto") under a 1.6 GiB cap;
4. `bench/memory_estimate.py --device cuda`: the memory estimate of a step against
   `torch.cuda.max_memory_allocated` (MLP, CNN, transformer LM; fp32 and bf16);
5. `bench/gpu.py` on every workload (mlp, resnet18, transformer, lm8192), raw against
   ember against ember with a CompactRecorder checkpoint per epoch, with allocation
   snapshots and the table of where ember's peak memory goes against raw's.

The report (`--out`) has each step's command, outcome, time and the tail of its output.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("torch", "pytest", "numpy", "rich", "msgpack")
HELPFUL = {
    "isal": "checkpoint compression (CompactRecorder) several times faster",
    "pynvml": "the NVML metric tests (nvidia-ml-py)",
    "torchvision": "torchvision's ResNet-18 (else an equal network defined in bench/)",
    "lightning": "the Lightning variant of bench/gpu.py",
}


def missing(names) -> list[str]:
    return [name for name in names if importlib.util.find_spec(name) is None]


def environment() -> tuple[list[str], int]:
    """The report's first lines, and the number of CUDA devices (stops without one)."""
    lacking = missing(NEEDED)
    if lacking:
        raise SystemExit(
            f"gpu-check needs {', '.join(lacking)}, which this Python ({sys.executable}) "
            f"lacks: install {'it' if len(lacking) == 1 else 'them'} into it (no virtualenv "
            "is made: the check runs with the machine's own CUDA build of torch)."
        )
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            f"gpu-check needs a CUDA device, and torch {torch.__version__} (built with "
            f"{torch.version.cuda or 'no CUDA'}) sees none here. Run it on a machine with an "
            "NVIDIA GPU and a CUDA build of torch; `make test` checks everything else."
        )
    count = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
    lines = [
        "# gpu-check",
        "",
        f"{count} CUDA device(s): {names}; torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}); Python {sys.version.split()[0]}.",
    ]
    for name, what in HELPFUL.items():
        if importlib.util.find_spec(name) is None:
            lines.append(f"- `{name}` is not installed: without it, no {what}.")
    return lines, count


def step(title: str, command: list[str], limit: float) -> tuple[str, bool]:
    """Run one step; its report section and whether it passed."""
    started = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit
        )
        output, passed = done.stdout + done.stderr, done.returncode == 0
        outcome = "passed" if passed else f"FAILED (exit status {done.returncode})"
    except subprocess.TimeoutExpired as timeout:
        output = (timeout.stdout or b"").decode() + (timeout.stderr or b"").decode()
        passed, outcome = False, f"FAILED: still running after {limit:.0f} s"
    seconds = time.perf_counter() - started
    tail = "\n".join(output.strip().splitlines()[-40:])
    shown = " ".join(command[1:]) if command[0] == sys.executable else " ".join(command)
    section = (
        f"\n## {title}: {outcome} in {seconds:.0f} s\n\n`python {shown}`\n\n```\n{tail}\n```\n"
    )
    print(section, flush=True)
    return section, passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/gpu-check.md")
    parser.add_argument("--quick", action="store_true", help="bench/gpu.py on mlp and lm8192 only")
    args = parser.parse_args()
    lines, _ = environment()
    results = ROOT / "bench" / "results"
    python = sys.executable
    workloads = "mlp,lm8192" if args.quick else "mlp,resnet18,transformer,lm8192"
    steps = [
        ("CUDA tests", [python, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"], 240),
        (
            "NVML and system metrics",
            [
                python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/metric/test_nvml.py",
                "tests/metric/test_metric_system.py",
            ],
            120,
        ),
        ("Out of memory under a cap", [python, "bench/gpu_oom.py"], 150),
        (
            "Memory estimate against max_memory_allocated",
            [python, "bench/memory_estimate.py", "--device", "cuda"],
            120,
        ),
        (
            "Fit time, host syncs and peak memory",
            [
                python,
                "bench/gpu.py",
                "--reps",
                "1",
                "--steps",
                "50",
                "--epochs",
                "2",
                "--workloads",
                workloads,
                "--variants",
                "raw,ember,ember_CompactRecorder",
                "--snapshot",
                str(results / "gpu-snapshots"),
                "--out",
                str(results / "gpu.md"),
            ],
            330,
        ),
    ]
    failed = []
    for title, command, limit in steps:
        section, passed = step(title, command, limit)
        lines.append(section)
        if not passed:
            failed.append(title)
    lines.insert(3, f"\n**{'All passed' if not failed else 'Failed: ' + ', '.join(failed)}.**")
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\nThe report is in {out}.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
