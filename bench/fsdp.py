"""Memory per process and step time of a small transformer under DDP, FSDP and HSDP
(CPU, gloo).

    python bench/fsdp.py [--layers 4] [--worlds 2 4] [--steps 8] [--cap-mib 64]
        [--hsdp-world 4 --shard-size 2]

Each run is a fresh `python bench/fsdp.py --run STRATEGY N` process; ember starts the
other N - 1 processes itself. The model is a language model of `--layers` transformer
encoder layers (d_model 256, 4 heads, feed-forward 1024, vocabulary 1000), trained with
Adam; under FSDP each encoder layer is a unit of its own. Every process measures, after
the backward of each step (gradients present, optimizer state from the steps before),
the bytes of the tensors it holds for its parameters, their gradients and the
optimizer state (local shards under FSDP), and the wall time of each step. The report
gives the bytes per process (the largest over the ranks, at the last step), the ratio
FSDP / DDP, the step-time ratio (median step time, the first two steps left out), and
the largest model of the family (number of layers) whose parameters, gradients and
optimizer state fit `--cap-mib` per process under each strategy: the bytes measured
per parameter, times the parameters of each family member. Activations and the
parameters FSDP gathers for one layer at a time come on top of these figures.

A second table compares the three strategies on `--hsdp-world` processes, HSDP with
shard groups of `--shard-size` (a 2 x 2 mesh by default: two copies of the model, each
sharded over two processes): the bytes of the parameters, the gradients and the
optimizer state per process, each apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

D_MODEL, HEADS, FEED, VOCAB, SEQUENCE = 256, 4, 1024, 1000, 32


def family_parameters(layers: int) -> int:
    """Parameters of the family member with `layers` encoder layers."""
    attention = 4 * D_MODEL * D_MODEL + 4 * D_MODEL
    feed_forward = 2 * D_MODEL * FEED + FEED + D_MODEL
    norms = 4 * D_MODEL
    embedding, head = VOCAB * D_MODEL, D_MODEL * VOCAB + VOCAB
    return embedding + head + layers * (attention + feed_forward + norms)


def held_bytes(model, optimizer) -> dict[str, int]:
    import torch

    def local(tensor):
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    params = list(model.parameters())
    sizes = {
        "params": sum(local(p).nbytes for p in params),
        "grads": sum(local(p.grad).nbytes for p in params if p.grad is not None),
        "optimizer": sum(
            local(value).nbytes
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor)
        ),
    }
    return sizes


def run(strategy: str, processes: int, layers: int, steps: int, shard_size: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import ember
    from ember.data import DataLoaderBuilder
    from ember.train import LearnerBuilder, TrainOutput
    from ember.train.events import ProcessedItem
    from ember.train.renderer import PlainRenderer

    torch.set_num_threads(1)
    ember.seed(0)

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(D_MODEL, HEADS, FEED, dropout=0.0, batch_first=True)
                for _ in range(layers)
            )
            self.head = nn.Linear(D_MODEL, VOCAB)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

        def train_step(self, tokens):
            logits = self(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            return TrainOutput(loss, loss=loss)

    class Meter:
        def __init__(self) -> None:
            self.learner = None
            self.times: list[float] = []
            self.sizes: dict[str, int] = {}

        def on_event(self, event) -> None:
            if isinstance(event, ProcessedItem) and event.split == "train":
                self.times.append(time.perf_counter())
                self.sizes = held_bytes(self.learner.model, self.learner.optimizer)

    global_batch = 16
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (global_batch * steps, SEQUENCE + 1), generator=generator)
    loader = DataLoaderBuilder().batch_size(global_batch // processes).build(list(tokens))
    shared = os.environ.setdefault("EMBER_BENCH_DIR", tempfile.mkdtemp())
    meter = Meter()
    model = LanguageModel()
    options: dict = {}
    if strategy != "ddp":
        options = {"strategy": strategy, "modules": [nn.TransformerEncoderLayer]}
    if strategy == "hsdp":
        options["shard_size"] = shard_size
    learner = (
        LearnerBuilder(Path(shared) / "run", overwrite=True)
        .devices(["cpu"] * processes, timeout=600, **options)
        .listener(meter)
        .renderer(PlainRenderer(interval=3600))
        .build(model, torch.optim.Adam(model.parameters(), 1e-3), 1e-3)
    )
    meter.learner = learner
    learner.fit(loader)
    rank = int(os.environ.get("RANK", "0"))
    step_times = [b - a for a, b in zip(meter.times, meter.times[1:])][1:]
    result = {
        "rank": rank,
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": meter.sizes,
        "step": statistics.median(step_times),
    }
    Path(shared, f"rank-{rank}.json").write_text(json.dumps(result))


def measure(
    strategy: str, processes: int, layers: int, steps: int, shard_size: int = 2
) -> list[dict]:
    with tempfile.TemporaryDirectory() as shared:
        subprocess.run(
            [sys.executable, __file__, "--run", strategy, str(processes), "--layers", str(layers)]
            + ["--steps", str(steps), "--shard-size", str(shard_size)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "EMBER_BENCH_DIR": shared},
        )
        return [json.loads(Path(shared, f"rank-{r}.json").read_text()) for r in range(processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", nargs=2, default=None, metavar=("STRATEGY", "PROCESSES"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--cap-mib", type=float, default=64.0)
    parser.add_argument("--hsdp-world", type=int, default=4)
    parser.add_argument("--shard-size", type=int, default=2)
    args = parser.parse_args()
    if args.run is not None:
        run(args.run[0], int(args.run[1]), args.layers, args.steps, args.shard_size)
        return
    runs: dict[tuple[str, int], list[dict]] = {}

    def runs_of(strategy: str, world: int) -> list[dict]:
        if (strategy, world) not in runs:
            runs[strategy, world] = measure(
                strategy, world, args.layers, args.steps, args.shard_size
            )
        return runs[strategy, world]

    cap = args.cap_mib * 2**20
    parameters = family_parameters(args.layers)
    print(
        f"Transformer LM, {args.layers} layers, {parameters:,} parameters, Adam, global batch "
        f"16 x {SEQUENCE} tokens, {args.steps} steps; bytes of parameters + gradients + "
        "optimizer state per process (the largest over the ranks):"
    )
    print(
        "| processes | DDP MiB | FSDP MiB | FSDP / DDP | 1 / processes | step time FSDP / DDP "
        f"| layers within {args.cap_mib:g} MiB: DDP | FSDP |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in args.worlds:
        both = {s: runs_of(s, world) for s in ("ddp", "fsdp")}
        assert all(r["parameters"] == parameters for rs in both.values() for r in rs)
        held = {s: max(sum(r["bytes"].values()) for r in rs) for s, rs in both.items()}
        step = {s: statistics.median(r["step"] for r in rs) for s, rs in both.items()}
        fits = {}
        for strategy, total in held.items():
            per_parameter = total / parameters
            layers = 0
            while family_parameters(layers + 1) * per_parameter <= cap:
                layers += 1
            fits[strategy] = f"{layers} ({family_parameters(layers) / 1e6:.1f} M)"
        print(
            f"| {world} | {held['ddp'] / 2**20:.2f} | {held['fsdp'] / 2**20:.2f} | "
            f"{held['fsdp'] / held['ddp']:.3f} | {1 / world:.3f} | "
            f"{step['fsdp'] / step['ddp']:.2f} | {fits['ddp']} | {fits['fsdp']} |"
        )

    hybrid(args, runs_of)


def hybrid(args: argparse.Namespace, runs_of: Any) -> None:
    """The table of DDP, FSDP and HSDP on `--hsdp-world` processes, bytes by kind."""
    world, shard = args.hsdp_world, args.shard_size
    print()
    print(
        f"{world} processes; HSDP: {world // shard} copies of the model, each sharded over "
        f"{shard} processes. MiB per process (the largest over the ranks):"
    )
    print(
        "| strategy | parameters | gradients | optimizer state | total | / DDP | step time / DDP |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    ddp = runs_of("ddp", world)
    ddp_total = max(sum(r["bytes"].values()) for r in ddp)
    ddp_step = statistics.median(r["step"] for r in ddp)
    for strategy in ("ddp", "fsdp", "hsdp"):
        measured = runs_of(strategy, world)
        largest = max(measured, key=lambda r: sum(r["bytes"].values()))["bytes"]
        total = sum(largest.values())
        step = statistics.median(r["step"] for r in measured)
        kinds = " | ".join(f"{largest[k] / 2**20:.2f}" for k in ("params", "grads", "optimizer"))
        print(
            f"| {strategy.upper()} | {kinds} | {total / 2**20:.2f} | {total / ddp_total:.3f} | "
            f"{step / ddp_step:.2f} |"
        )


if __name__ == "__main__":
    main()
