"""ember against a raw DDP loop on several CPU processes (gloo), the standard recipe on
both sides: torchrun starts the processes, the script makes the process group, a torch
DataLoader reads a DistributedSampler's share.

    python bench/ddp_raw.py [--reps 3] [--processes 2] [--models mlp,cnn,mlp_fsdp] [--samples 65536]

Each measurement is a fresh `torchrun` launch of `python bench/ddp_raw.py --worker
SIDE MODEL`, the sides alternating (raw, ember, raw, ember, ...). A worker trains one
epoch, batch 32 per process, SGD, one torch thread per process, with Accuracy and Loss:
the raw loop keeps their sums on the device and all-reduces them once at the end, as a
careful hand-written loop does; ember's metrics do what they do. It times the epoch
(from before the first batch to the end of the metrics' reduction, rank 0's clock) and
counts the collectives torch.distributed is asked for during the steps (DDP's own
gradient all-reduce, made by its C++ reducer, is not among them: both sides have it).
The report: each side's best time, the ratio of the bests, the ratio of the best
times of the steps alone (from the end of the first step to the end of the last,
scaled to every step: what a longer epoch converges to, without the fixed costs of
the call to `fit`), and each side's collectives per step. A model named with `_fsdp` (`mlp_fsdp`) shards it with FSDP2 on both sides
(`fully_shard` on each linear and convolution layer, then the model; ember's
`devices(["cpu"], strategy="fsdp")` with the same units): the collectives then
include FSDP's own gathers and reductions, which both sides should count alike.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 32
LR = 0.05
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_object",
    "broadcast_object_list",
    "barrier",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
)


# The worker -------------------------------------------------------------------------------
def worker(side: str, model_name: str, samples: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    torch.set_num_threads(1)
    calls = {"count": 0}
    for name in COLLECTIVES:
        original = getattr(dist, name)

        def counted(*args, _original=original, **kwargs):
            calls["count"] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(samples, 1, 28, 28, generator=generator)
    targets = (images[:, 0, 10:18, 10:18].mean(dim=(1, 2)) * 10).long().clamp(max=9)
    data = TensorDataset(images, targets)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    torch.manual_seed(0)
    if model_name == "mlp":
        net: nn.Module = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10)
        )
    else:  # the guide's CNN
        net = nn.Sequential(
            nn.Conv2d(1, 8, 3),
            nn.ReLU(),
            nn.Conv2d(8, 16, 3),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((8, 8)),
            nn.Flatten(),
            nn.Linear(16 * 64, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )
    steps = len(loader)
    fsdp = side.endswith("fsdp")
    if side.startswith("raw"):
        if fsdp:  # FSDP2: each linear layer a unit, then the whole model
            from torch.distributed.fsdp import fully_shard

            for module in net:
                if isinstance(module, (nn.Linear, nn.Conv2d)):
                    fully_shard(module)
            model = fully_shard(net)
        else:
            model = nn.parallel.DistributedDataParallel(net)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        sampler.set_epoch(1)
        dist.barrier()
        start, before = time.perf_counter(), calls["count"]
        sums = torch.zeros(3)  # loss * n, correct, n
        first = None
        for inputs, labels in loader:
            logits = model(inputs)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                n = labels.shape[0]
                sums += torch.stack(
                    [loss.detach() * n, (logits.argmax(1) == labels).sum(), torch.tensor(n)]
                )
            first = first if first is not None else time.perf_counter()
        stepping = (time.perf_counter() - first) * steps / (steps - 1)
        during = calls["count"] - before
        dist.all_reduce(sums)
        elapsed = time.perf_counter() - start
        loss_value = (sums[0] / sums[2]).item()
    else:
        import ember
        from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
        from ember.train.metric import AccuracyMetric, LossMetric
        from ember.train.renderer import PlainRenderer

        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def classify(self, batch):
                inputs, labels = batch
                logits = self.net(inputs)
                return ClassificationOutput(F.cross_entropy(logits, labels), logits, labels)

            def train_step(self, batch):
                return TrainOutput(self.classify(batch))

        class Window:
            """The collectives between the first step and the last."""

            def __init__(self) -> None:
                self.first = self.last = 0
                self.started = self.ended = 0.0

            def on_event(self, event) -> None:
                iteration = getattr(event, "iteration", None)
                if getattr(event, "split", None) == "train" and iteration is not None:
                    if iteration == 1:
                        self.first, self.started = calls["count"], time.perf_counter()
                    if iteration == steps:
                        self.last, self.ended = calls["count"], time.perf_counter()

        window = Window()
        directory = tempfile.mkdtemp(prefix="ember-ddp-bench-") if rank == 0 else "unused"
        directory = [directory]
        dist.broadcast_object_list(directory, src=0)
        builder = LearnerBuilder(directory[0])
        if fsdp:  # the same units as the raw loop's
            builder = builder.devices(["cpu"], strategy="fsdp", modules=(nn.Linear, nn.Conv2d))
        learner = (
            builder.metric_train_numeric(LossMetric())
            .metric_train(AccuracyMetric())
            .num_epochs(1)
            .listener(window)
            .renderer(PlainRenderer(interval=3600))
            .build(Model(), torch.optim.SGD(net.parameters(), lr=LR))
        )
        ember.seed(0)
        dist.barrier()
        start = time.perf_counter()
        learner.fit(loader)
        elapsed = time.perf_counter() - start
        during = (window.last - window.first) * steps / max(1, steps - 1)
        stepping = (window.ended - window.started) * steps / (steps - 1)
        loss_value = learner.history[-1][1]["train"]["Loss"]
    if rank == 0:
        print(
            json.dumps(
                {
                    "side": side,
                    "model": model_name,
                    "seconds": elapsed,
                    "stepping": stepping,
                    "steps": steps,
                    "collectives_per_step": during / steps,
                    "loss": loss_value,
                }
            )
        )
    dist.destroy_process_group()


# The launches -----------------------------------------------------------------------------
def launch(side: str, model: str, processes: int, samples: int) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(processes),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(Path(__file__).resolve()),
        "--worker",
        side,
        model,
        "--samples",
        str(samples),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{side} {model} failed:\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=2, metavar=("SIDE", "MODEL"))
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--models", default="mlp,cnn,mlp_fsdp")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.samples)
        return
    print(
        f"ember against a raw DDP loop: {args.processes} CPU processes (gloo), one torch "
        f"thread each, {args.samples} samples, batch {BATCH} per process, one epoch with "
        f"Accuracy and Loss; best of {args.reps} fresh torchrun launches per side, "
        "alternating\n"
    )
    print(
        "| model | raw best (s) | ember best (s) | ember / raw | raw median | ember median "
        "| steps only: ember / raw | collectives per step: raw | ember |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in args.models.split(","):
        suffix = "_fsdp" if model.endswith("_fsdp") else ""
        model = model.removesuffix("_fsdp")
        runs: dict[str, list[dict]] = {"raw": [], "ember": []}
        for _ in range(args.reps):
            for side in ("raw", "ember"):
                runs[side].append(launch(side + suffix, model, args.processes, args.samples))
        model += suffix.replace("_", ", ")
        best = {side: min(run["seconds"] for run in rows) for side, rows in runs.items()}
        median = {
            side: statistics.median(r["seconds"] for r in rows) for side, rows in runs.items()
        }
        calls = {side: rows[-1]["collectives_per_step"] for side, rows in runs.items()}
        steady = {side: min(run["stepping"] for run in rows) for side, rows in runs.items()}
        print(
            f"| {model} | {best['raw']:.3f} | {best['ember']:.3f} | "
            f"{best['ember'] / best['raw']:.3f} | {median['raw']:.3f} | {median['ember']:.3f} "
            f"| {steady['ember'] / steady['raw']:.3f} "
            f"| {calls['raw']:.2f} | {calls['ember']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
