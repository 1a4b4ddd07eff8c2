"""ember on a CUDA GPU against a hand-written loop: fit time, host syncs, peak memory.

    python bench/gpu.py [--reps 3] [--steps 300] [--epochs 2] [--workloads mlp,resnet18,transformer]
                        [--variants raw,ember,...] [--out bench/results/gpu.md]

Workloads, on synthetic batches made on the GPU before the clock starts (16 distinct
batches, cycled), no data loading:

- `mlp`: MLP 784-128-10, batch 64, float32.
- `resnet18`: ResNet-18 on 3x32x32 images, 10 classes, batch 256, bf16 autocast
  (torchvision's when installed, else the same network defined here).
- `transformer`: 8 encoder layers, d=512, 8 heads, feed-forward 2048, 256 tokens,
  vocabulary 1,000, batch 32, bf16 autocast; a token-level classification loss.

Variants, each in a fresh process, the variants of a workload alternating and their
order rotating between repetitions:

- `raw`: the hand-written loop; accuracy and loss summed on the device, read once per
  epoch.
- `ember`: ember's defaults with Accuracy and Loss on the training split (per-iteration
  metric files, the plain renderer with a one-hour interval).
- `ember_<Recorder>`: the same, plus a checkpoint per epoch with that recorder
  (`ember_CompactRecorder`, ...; the JSON recorders only when named in --variants).
- `lightning_min`: Lightning's `Trainer` without logger, checkpointing, progress bar or
  model summary; accuracy and loss logged per step and epoch (only if installed).

Each process times `--epochs` epochs of `--steps` steps from the first step to the end
of fit (synchronised), counts host synchronisations with
`torch.cuda.set_sync_debug_mode("warn")` (one warning per synchronising call) plus every
`torch.cuda.Event.synchronize()` over the same span, and reads `torch.cuda.max_memory_allocated()`. Reported: medians, fit time
over the raw loop's paired by repetition, syncs per epoch, peak memory over raw's.
Needs a CUDA device; it says so and stops without one.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

WORKLOADS = ("mlp", "resnet18", "transformer")
RECORDERS = (
    "DefaultRecorder",
    "CompactRecorder",
    "SensitiveCompactRecorder",
    "BinFileRecorder",
    "BinGzFileRecorder",
    "SafetensorsFileRecorder",
)
SLOW_RECORDERS = ("PrettyJsonFileRecorder", "JsonGzFileRecorder")
BASE_VARIANTS = ("raw", "ember", *(f"ember_{name}" for name in RECORDERS), "lightning_min")
DISTINCT_BATCHES = 16
LR = 1e-3
VOCAB, TOKENS, D_MODEL = 1000, 256, 512


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA (a CPU-only build)"
        raise SystemExit(
            "bench/gpu.py needs a CUDA device, and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, built with {built}). Run it on a machine with an "
            "NVIDIA GPU and a CUDA build of torch; bench/run.py measures the CPU."
        )


# Workloads -----------------------------------------------------------------------------
def resnet18():
    """torchvision's ResNet-18 (10 classes), or the same network defined here."""
    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=10)
    except ImportError:
        pass
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
            return (out + (x if self.down is None else self.down(x))).relu()

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    for cin, cout, stride in ((64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10)]
    return nn.Sequential(*layers)


def network(workload: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    if workload == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    if workload == "resnet18":
        return resnet18()

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, D_MODEL)
            layer = nn.TransformerEncoderLayer(D_MODEL, 8, 2048, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 8, enable_nested_tensor=False)
            self.head = nn.Linear(D_MODEL, VOCAB)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens))).reshape(-1, VOCAB)

    return Encoder()


def settings(workload: str) -> tuple[int, str | None]:
    """Batch size and mixed precision of a workload."""
    return {"mlp": (64, None), "resnet18": (256, "bf16"), "transformer": (32, "bf16")}[workload]


def make_batches(workload: str, device):
    """Distinct (inputs, targets) batches on the device; targets are per row of the
    network's output (per token for the transformer)."""
    import torch

    batch, _ = settings(workload)
    generator = torch.Generator(device=device).manual_seed(1)
    out = []
    for _ in range(DISTINCT_BATCHES):
        if workload == "mlp":
            inputs = torch.randn(batch, 28, 28, device=device, generator=generator)
            targets = torch.randint(0, 10, (batch,), device=device, generator=generator)
        elif workload == "resnet18":
            inputs = torch.randn(batch, 3, 32, 32, device=device, generator=generator)
            targets = torch.randint(0, 10, (batch,), device=device, generator=generator)
        else:
            inputs = torch.randint(0, VOCAB, (batch, TOKENS), device=device, generator=generator)
            targets = torch.randint(0, VOCAB, (batch * TOKENS,), device=device, generator=generator)
        out.append((inputs, targets))
    return out


class Cycle:
    """`steps` batches per epoch, cycling through the distinct ones."""

    def __init__(self, batches, steps: int) -> None:
        self.batches, self.steps = batches, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return (self.batches[i % len(self.batches)] for i in range(self.steps))


# Variants ------------------------------------------------------------------------------
def run_raw(model, data, epochs: int, precision: str | None, device) -> dict:
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    values = {}
    for _ in range(epochs):
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        seen = 0
        for inputs, targets in data:
            with autocast:
                logits = model(inputs)
                loss = F.cross_entropy(logits, targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                loss_sum += loss.detach() * targets.shape[0]
                correct += (logits.argmax(dim=1) == targets).sum()
            seen += targets.shape[0]
        values = {"loss": loss_sum.item() / seen, "accuracy": 100.0 * correct.item() / seen}
    return values


def run_ember(model, data, epochs: int, precision: str | None, device, recorder: str | None):
    import torch
    import torch.nn.functional as F

    import ember.record
    from ember.train import ClassificationOutput, LearnerBuilder, TrainOutput
    from ember.train.metric import AccuracyMetric, LossMetric
    from ember.train.renderer import PlainRenderer

    class Steps(torch.nn.Module):
        def __init__(self, net) -> None:
            super().__init__()
            self.net = net

        def train_step(self, batch):
            inputs, targets = batch
            logits = self.net(inputs)
            item = ClassificationOutput(F.cross_entropy(logits, targets), logits, targets)
            return TrainOutput(item)

    wrapped = Steps(model)
    builder = (
        LearnerBuilder(tempfile.mkdtemp(prefix="ember-gpu-"))
        .metric_train_numeric(AccuracyMetric())
        .metric_train_numeric(LossMetric())
        .renderer(PlainRenderer(interval=3600.0, stream=io.StringIO()))
        .devices([device])
        .num_epochs(epochs)
    )
    if precision is not None:
        builder = builder.mixed_precision(precision)
    if recorder is not None:
        builder = builder.with_file_checkpointer(getattr(ember.record, recorder)())
    learner = builder.build(wrapped, torch.optim.Adam(wrapped.parameters(), lr=LR), LR)
    learner.fit(data)
    _, values = learner.history[-1]
    return {"loss": values["train"]["Loss"], "accuracy": values["train"]["Accuracy"]}


def run_lightning(model, data, epochs: int, precision: str | None, device) -> dict:
    import lightning as L
    import torch
    import torch.nn.functional as F

    class Module(L.LightningModule):
        def __init__(self, net) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            logits = self.net(inputs)
            loss = F.cross_entropy(logits, targets)
            acc = (logits.argmax(dim=1) == targets).float().mean()
            self.log_dict({"loss": loss, "acc": acc}, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=LR)

    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        max_epochs=epochs,
        precision="bf16-mixed" if precision == "bf16" else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-gpu-"),
    )
    trainer.fit(Module(model), data)
    metrics = trainer.callback_metrics
    return {"loss": float(metrics["loss_epoch"]), "accuracy": 100.0 * float(metrics["acc_epoch"])}


def child(variant: str, workload: str, steps: int, epochs: int, device_name: str) -> dict:
    """One measurement (in its own process); returns what the parent reports."""
    import torch

    device = torch.device(device_name)
    if device.type == "cuda":
        require_cuda()
    if variant == "lightning_min":
        import lightning  # noqa: F401  (before the clock, like the other imports)
    elif variant != "raw":
        import ember.train  # noqa: F401
    model = network(workload).to(device)
    _, precision = settings(workload)
    data = Cycle(make_batches(workload, device), steps)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    waits = [0]
    if cuda:  # waits on events are synchronisations too; the debug mode may not see them
        event_wait = torch.cuda.Event.synchronize

        def counted(event: Any) -> None:
            waits[0] += 1
            event_wait(event)

        torch.cuda.Event.synchronize = counted  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        start = time.perf_counter()
        try:
            if variant == "raw":
                values = run_raw(model, data, epochs, precision, device)
            elif variant == "lightning_min":
                values = run_lightning(model, data, epochs, precision, device)
            else:
                recorder = variant.removeprefix("ember_") if variant != "ember" else None
                values = run_ember(model, data, epochs, precision, device, recorder)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
                torch.cuda.Event.synchronize = event_wait  # type: ignore[method-assign]
    syncs = waits[0] + sum("synchronizing" in str(w.message) for w in caught)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan")
    return {"fit_s": seconds, "syncs": syncs, "peak_mib": peak, **values}


# The parent ----------------------------------------------------------------------------
def available(variant: str) -> bool:
    if variant == "lightning_min":
        import importlib.util

        return importlib.util.find_spec("lightning") is not None
    if variant == "ember_SafetensorsFileRecorder":
        import importlib.util

        return importlib.util.find_spec("safetensors") is not None
    return True


def measure(variant: str, workload: str, args) -> dict:
    command = [sys.executable, __file__, "--child", variant, workload]
    command += ["--steps", str(args.steps), "--epochs", str(args.epochs), "--device", args.device]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": " / ".join(tail)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict, args, variants: list[str]) -> str:
    import torch

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    lines = [
        "# ember on a GPU",
        "",
        f"Device: {name}; torch {torch.__version__}. {args.epochs} epochs of {args.steps} "
        f"steps per run, {args.reps} repetition(s), each run a fresh process, variants "
        "alternating. Command: `python bench/gpu.py " + " ".join(sys.argv[1:]) + "`",
        "",
        "| workload | variant | fit s (median) | fit / raw (paired median, min–max) "
        "| host syncs per epoch | peak MiB | peak / raw | train loss | train acc % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in args.workloads:
        raw = results.get((workload, "raw"), [])
        for variant in variants:
            runs = results.get((workload, variant), [])
            errors = [r["error"] for r in runs if "error" in r]
            if not runs or errors:
                error = errors[0] if errors else "not run"
                lines.append(f"| {workload} | {variant} | failed: {error[:120]} |||||||")
                continue
            fit = statistics.median(r["fit_s"] for r in runs)
            ratios = [r["fit_s"] / b["fit_s"] for r, b in zip(runs, raw) if "fit_s" in b]
            ratio = (
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f})"
                if ratios
                else "–"
            )
            syncs = statistics.median(r["syncs"] for r in runs) / args.epochs
            peak = statistics.median(r["peak_mib"] for r in runs)
            raw_peak = statistics.median(b["peak_mib"] for b in raw) if raw else float("nan")
            last = runs[-1]
            lines.append(
                f"| {workload} | {variant} | {fit:.3f} | {ratio} | {syncs:g} | {peak:.0f} | "
                f"{peak / raw_peak:.3f} | {last['loss']:.4f} | {last['accuracy']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="training steps per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--variants",
        default=",".join(BASE_VARIANTS),
        help="comma-separated; also ember_PrettyJsonFileRecorder, ember_JsonGzFileRecorder",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        help="cuda (default); 'cpu' only checks the harness itself (no syncs or memory)",
    )
    parser.add_argument("--out", default="bench/results/gpu.md")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, workload = args.child
        print(json.dumps(child(variant, workload, args.steps, args.epochs, args.device)))
        return
    if args.device.startswith("cuda"):
        require_cuda()
    args.workloads = [w for w in args.workloads.split(",") if w]
    known = (*BASE_VARIANTS, *(f"ember_{name}" for name in SLOW_RECORDERS))
    variants = [v for v in args.variants.split(",") if v]
    for name in [*args.workloads, *variants]:
        if name not in (*WORKLOADS, *known):
            raise SystemExit(f"unknown workload or variant {name!r}; known: {WORKLOADS}, {known}")
    if "raw" not in variants:
        variants.insert(0, "raw")
    variants = [v for v in variants if available(v)]
    results: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.reps):
        for workload in args.workloads:
            shift = rep % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                result = measure(variant, workload, args)
                results.setdefault((workload, variant), []).append(result)
                shown = result.get("error") or f"{result['fit_s']:.3f} s, {result['syncs']} syncs"
                print(f"rep {rep + 1} {workload} {variant}: {shown}", flush=True)
    text = report(results, args, variants)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
