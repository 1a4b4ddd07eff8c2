"""ember on a CUDA GPU against a hand-written loop: fit time, host syncs, peak memory.

    python bench/gpu.py [--reps 3] [--steps 300] [--epochs 2] [--workloads mlp,resnet18,...]
                        [--variants raw,ember,...] [--snapshot DIR] [--out bench/results/gpu.md]

Workloads (`bench/gpu_workloads.py`), on synthetic batches made on the GPU before the
clock starts (16 distinct batches, cycled), no data loading: `mlp` (784-128-10, batch
64, float32), `resnet18` (batch 256, bf16 autocast), `transformer` (8 encoder layers,
d=512, 256 tokens, vocabulary 1,000, batch 32, bf16) and `lm8192` (the same with a
vocabulary of 8,192: logits dominate the step's memory, as a language model's do).

With `--snapshot DIR`, each process also records its CUDA allocations with their Python
stacks, writes PyTorch's snapshot (`DIR/<variant>-<workload>.pickle`, for
https://pytorch.org/memory_viz) and a summary of what was live at its peak by the line
that allocated it (`DIR/<variant>-<workload>.json`, `bench/gpu_memory.py`); the report
then shows, per workload, ember's peak against raw's by allocating line.

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

from gpu_workloads import WORKLOADS, Cycle, make_batches, network, settings

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
LR = 1e-3


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA (a CPU-only build)"
        raise SystemExit(
            "bench/gpu.py needs a CUDA device, and torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}, built with {built}). Run it on a machine with an "
            "NVIDIA GPU and a CUDA build of torch; bench/run.py measures the CPU."
        )


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


def child(
    variant: str, workload: str, steps: int, epochs: int, device_name: str, snapshot: str | None
) -> dict:
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
        if snapshot:
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
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
    if cuda and snapshot:
        write_snapshot(Path(snapshot), f"{variant}-{workload}")
    return {"fit_s": seconds, "syncs": syncs, "peak_mib": peak, **values}


def write_snapshot(directory: Path, name: str) -> None:
    """PyTorch's snapshot for memory_viz, and the summary of the peak by allocating line."""
    import torch
    from gpu_memory import peak_by_frame

    directory.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._dump_snapshot(str(directory / f"{name}.pickle"))
    summary = peak_by_frame(torch.cuda.memory._snapshot(), torch.cuda.current_device())
    (directory / f"{name}.json").write_text(json.dumps(summary, indent=1))
    torch.cuda.memory._record_memory_history(enabled=None)


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
    if args.snapshot:
        command += ["--snapshot", args.snapshot]
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
    if args.snapshot:
        lines += snapshot_tables(Path(args.snapshot), args.workloads, variants)
    return "\n".join(lines) + "\n"


def snapshot_tables(directory: Path, workloads: list[str], variants: list[str]) -> list[str]:
    """Per workload and ember variant: what was live at its peak against raw's, by line."""
    from gpu_memory import diff_table

    lines = ["", "## Where the peak memory goes (the last repetition's allocations)", ""]
    for workload in workloads:
        raw = directory / f"raw-{workload}.json"
        for variant in (v for v in variants if v.startswith("ember")):
            mine = directory / f"{variant}-{workload}.json"
            if raw.exists() and mine.exists():
                table = diff_table(json.loads(raw.read_text()), json.loads(mine.read_text()))
                lines += [f"### {workload}: {variant} against raw", "", table, ""]
    return lines


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
    parser.add_argument(
        "--snapshot", default=None, help="record allocations; write snapshots and summaries here"
    )
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, workload = args.child
        result = child(variant, workload, args.steps, args.epochs, args.device, args.snapshot)
        print(json.dumps(result))
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
