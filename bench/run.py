"""ember against a hand-written loop, Lightning and Keras, on one CPU workload.

    python bench/run.py [--reps 5] [--quick] [--out bench/results/latest.md]
                        [--threads 1] [--variants raw,ember,...] [--models mlp,cnn]

Every measurement is a fresh process (`bench/worker.py`), started round-robin: each
repetition runs every (model, variant) once, the variant order rotating between
repetitions, so slow drift of the machine falls on all variants alike. Workload:
60,000 synthetic MNIST-shaped samples (uint8 28x28, seeded) as a map-style dataset,
batch 64, num_workers=0, one training epoch, then validation on 10,000 samples;
models: MLP 784-128-10 and the guide's small CNN (dropout 0.5). Adam, lr 1e-3.

Also times `python -c "import ember"` against `python -c "import torch"`
(alternating, median of --import-runs each).

Writes a Markdown report to --out (and its raw numbers next to it as .json); a full
run (not --quick) also writes the report to bench/RESULTS.md. `--quick` is a smoke
test: 1 repetition, 6,000 training and 1,000 validation samples.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from worker import MODELS, VARIANTS  # noqa: E402  (worker imports nothing heavy at module level)

TARGETS = {"mlp": 1.05, "cnn": 1.02}  # ember defaults / raw, ratio of median fit times
IMPORT_TARGET_S = 0.15
RSS_TARGET = 1.05


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        KERAS_BACKEND="torch",
        PYTHONHASHSEED="0",
        # Byte-code caches of every module (torch, ember, ...) under bench/results/,
        # so no process pays for compiling sources and nothing is written under src/.
        PYTHONPYCACHEPREFIX=str(BENCH / "results" / "pycache"),
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def machine(threads: int) -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    probe = (
        "import importlib.metadata as m, importlib.util as u, json, numpy, torch\n"
        "out = {'torch': torch.__version__, 'numpy': numpy.__version__}\n"
        "for name in ('ember', 'lightning', 'keras'):\n"
        "    if u.find_spec(name) is not None:\n"
        "        out[name] = m.version(name)\n"
        "print(json.dumps(out))\n"
    )
    versions = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu,
        "cores": f"{os.cpu_count()} logical ({len(os.sched_getaffinity(0))} usable by this process)",
        "memory": mem,
        "python": platform.python_version(),
        "os": platform.platform(),
        "threads": f"torch.set_num_threads({threads}), OMP_NUM_THREADS={threads}; DataLoader num_workers=0",
        **{name: version for name, version in versions.items()},
    }


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


# Import time ---------------------------------------------------------------------------
def time_import(statement: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], env=env, check=True, cwd=ROOT)
    return time.perf_counter() - start


def import_times(runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    statements = {"torch": "import torch", "ember": "import ember", "ember.train": "import ember.train"}
    for statement in statements.values():  # warm the byte-code cache and the page cache
        time_import(statement, env)
    times: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(runs):
        for name, statement in statements.items():
            times[name].append(time_import(statement, env))
    return times


# Training runs ---------------------------------------------------------------------------
def run_worker(variant: str, model: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    command = [
        sys.executable, str(BENCH / "worker.py"), variant, model,
        "--train", str(args.train), "--valid", str(args.valid), "--threads", str(args.threads),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"variant"')]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        raise SystemExit(f"{variant}/{model} failed (exit {done.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    result["process_s"] = wall
    return result


def rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


# Report ------------------------------------------------------------------------------------
def fmt_range(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def summarize(results: list[dict], variants: list[str], models: list[str]) -> tuple[list[str], dict]:
    rows = [
        "| model | variant | fit s (median) | fit min–max | fit / raw | process s (median) | "
        "peak RSS MiB (median) | RSS / raw | train loss | valid acc % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    stats: dict = {}
    for model in models:
        by_variant = {v: [r for r in results if r["model"] == model and r["variant"] == v] for v in variants}
        raw = by_variant.get("raw") or []
        raw_fit = statistics.median(r["fit_s"] for r in raw) if raw else None
        raw_rss = statistics.median(r["maxrss_mb"] for r in raw) if raw else None
        for variant in variants:
            runs = by_variant[variant]
            if not runs:
                continue
            fits = [r["fit_s"] for r in runs]
            fit = statistics.median(fits)
            rss = statistics.median(r["maxrss_mb"] for r in runs)
            ratio = fit / raw_fit if raw_fit else None
            rss_ratio = rss / raw_rss if raw_rss else None
            stats[(model, variant)] = {"fit": fit, "ratio": ratio, "rss": rss, "rss_ratio": rss_ratio}
            rows.append(
                f"| {model} | {variant} | {fit:.3f} | {fmt_range(fits, 3)} | "
                f"{'%.3f' % ratio if ratio else '–'} | {statistics.median(r['process_s'] for r in runs):.2f} | "
                f"{rss:.0f} | {'%.3f' % rss_ratio if rss_ratio else '–'} | "
                f"{statistics.median(r['train_loss'] for r in runs):.4f} | "
                f"{statistics.median(r['valid_acc'] for r in runs):.2f} |"
            )
    return rows, stats


def report(args, info, results, imports, stats_rows, stats, load_before, load_after, command, elapsed) -> str:
    lines = [
        "# ember benchmark",
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; "
        f"the whole run took {elapsed / 60:.1f} min.",
        "",
        "## Machine",
        "",
    ]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    lines += [
        f"- load average before: {load_before}",
        f"- load average after: {load_after}",
        "",
        "## Workload",
        "",
        f"{args.train:,} synthetic MNIST-shaped training samples (uint8 28x28 from a seeded generator, "
        f"labels from a fixed patch rule with 10% label noise) and {args.valid:,} validation samples, "
        "map-style dataset, batch 64, seeded shuffle (ResumableSampler order), num_workers=0; "
        "one training epoch then one validation pass; Adam (lr 1e-3, eps 1e-8); "
        "MLP 784-128-10 and the guide's CNN (two 3x3 convolutions, adaptive average pooling to "
        "8x8, 1024-512-10, dropout 0.5). "
        f"{args.reps} repetition(s); each repetition runs every (model, variant) once in a fresh "
        "process, round-robin, the variant order rotating between repetitions.",
        "",
        "- `raw`: hand-written loop (accuracy and loss accumulated on the device, read once per "
        "split; nothing written per iteration), validation under `inference_mode` in eval mode.",
        "- `ember`: Accuracy and Loss on train and valid, per-iteration metric files (always on), "
        "plain renderer with a 3600 s interval, no checkpointer.",
        "- `ember_ckpt`: `ember` plus `with_file_checkpointer(CompactRecorder())`, a checkpoint per epoch.",
        "- `lightning_min`: `Trainer(max_epochs=1, logger=False, enable_checkpointing=False, "
        "enable_progress_bar=False, enable_model_summary=False)`; accuracy and loss via "
        "`self.log_dict(..., on_step=True, on_epoch=True, prog_bar=True)` in training and "
        "`self.log_dict` in validation.",
        "- `lightning_default`: `Trainer(max_epochs=1)`: its default logger, checkpoint, "
        "progress bar (to a pipe, not a TTY) and model summary; same logging.",
        "- `keras`: Keras 3 with `KERAS_BACKEND=torch`, `model.fit(train, validation_data=valid, "
        "epochs=1)` with the `accuracy` metric on the same DataLoaders (its own weight init).",
        "",
        "`fit s` runs from just before the first batch (the call to fit, or the raw loop) to the "
        "end of validation; imports, data generation, model and trainer construction are outside "
        "it. `process s` is the whole process, start to exit, measured by the parent. Peak RSS is "
        "`getrusage(RUSAGE_SELF).ru_maxrss` of the process. Ratios are ratios of medians. "
        "Train loss is the epoch's sample-weighted mean (Keras: its running mean).",
        "",
        "## Results",
        "",
        *stats_rows,
        "",
    ]
    torch_med = statistics.median(imports["torch"])
    ember_med = statistics.median(imports["ember"])
    train_med = statistics.median(imports["ember.train"])
    lines += [
        f"## Import time (median of {len(imports['torch'])} alternating runs each, whole `python -c` process)",
        "",
        "| statement | median s | min–max s | over `import torch` |",
        "|---|---:|---:|---:|",
        f"| `import torch` | {torch_med:.3f} | {fmt_range(imports['torch'], 3)} | – |",
        f"| `import ember` | {ember_med:.3f} | {fmt_range(imports['ember'], 3)} | {ember_med - torch_med:+.3f} |",
        f"| `import ember.train` | {train_med:.3f} | {fmt_range(imports['ember.train'], 3)} | {train_med - torch_med:+.3f} |",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---:|:---:|",
    ]
    for model, limit in TARGETS.items():
        entry = stats.get((model, "ember"))
        if entry and entry["ratio"]:
            lines.append(f"| ember / raw fit time, {model} <= {limit:.2f} | {entry['ratio']:.3f} | {'yes' if entry['ratio'] <= limit else 'no'} |")
    difference = ember_med - torch_med
    lines.append(f"| `import ember` adds <= {IMPORT_TARGET_S:.2f} s over `import torch` | {difference:+.3f} s | {'yes' if difference <= IMPORT_TARGET_S else 'no'} |")
    for model in TARGETS:
        entry = stats.get((model, "ember"))
        if entry and entry["rss_ratio"]:
            lines.append(f"| ember peak RSS within 5% of raw, {model} | {entry['rss_ratio']:.3f} | {'yes' if entry['rss_ratio'] <= RSS_TARGET else 'no'} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions (each runs every variant once); >= 5 unless --quick")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 repetition, 6,000 samples")
    parser.add_argument("--out", default=str(BENCH / "results" / "latest.md"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every process (default 1)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--import-runs", type=int, default=9)
    args = parser.parse_args(argv)
    command = "python bench/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    variants = [v for v in args.variants.split(",") if v]
    models = [m for m in args.models.split(",") if m]
    for name in variants:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    for name in models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if args.quick:
        args.reps, args.train, args.valid, args.import_runs = 1, 6_000, 1_000, 3
    else:
        args.train, args.valid = 60_000, 10_000
        if args.reps < 5:
            parser.error("--reps must be >= 5 for a full run (use --quick for a smoke test)")

    started = time.perf_counter()
    load_before = loadavg()
    env = child_env(args.threads)
    (BENCH / "results").mkdir(exist_ok=True)
    info = machine(args.threads)
    print(f"machine: {info['cpu']}, {info['cores']}; load {load_before}", flush=True)

    # Warm the byte-code cache for every framework, so the first repetition is like the rest.
    subprocess.run([sys.executable, "-c", "import ember.train, ember.record, lightning, keras"], env=env, cwd=ROOT, check=False, capture_output=True)
    imports = import_times(args.import_runs, env)
    print("import medians: " + ", ".join(f"{k} {statistics.median(v):.3f}s" for k, v in imports.items()), flush=True)

    results: list[dict] = []
    for rep in range(args.reps):
        for model in models:
            for variant in rotated(variants, rep):
                result = run_worker(variant, model, args, env)
                results.append({**result, "rep": rep})
                print(
                    f"rep {rep + 1}/{args.reps} {model:<3} {variant:<17} fit {result['fit_s']:7.3f}s "
                    f"process {result['process_s']:6.2f}s rss {result['maxrss_mb']:6.0f} MiB "
                    f"loss {result['train_loss']:.4f} (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )

    load_after = loadavg()
    rows, stats = summarize(results, variants, models)
    text = report(args, info, results, imports, rows, stats, load_before, load_after, command, time.perf_counter() - started)
    print()
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"command": command, "machine": info, "imports": imports, "results": results, "load_before": load_before, "load_after": load_after}, indent=1))
    written = [str(out)]
    if not args.quick:
        (BENCH / "RESULTS.md").write_text(text)
        written.append(str(BENCH / "RESULTS.md"))
    print("wrote " + ", ".join(written))


if __name__ == "__main__":
    main()
