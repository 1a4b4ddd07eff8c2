"""ember against a hand-written loop, Lightning and Keras, on one CPU workload.

    python bench/run.py [--reps 5] [--quick] [--out bench/results/latest.md]
                        [--threads 1] [--variants raw,ember,...] [--models mlp,cnn]
    python bench/run.py --report-only bench/results/latest.json   # re-render a report

Every measurement is a fresh process (`bench/worker.py`), started round-robin: each
repetition runs every (model, variant) once, the variant order rotating between
repetitions, so slow drift of the machine falls on all variants alike. Workload:
60,000 synthetic MNIST-shaped samples (uint8 28x28, seeded) as a map-style dataset,
batch 64, num_workers=0, one training epoch, then validation on 10,000 samples;
models: MLP 784-128-10 and the guide's small CNN (dropout 0.5). Adam, lr 1e-3.

glibc's malloc is told to keep freed memory for reuse in every process alike
(`GLIBC_MALLOC`; `--glibc-defaults` leaves its defaults). Also times
`python -c "import ember"` against `python -c "import torch"` (alternating, median of
--import-runs each).

Writes a Markdown report to --out (and its raw numbers next to it as .json, updated
after every process, so a run cut short keeps what it measured); a complete run of
every variant and model (not --quick) also writes the report to bench/RESULTS.md. `--quick` is a smoke
test: 1 repetition, 6,000 training and 1,000 validation samples. Lightning and Keras
come from bench/requirements.txt; a variant whose framework is missing is skipped.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from worker import MODELS, VARIANTS  # noqa: E402  (worker.py imports nothing heavy at the top)

TARGETS = {"mlp": 1.03, "cnn": 1.02}  # ember defaults / raw, ratio of median fit times
IMPORT_TARGET_S = 0.15  # `import ember` over `import torch`
RSS_TARGET = 1.05  # ember peak RSS / raw peak RSS
FRAMEWORK = {"lightning_min": "lightning", "lightning_default": "lightning", "keras": "keras"}
IMPORTS = {
    "torch": "import torch",
    "ember": "import ember",
    "torch, ember": "import torch, ember",
    "ember.train": "import ember.train",
}


GLIBC_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc's malloc, tuned alike for every variant: freed memory stays in the heap for the
next step instead of going back to the OS (and faulting in again, page by page).
Without it, whether a process does so every step depends on where small long-lived
allocations happen to land in its heap: a CNN step of the same loop takes 19.5 ms in
one process and 26 ms in the next (3,000 page faults a step)."""


def child_env(threads: int, glibc_defaults: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if not glibc_defaults:
        env.update(GLIBC_MALLOC)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        KERAS_BACKEND="torch",
        PYTHONHASHSEED="0",
        # Byte-code caches of every module (torch, ember, ...) under bench/results/, so
        # no process pays for compiling sources and nothing is written under src/.
        PYTHONPYCACHEPREFIX=str(BENCH / "results" / "pycache"),
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


VERSIONS_PROBE = """
import importlib.metadata as m, importlib.util as u, json, numpy, torch
out = {"torch": torch.__version__, "numpy": numpy.__version__}
for name in ("ember", "lightning", "keras"):
    if u.find_spec(name) is not None:
        out[name] = m.version(name)
print(json.dumps(out))
"""


def machine(threads: int) -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    probe = subprocess.run(
        [sys.executable, "-c", VERSIONS_PROBE], capture_output=True, text=True, check=True
    )
    memory = ""
    try:
        memory = f"{int(Path('/proc/meminfo').read_text().split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    usable = len(os.sched_getaffinity(0))
    return {
        "cpu": cpu,
        "cores": f"{os.cpu_count()} logical ({usable} usable by this process)",
        "memory": memory,
        "python": platform.python_version(),
        "os": platform.platform(),
        "threads": f"torch.set_num_threads({threads}) and OMP_NUM_THREADS={threads} in every "
        "process; DataLoader num_workers=0",
        **json.loads(probe.stdout),
    }


def freeze_code(env: dict[str, str], snapshot: Path) -> str:
    """Copy src/ember into `snapshot` (this run's own folder) and put it first on every
    child's path, so that all processes of a run import the same code even while src/
    is being edited. Returns a description: commit, whether src/ differed from it, and
    a hash of the code."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src" / "ember", snapshot / "ember", ignore=ignore)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(snapshot), env.get("PYTHONPATH")]))
    digest = hashlib.sha256()
    for path in sorted((snapshot / "ember").rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(snapshot)).encode() + b"\0" + path.read_bytes())

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    commit = git("rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    dirty = git("status", "--porcelain", "--", "src").stdout.strip()
    state = "with uncommitted changes in src/" if dirty else "clean src/"
    return f"commit {commit}, {state}; snapshot sha256 {digest.hexdigest()[:12]}"


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min)"


# Import time ---------------------------------------------------------------------------
def time_import(statement: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", statement], env=env, check=True, cwd=ROOT)
    return time.perf_counter() - start


GC_PROBE = """
import gc, json, time
spent, mark = [], [0.0]
def clock(phase, info):
    if phase == "start":
        mark[0] = time.perf_counter()
    else:
        spent.append(time.perf_counter() - mark[0])
import torch
gc.callbacks.append(clock)
start = time.perf_counter()
import ember.train
print(json.dumps({"import_s": time.perf_counter() - start, "gc_s": sum(spent)}))
"""


def import_gc(runs: int, env: dict[str, str]) -> list[dict[str, float]]:
    """`import ember.train` timed inside a process that imported torch, and the part of
    it spent in garbage collections (the import's allocations can set off a full
    collection, which walks every object torch made)."""
    found = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", GC_PROBE], env=env, check=True, cwd=ROOT, capture_output=True
        )
        found.append(json.loads(done.stdout.decode().strip().splitlines()[-1]))
    return found


def import_times(runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    for statement in IMPORTS.values():  # warm the byte-code cache and the page cache
        time_import(statement, env)
    times: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(runs):
        for name, statement in IMPORTS.items():
            times[name].append(time_import(statement, env))
    return times


# Training runs ---------------------------------------------------------------------------
def run_worker(variant: str, model: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    command = [sys.executable, str(BENCH / "worker.py"), variant, model]
    command += ["--train", str(args.train), "--valid", str(args.valid)]
    command += ["--threads", str(args.threads)]
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
def span(values: list[float], digits: int = 3) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def ratio_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


KEYS = ("fit_s", "fit_cpu_s", "maxrss_mb")


def median_of(runs: list[dict], key: str) -> float | None:
    return statistics.median(r[key] for r in runs) if runs else None


def summarize(
    results: list[dict], variants: list[str], models: list[str]
) -> tuple[list[str], dict]:
    rows = [
        "| model | variant | fit s (median) | fit min–max | fit / raw | best / best raw "
        "| fit CPU s (median) | CPU / raw | process s (median) | peak RSS MiB (median) "
        "| RSS / raw | train loss | valid acc % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    stats: dict = {}
    for model in models:
        runs_of = {
            variant: [r for r in results if r["model"] == model and r["variant"] == variant]
            for variant in variants
        }
        raw_runs = runs_of.get("raw") or []
        raw = {key: median_of(raw_runs, key) for key in KEYS}
        raw_best = min((r["fit_s"] for r in raw_runs), default=None)
        for variant in variants:
            runs = runs_of[variant]
            if not runs:
                continue
            entry = {key: median_of(runs, key) for key in KEYS}
            for key in KEYS:
                entry[key + "_ratio"] = entry[key] / raw[key] if raw[key] else None
            best = min(r["fit_s"] for r in runs)
            entry["best_ratio"] = best / raw_best if raw_best else None
            stats[(model, variant)] = entry
            rows.append(
                f"| {model} | {variant} | {entry['fit_s']:.3f} "
                f"| {span([r['fit_s'] for r in runs])} "
                f"| {ratio_text(entry['fit_s_ratio'])} | {ratio_text(entry['best_ratio'])} "
                f"| {entry['fit_cpu_s']:.3f} | {ratio_text(entry['fit_cpu_s_ratio'])} "
                f"| {median_of(runs, 'process_s'):.2f} "
                f"| {entry['maxrss_mb']:.0f} | {ratio_text(entry['maxrss_mb_ratio'])} "
                f"| {median_of(runs, 'train_loss'):.4f} | {median_of(runs, 'valid_acc'):.2f} |"
            )
    return rows, stats


WORKLOAD = """\
{train:,} synthetic MNIST-shaped training samples (uint8 28x28 from a seeded generator, labels \
from a fixed patch rule with 10% label noise) and {valid:,} validation samples, map-style \
dataset, batch 64, the seeded shuffle order of ember's ResumableSampler, num_workers=0; one \
training epoch then one validation pass; Adam (lr 1e-3, eps 1e-8); the MLP 784-128-10 and the \
guide's CNN (two 3x3 convolutions, adaptive average pooling to 8x8, 1024-512-10, dropout 0.5). \
{reps} repetition(s); each runs every (model, variant) once in a fresh process, round-robin, \
the variant order rotating between repetitions.

- `raw`: a hand-written loop (accuracy and loss accumulated on the device and read once per \
split; nothing written per iteration), validation in eval mode under `inference_mode`.
- `raw_again`: the same loop in a process of its own: its ratio to `raw` is what the \
machine's noise alone gives, the yardstick for the other ratios.
- `ember`: Accuracy and Loss on train and valid, the per-iteration metric files (always on), \
the plain renderer with a 3600 s interval, no checkpointer.
- `ember_ckpt`: `ember` plus `with_file_checkpointer(CompactRecorder())` (a checkpoint per epoch).
- `lightning_min`: `Trainer(max_epochs=1, logger=False, enable_checkpointing=False, \
enable_progress_bar=False, enable_model_summary=False)`; accuracy and loss logged with \
`self.log_dict(..., on_step=True, on_epoch=True, prog_bar=True)` in `training_step` and \
`self.log_dict(...)` in `validation_step`.
- `lightning_default`: `Trainer(max_epochs=1)`: its default logger, checkpointing, progress bar \
(writing to a pipe, not a TTY) and model summary; the same logging.
- `keras`: Keras 3 with `KERAS_BACKEND=torch`, `model.fit(train, validation_data=valid, \
epochs=1)` on the same DataLoaders, `accuracy` metric, its own weight initialisation.

{malloc}

`fit s` runs from just before the first batch (the call to fit, or the raw loop) to the end \
of validation; imports, data generation, model and trainer construction are outside it. \
`fit CPU s` is the process's CPU time (all threads) over the same span: with one torch thread \
it equals the wall time on an idle machine and is much less sensitive to other processes. \
`process s` is the whole process, start to exit, timed by the parent. Peak RSS is \
`getrusage(RUSAGE_SELF).ru_maxrss`. Ratios are ratios of medians, except `best / best raw`, \
the ratio of the fastest runs (the least disturbed by other processes). Train loss is the \
epoch's sample-weighted mean (Keras: its running mean of batch losses)."""


def malloc_text(setting: str | dict[str, str]) -> str:
    if setting == "defaults" or not isinstance(setting, dict):
        return (
            "glibc's malloc ran with its default thresholds (`--glibc-defaults`): a process "
            "may return a step's memory to the OS and fault it in again, thousands of pages "
            "a step, or not, by the luck of its heap's layout."
        )
    tuned = ", ".join(f"{name}={value}" for name, value in setting.items())
    return (
        f"Every process runs with glibc's malloc told to keep freed memory for reuse ({tuned}), "
        "the same for every variant: it takes out a lottery that otherwise makes one process "
        "of the same loop up to 30% slower than the next (returning a step's memory to the OS "
        "and faulting it in again, thousands of pages a step)."
    )


def paired(data: dict, model: str, variant: str) -> list[float]:
    """`variant`'s fit time over raw's of the same repetition, per repetition (the two
    run back to back, so slow changes in the machine's load mostly cancel out)."""
    results = [r for r in data["results"] if r["model"] == model]
    raw = {r["rep"]: r["fit_s"] for r in results if r["variant"] == "raw"}
    return [
        r["fit_s"] / raw[r["rep"]] for r in results if r["variant"] == variant and r["rep"] in raw
    ]


def paired_rows(data: dict) -> list[str]:
    rows = [
        "Paired by repetition (each variant's fit time / raw's in the same repetition):",
        "",
        "| model | variant | median | min–max |",
        "|---|---|---:|---:|",
    ]
    found = False
    for model in data["models"]:
        for variant in data["variants"]:
            ratios = paired(data, model, variant) if variant != "raw" else []
            if ratios:
                found = True
                rows.append(
                    f"| {model} | {variant} | {statistics.median(ratios):.3f} | {span(ratios)} |"
                )
    return [*rows, ""] if found else []


def yes(ok: bool) -> str:
    return "yes" if ok else "no"


def report(data: dict, stats_rows: list[str], stats: dict) -> str:
    args = data["settings"]
    imports = data["imports"]
    lines = [
        "# ember benchmark",
        "",
        f"Command: `{data['command']}`  ",
        f"Date: {data['date']}; the whole run took {data['elapsed_s'] / 60:.1f} min."
        + ("" if data.get("complete", True) else " INCOMPLETE: the run was cut short."),
        "",
        "## Machine",
        "",
        *[f"- {key}: {value}" for key, value in data["machine"].items()],
        f"- load average before: {data['load_before']}",
        f"- load average after: {data['load_after'] or 'unknown (the run was cut short)'}",
        "",
        "## Workload",
        "",
        WORKLOAD.format(**args, malloc=malloc_text(args.get("glibc_malloc", "defaults"))),
        "",
        "## Results",
        "",
        *stats_rows,
        "",
    ]
    lines += paired_rows(data)
    med = {name: statistics.median(values) for name, values in imports.items()}
    lines += [
        f"## Import time (median of {len(imports['torch'])} alternating runs each, "
        "whole `python -c` process)",
        "",
        "| statement | median s | min–max s | over `import torch` |",
        "|---|---:|---:|---:|",
    ]
    for name, statement in IMPORTS.items():
        over = "–" if name == "torch" else f"{med[name] - med['torch']:+.3f}"
        lines.append(f"| `{statement}` | {med[name]:.3f} | {span(imports[name])} | {over} |")
    probes = data.get("import_gc")
    if probes:
        total = statistics.median(p["import_s"] for p in probes)
        gc_s = statistics.median(p["gc_s"] for p in probes)
        lines += [
            "",
            f"Inside a process that imported torch, `import ember.train` takes {total:.3f} s "
            f"(median of {len(probes)}), of which {gc_s:.3f} s are garbage collections: the "
            "import's allocations set off a full collection, which walks every object torch "
            "made (a script importing torch pays one as soon as it allocates enough).",
        ]
    lines += ["", "## Targets", "", "| target | measured | met |", "|---|---:|:---:|"]
    for model, limit in TARGETS.items():
        entry = stats.get((model, "ember"))
        ratios = paired(data, model, "ember")
        if entry and entry["fit_s_ratio"] and ratios:
            pair = statistics.median(ratios)
            wall, cpu = entry["fit_s_ratio"], entry["fit_cpu_s_ratio"]
            lines += [
                f"| ember / raw fit time, {model}, <= {limit:.2f}: paired median "
                f"| {pair:.3f} | {yes(pair <= limit)} |",
                f"| (the same: ratio of median wall times) | {wall:.3f} | {yes(wall <= limit)} |",
                f"| (the same: ratio of median CPU times) | {cpu:.3f} | {yes(cpu <= limit)} |",
            ]
            again = paired(data, model, "raw_again")
            if again:
                lines.append(
                    f"| (the machine's noise: raw_again / raw, paired median, min–max) "
                    f"| {statistics.median(again):.3f} ({span(again, 2)}) | – |"
                )
    for name in ("ember", "ember.train"):
        over = med[name] - med["torch"]
        lines.append(
            f"| `{IMPORTS[name]}` adds <= {IMPORT_TARGET_S:.2f} s to `import torch` "
            f"| {over:+.3f} s | {yes(over <= IMPORT_TARGET_S)} |"
        )
    for model in TARGETS:
        entry = stats.get((model, "ember"))
        if entry and entry["maxrss_mb_ratio"]:
            rss = entry["maxrss_mb_ratio"]
            lines.append(
                f"| ember peak RSS within 5% of raw, {model} | {rss:.3f} "
                f"| {yes(rss <= RSS_TARGET)} |"
            )
    if data.get("skipped"):
        lines += ["", f"Not run (framework not installed): {', '.join(data['skipped'])}."]
    lines.append("")
    return "\n".join(lines)


def render(data: dict) -> str:
    rows, stats = summarize(data["results"], data["variants"], data["models"])
    return report(data, rows, stats)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions, >= 5 unless --quick")
    parser.add_argument("--quick", action="store_true", help="1 repetition, 6,000 samples")
    parser.add_argument("--out", default=str(BENCH / "results" / "latest.md"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--import-runs", type=int, default=9)
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave glibc's malloc thresholds at their defaults (see GLIBC_MALLOC)",
    )
    parser.add_argument("--report-only", metavar="JSON", help="re-render the report of a run")
    args = parser.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    args.model_list = [m for m in args.models.split(",") if m]
    for name in args.variant_list:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    for name in args.model_list:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if args.quick:
        args.reps, args.train, args.valid, args.import_runs = 1, 6_000, 1_000, 3
    else:
        args.train, args.valid = 60_000, 10_000
        if args.reps < 5 and not args.report_only:
            parser.error("--reps must be >= 5 for a full run (--quick is the smoke test)")
    return args


def write(text: str, data: dict, out: Path, full: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    written = [str(out)]
    if full:
        results = BENCH / "RESULTS.md"
        kept = results.read_text() if results.exists() else ""
        results.write_text(text.rstrip("\n") + "\n" + other_sections(kept, text))
        written.append(str(results))
    print("wrote " + ", ".join(written))


def other_sections(kept: str, text: str) -> str:
    """The `## ` sections of `kept` that `text` does not have (the other benchmarks'
    figures in bench/RESULTS.md), each as it was, in their order."""
    ours = {line for line in text.splitlines() if line.startswith("## ")}
    sections: list[list[str]] = []
    for line in kept.splitlines():
        if line.startswith("## "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    others = ["\n".join(section).rstrip("\n") for section in sections if section[0] not in ours]
    return "".join(f"\n{section}\n" for section in others)


def is_full(data: dict) -> bool:
    """A run that may stand for the benchmark in bench/RESULTS.md: every variant and
    model, the full workload, at least 5 repetitions, finished."""
    settings = data["settings"]
    return (
        not settings["quick"]
        and settings["reps"] >= 5
        and data.get("complete", False)
        and set(data["variants"]) | set(data["skipped"]) == set(VARIANTS)
        and sorted(data["models"]) == sorted(MODELS)
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.report_only:
        data = json.loads(Path(args.report_only).read_text())
        text = render(data)
        print(text)
        write(text, data, Path(args.out), is_full(data))
        return
    (BENCH / "results").mkdir(exist_ok=True)  # ignored by git: absent from a fresh clone
    snapshot = Path(tempfile.mkdtemp(prefix="snapshot-", dir=BENCH / "results"))
    try:
        measure(args, argv, snapshot)
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)


def measure(args: argparse.Namespace, argv: list[str] | None, snapshot: Path) -> None:

    given = argv if argv is not None else sys.argv[1:]
    command = "python bench/run.py" + "".join(" " + shlex.quote(a) for a in given)
    variants = args.variant_list
    skipped = [
        v for v in variants if v in FRAMEWORK and importlib.util.find_spec(FRAMEWORK[v]) is None
    ]
    if skipped:
        print(f"skipping {', '.join(skipped)}: not installed (see bench/requirements.txt)")
        variants = [v for v in variants if v not in skipped]

    started = time.perf_counter()
    load_before = loadavg()
    env = child_env(args.threads, args.glibc_defaults)
    code = freeze_code(env, snapshot)
    info = {**machine(args.threads), "ember code": code}
    print(f"machine: {info['cpu']}, {info['cores']}; load {load_before}", flush=True)
    # Warm the byte-code cache of every framework, so the first repetition is like the rest.
    for module in ("ember.train, ember.record", "lightning", "keras"):
        warm = [sys.executable, "-c", f"import {module}"]
        subprocess.run(warm, env=env, cwd=ROOT, check=False, capture_output=True)
    imports = import_times(args.import_runs, env)
    gc_probes = import_gc(args.import_runs, env)
    medians = ", ".join(f"{k} {statistics.median(v):.3f}s" for k, v in imports.items())
    print(f"import medians: {medians}", flush=True)

    results: list[dict] = []
    out = Path(args.out)
    data = {
        "command": command,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "elapsed_s": 0.0,
        "settings": {
            "reps": args.reps,
            "train": args.train,
            "valid": args.valid,
            "threads": args.threads,
            "quick": args.quick,
            "glibc_malloc": "defaults" if args.glibc_defaults else GLIBC_MALLOC,
        },
        "machine": info,
        "load_before": load_before,
        "load_after": "",
        "variants": variants,
        "models": args.model_list,
        "skipped": skipped,
        "imports": imports,
        "import_gc": gc_probes,
        "results": results,
        "complete": False,
    }
    for rep in range(args.reps):
        for model in args.model_list:
            for variant in rotated(variants, rep):
                result = {**run_worker(variant, model, args, env), "rep": rep}
                results.append(result)
                # Kept up to date, so that a run cut short still leaves its numbers.
                data["elapsed_s"] = time.perf_counter() - started
                out.parent.mkdir(parents=True, exist_ok=True)
                out.with_suffix(".json").write_text(json.dumps(data, indent=1))
                print(
                    f"rep {rep + 1}/{args.reps} {model:<3} {variant:<17} "
                    f"fit {result['fit_s']:7.3f}s cpu {result['fit_cpu_s']:7.3f}s "
                    f"process {result['process_s']:6.2f}s rss {result['maxrss_mb']:4.0f} MiB "
                    f"loss {result['train_loss']:.4f} (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )

    data.update(elapsed_s=time.perf_counter() - started, load_after=loadavg(), complete=True)
    text = render(data)
    print()
    print(text)
    write(text, data, out, is_full(data))


if __name__ == "__main__":
    main()
