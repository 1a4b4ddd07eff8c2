"""Peak memory of a fit on the CPU, ember against the hand-written loop: a figure no
noisy neighbour moves.

    python bench/peak_memory.py [--workloads transformer,mlp] [--precisions fp32,bf16]
                                [--steps 3] [--variants raw,ember]

The workloads, models and loops are those of `bench/gpu.py` (its `raw` and `ember`
variants: training only, Accuracy and Loss), run on the CPU for a few steps, each
variant in a fresh process. Every tensor op of the fit runs under a dispatch mode
that reads the C library's count of bytes in use after the op (`mallinfo2`: what
PyTorch's CPU allocator holds, which returns tensors to the C library when they are
freed); the largest reading, less the reading before the fit (model, data), is the
fit's peak. Only glibc Linux has `mallinfo2`; elsewhere the script says so and stops.
It measures what the loop keeps alive on any device (retained outputs, metric
buffers, checks, copies); CUDA-only allocations (the caching allocator, cuBLAS
workspaces, side streams) need `bench/gpu.py` on a GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _in_use() -> Any:
    """A function returning the bytes the C library has handed out (heap and mmap)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        read = libc.mallinfo2
    except (OSError, AttributeError):
        sys.exit("peak_memory.py needs glibc's mallinfo2 (Linux with glibc 2.33 or later).")
    read.restype = _MallInfo2

    def in_use() -> int:
        info = read()
        return int(info.uordblks + info.hblkhd)

    return in_use


def child(variant: str, workload: str, precision: str, steps: int) -> dict:
    import gpu
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(1)
    in_use = _in_use()

    class Peak(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.peak, self.at, self.ops = 0, "", 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            self.ops += 1
            now = in_use()
            if now > self.peak:
                self.peak, self.at = now, f"op {self.ops} ({func})"
            return out

    device = torch.device("cpu")
    model = gpu.network(workload)
    data = gpu.Cycle(gpu.make_batches(workload, device), steps)
    if variant == "ember":
        import ember.train  # noqa: F401  (imports before the first reading)
    run = gpu.run_raw if variant == "raw" else gpu.run_ember
    amp = None if precision == "fp32" else precision
    before = in_use()
    mode = Peak()
    with mode:
        if variant == "raw":
            values = run(model, data, 1, amp, device)
        else:
            values = run(model, data, 1, amp, device, None)
    return {"peak_mib": (mode.peak - before) / 2**20, "at": mode.at, "ops": mode.ops, **values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="transformer,mlp")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--variants", default="raw,ember")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.steps)))
        return
    _in_use()  # fails here, once, where there is no mallinfo2
    print("| workload | precision | variant | peak MiB over the start | / raw | where |")
    print("|---|---|---|---:|---:|---|")
    for workload in args.workloads.split(","):
        for precision in args.precisions.split(","):
            raw = None
            for variant in args.variants.split(","):
                command = [sys.executable, __file__, "--child", variant, workload, precision]
                done = subprocess.run(
                    [*command, "--steps", str(args.steps)], capture_output=True, text=True
                )
                if done.returncode != 0:
                    tail = " / ".join(done.stderr.strip().splitlines()[-2:])
                    print(f"| {workload} | {precision} | {variant} | failed: {tail} | | |")
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                peak = result["peak_mib"]
                raw = peak if variant == "raw" else raw
                ratio = f"{peak / raw:.4f}" if raw else "–"
                print(
                    f"| {workload} | {precision} | {variant} | {peak:.1f} | {ratio} "
                    f"| {result['at']} |"
                )


if __name__ == "__main__":
    main()
