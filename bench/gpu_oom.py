"""grads_accumulation("auto") on a CUDA device whose memory is capped: the case that
once ended in an out-of-memory error instead of a smaller split.

    python bench/gpu_oom.py [--cap-gib 1.6] [--batch 16384] [--steps 4] [--out FILE]

An MLP 512-8192-8192-1 (float32, about 0.27 GiB of weights and as much of gradients)
trains `--steps` steps of one batch of `--batch` samples with SGD, the process capped
at `--cap-gib` GiB (`torch.cuda.set_per_process_memory_fraction`), with
`grads_accumulation("auto")` and `memory_history()`. It must finish; then the same
steps by hand, each batch cut into ember's final number of micro-batches, must give the
same weights. On an out-of-memory error the report quotes ember's notes: the part of
the step it came from, the split in effect, the largest live allocations by line.
Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import gc
import io
import sys
import tempfile
from pathlib import Path


def model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(512, 8192), nn.ReLU(), nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 1)
    )


def batches(device, batch: int, steps: int):
    import torch

    generator = torch.Generator(device=device).manual_seed(1)
    return [
        (
            torch.randn(batch, 512, device=device, generator=generator),
            torch.randn(batch, 1, device=device, generator=generator),
        )
        for _ in range(steps)
    ]


def with_ember(device, data) -> tuple[dict, int | None, str]:
    """ember's run: its final weights (on the CPU), its split, and what went wrong."""
    import torch
    import torch.nn.functional as F

    from ember.train import LearnerBuilder, RegressionOutput, TrainOutput
    from ember.train.renderer import PlainRenderer

    class Steps(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def train_step(self, batch):
            x, y = batch
            out = self.net(x)
            return TrainOutput(RegressionOutput(F.mse_loss(out, y), out, y))

    wrapped = Steps()
    learner = (
        LearnerBuilder(tempfile.mkdtemp(prefix="ember-oom-"))
        .devices([device])
        .grads_accumulation("auto")
        .memory_history()
        .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
        .build(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.01), 0.01)
    )
    try:
        learner.fit(data)
    except torch.OutOfMemoryError as error:
        notes = "\n".join(getattr(error, "__notes__", []))
        return {}, learner.optim.micro_split, f"{str(error).splitlines()[0]}\n{notes}"
    weights = {k: v.detach().cpu() for k, v in wrapped.net.state_dict().items()}
    return weights, learner.optim.micro_split, ""


def by_hand(device, data, split: int) -> dict:
    import torch
    import torch.nn.functional as F

    net = model().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    for x, y in data:
        for xs, ys in zip(torch.tensor_split(x, split), torch.tensor_split(y, split)):
            (F.mse_loss(net(xs), ys) * (len(xs) / len(x))).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().cpu() for k, v in net.state_dict().items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-gib", type=float, default=1.6)
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None, help="also write the report here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "bench/gpu_oom.py needs a CUDA device; torch.cuda.is_available() is False."
        )
    device = torch.device("cuda:0")
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / total, device)
    data = batches(device, args.batch, args.steps)
    weights, split, failure = with_ember(device, data)
    lines = [
        "## grads_accumulation('auto') under a memory cap",
        "",
        f"MLP 512-8192-8192-1, batch {args.batch}, SGD, {args.steps} steps, the process "
        f"capped at {args.cap_gib} GiB; {torch.cuda.get_device_name(device)}, torch "
        f"{torch.__version__}.",
        "",
    ]
    if failure:
        lines += [f"**FAILED** (split {split}):", "", "```", failure, "```"]
        code = 1
    else:
        gc.collect()
        torch.cuda.empty_cache()
        reference = by_hand(device, data, split or 1)
        diff = max((weights[k] - reference[k]).abs().max().item() for k in weights)
        equal = diff <= 1e-5
        lines.append(
            f"{'Finished' if equal else '**DIFFERS**'}: every batch split into {split} "
            f"micro-batches; largest weight difference from hand accumulation with that split "
            f"{diff:.3g} (at most 1e-5 expected)."
        )
        code = 0 if equal else 1
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
