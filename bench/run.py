"""ember against a hand-written loop, Lightning and Keras, on one CPU workload, run the
way a user runs a script.

    python bench/run.py [--reps 5] [--quick] [--out bench/results/latest.md]
                        [--threads 1,2] [--variants raw,ember,...] [--models mlp,cnn]
                        [--fixed-runs 9] [--bytecode-cache] [--ember-loader]
    python bench/run.py --fixed-only            # ember's fixed cost of a fit alone
    python bench/run.py --report-only bench/results/latest.json   # re-render a report

Every measurement is a fresh process (`bench/worker.py`), started round-robin: each
repetition runs every (thread count, model, variant) once, the variant order rotating
between repetitions, so slow drift of the machine falls on all variants alike.
Workload: 60,000 synthetic MNIST-shaped samples (uint8 28x28, seeded) as a map-style
dataset, batch 64, num_workers=0, the same torch DataLoader construction for every
variant (ember's included), one training epoch, then validation on 10,000 samples;
models: MLP 784-128-10 and the guide's small CNN (dropout 0.5). Adam, lr 1e-3. ember
renders with the builder's default renderer (stdout is a pipe: plain lines).

As a user's script from a fresh checkout: no process has a byte-code cache
(`PYTHONDONTWRITEBYTECODE=1` and a fresh, empty `PYTHONPYCACHEPREFIX` per process, so
torch's and ember's modules are compiled from source: whatever fit imports counts in
its time); `--bytecode-cache` gives every process a shared cache under bench/results/.
Each workload runs at every torch thread count of `--threads` (default 1 and 2).
The fit times are compared with the raw loop's as the paired median, the ratio of
medians and best against best, each beside `raw_again`'s (the noise); a target is held
to the least favourable of them (report: bench/report.py).

ember's fixed cost of a fit (`--fixed-runs` alternating raw and ember processes on one
training batch and one validation batch, the MLP, at the first thread count) runs
first; `--fixed-only` runs it alone. glibc's malloc is told to keep freed memory for
reuse in every process alike (`GLIBC_MALLOC`; `--glibc-defaults` leaves its defaults).
Also times `python -c "import ember"` against `python -c "import torch"` (alternating,
median of --import-runs each).

Writes a Markdown report to --out (and its raw numbers next to it as .json, updated
after every process, so a run cut short keeps what it measured); a complete run of
every variant and model (not --quick) also writes the report to bench/RESULTS.md.
`--quick` is a smoke test: 1 repetition, 6,000 training and 1,000 validation samples,
3 fixed-cost runs each. Lightning and Keras come from bench/requirements.txt; a
variant whose framework is missing is skipped.
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

from processes import GLIBC_MALLOC, child_env, import_gc, import_times, python  # noqa: E402
from report import OWN_SECTIONS, render  # noqa: E402
from worker import MODELS, VARIANTS  # noqa: E402  (worker.py imports nothing heavy at the top)

FRAMEWORK = {"lightning_min": "lightning", "lightning_default": "lightning", "keras": "keras"}
FIXED_SAMPLES = 64  # one batch of training, one of validation: the fixed cost of a fit


VERSIONS_PROBE = """
import importlib.metadata as m, importlib.util as u, json, numpy, torch
out = {"torch": torch.__version__, "numpy": numpy.__version__}
for name in ("ember", "lightning", "keras"):
    if u.find_spec(name) is not None:
        out[name] = m.version(name)
print(json.dumps(out))
"""


def machine(threads: list[int]) -> dict[str, str]:
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
        "threads": " / ".join(
            f"torch.set_num_threads({count}) and OMP_NUM_THREADS={count}" for count in threads
        )
        + " in every process; DataLoader num_workers=0",
        **json.loads(probe.stdout),
    }


def freeze_code(envs: dict[int, dict[str, str]], snapshot: Path) -> str:
    """Copy src/ember into `snapshot` (this run's own folder) and put it first on every
    child's path (in each of `envs`), so that all processes of a run import the same
    code even while src/ is being edited. Returns a description: commit, whether src/
    differed from it, and a hash of the code."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src" / "ember", snapshot / "ember", ignore=ignore)
    for env in envs.values():
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


# Training runs ---------------------------------------------------------------------------
def run_worker(
    variant: str, model: str, sizes: tuple[int, int], threads: int, loader: str, env: dict
) -> dict:
    """One measurement: `bench/worker.py` in a fresh process, its output a pipe."""
    command = [str(BENCH / "worker.py"), variant, model, "--train", str(sizes[0])]
    command += ["--valid", str(sizes[1]), "--threads", str(threads), "--loader", loader]
    start = time.perf_counter()
    done, written = python(command, env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith('{"variant"')]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
        raise SystemExit(f"{variant}/{model} failed (exit {done.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    result.update(process_s=wall, cache_files_written=written)
    return result


def rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions, >= 5 unless --quick")
    parser.add_argument("--quick", action="store_true", help="1 repetition, 6,000 samples")
    parser.add_argument("--out", default=str(BENCH / "results" / "latest.md"))
    parser.add_argument(
        "--threads", default="1,2", help="torch thread counts, comma-separated (default 1,2)"
    )
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--import-runs", type=int, default=9)
    parser.add_argument(
        "--fixed-runs", type=int, default=9, help="fixed-cost processes of raw and of ember"
    )
    parser.add_argument(
        "--fixed-only", action="store_true", help="measure ember's fixed cost of a fit alone"
    )
    parser.add_argument(
        "--bytecode-cache",
        action="store_true",
        help="a shared byte-code cache for every process (default: none, as a fresh checkout)",
    )
    parser.add_argument(
        "--ember-loader",
        action="store_true",
        help="ember's own DataLoaderBuilder for the ember variants (default: raw's DataLoader)",
    )
    parser.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="leave glibc's malloc thresholds at their defaults (see GLIBC_MALLOC)",
    )
    parser.add_argument("--report-only", metavar="JSON", help="re-render the report of a run")
    args = parser.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    args.model_list = [m for m in args.models.split(",") if m]
    try:
        args.thread_list = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--threads takes comma-separated integers, got {args.threads!r}")
    if not args.thread_list or min(args.thread_list) < 1:
        parser.error("--threads needs at least one count, each >= 1")
    for name in args.variant_list:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    for name in args.model_list:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if args.quick:
        args.reps, args.train, args.valid, args.import_runs = 1, 6_000, 1_000, 3
        args.fixed_runs = min(args.fixed_runs, 3)
    else:
        args.train, args.valid = 60_000, 10_000
        if args.reps < 5 and not (args.report_only or args.fixed_only):
            parser.error("--reps must be >= 5 for a full run (--quick is the smoke test)")
        if args.fixed_runs < 9 and not args.report_only:
            parser.error("--fixed-runs must be >= 9 unless --quick")
    return args


def write(text: str, data: dict, out: Path, full: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    written = [str(out)]
    if full:
        results = BENCH / "RESULTS.md"
        kept = results.read_text() if results.exists() else ""
        results.write_text(text.rstrip("\n") + "\n" + other_sections(kept))
        written.append(str(results))
    print("wrote " + ", ".join(written))


def other_sections(kept: str) -> str:
    """The `## ` sections of `kept` that this report does not write (the other
    benchmarks' figures in bench/RESULTS.md), each as it was, in their order."""
    sections: list[list[str]] = []
    for line in kept.splitlines():
        if line.startswith("## "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    others = [
        "\n".join(section).rstrip("\n")
        for section in sections
        if not section[0].startswith(OWN_SECTIONS)
    ]
    return "".join(f"\n{section}\n" for section in others)


def is_full(data: dict) -> bool:
    """A run that may stand for the benchmark in bench/RESULTS.md: every variant and
    model, the full workload, at least 5 repetitions, the fixed cost, finished."""
    settings = data["settings"]
    return (
        not settings["quick"]
        and settings["reps"] >= 5
        and data.get("complete", False)
        and bool(data.get("fixed"))
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
    variants = [] if args.fixed_only else args.variant_list
    skipped = [
        v for v in variants if v in FRAMEWORK and importlib.util.find_spec(FRAMEWORK[v]) is None
    ]
    if skipped:
        print(f"skipping {', '.join(skipped)}: not installed (see bench/requirements.txt)")
        variants = [v for v in variants if v not in skipped]

    started = time.perf_counter()
    load_before = loadavg()
    envs = {
        count: child_env(count, args.glibc_defaults, args.bytecode_cache)
        for count in args.thread_list
    }
    code = freeze_code(envs, snapshot)
    info = {**machine(args.thread_list), "ember code": code}
    print(f"machine: {info['cpu']}, {info['cores']}; load {load_before}", flush=True)
    first = envs[args.thread_list[0]]
    if args.bytecode_cache:  # warm every framework's cache: the first repetition as the rest
        for module in ("ember.train, ember.record", "lightning", "keras"):
            python(["-c", f"import {module}"], first, check=False, capture_output=True)
    loader = "ember" if args.ember_loader else "torch"
    results: list[dict] = []
    fixed: list[dict] = []
    out = Path(args.out)
    data = {
        "command": command,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "elapsed_s": 0.0,
        "settings": {
            "reps": args.reps,
            "train": args.train,
            "valid": args.valid,
            "threads": args.thread_list,
            "quick": args.quick,
            "glibc_malloc": "defaults" if args.glibc_defaults else GLIBC_MALLOC,
            "bytecode_cache": args.bytecode_cache,
            "loader": loader,
            "fixed_runs": args.fixed_runs,
            "fixed_train": FIXED_SAMPLES,
            "fixed_valid": FIXED_SAMPLES,
            "fixed_threads": args.thread_list[0],
        },
        "machine": info,
        "load_before": load_before,
        "load_after": "",
        "variants": variants,
        "models": [] if args.fixed_only else args.model_list,
        "skipped": skipped,
        "imports": {},
        "import_gc": [],
        "fixed": fixed,
        "results": results,
        "complete": False,
    }

    def keep(result: dict, what: str) -> None:
        """Prints a measurement and saves the numbers so far (a run cut short keeps them)."""
        data["elapsed_s"] = time.perf_counter() - started
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(data, indent=1))
        print(
            f"{what} {result['model']:<3} {result['variant']:<17} "
            f"fit {result['fit_s']:7.3f}s cpu {result['fit_cpu_s']:7.3f}s "
            f"process {result['process_s']:6.2f}s rss {result['maxrss_mb']:4.0f} MiB "
            f"loss {result['train_loss']:.4f} (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )

    # ember's fixed cost of a fit: one batch each way, raw and ember alternating.
    sizes, count = (FIXED_SAMPLES, FIXED_SAMPLES), args.thread_list[0]
    for rep in range(args.fixed_runs):
        for variant in rotated(["raw", "ember"], rep):
            result = run_worker(variant, "mlp", sizes, count, loader, envs[count])
            fixed.append({**result, "rep": rep})
            keep(fixed[-1], f"fixed {rep + 1}/{args.fixed_runs}")

    if not args.fixed_only:
        data["imports"] = import_times(args.import_runs, first)
        data["import_gc"] = import_gc(args.import_runs, first)
        medians = ", ".join(f"{k} {statistics.median(v):.3f}s" for k, v in data["imports"].items())
        print(f"import medians: {medians}", flush=True)
    for rep in range(args.reps if not args.fixed_only else 0):
        for count in args.thread_list:
            for model in args.model_list:
                for variant in rotated(variants, rep):
                    sizes = (args.train, args.valid)
                    result = run_worker(variant, model, sizes, count, loader, envs[count])
                    results.append({**result, "rep": rep})
                    keep(results[-1], f"rep {rep + 1}/{args.reps} {count}t")

    data.update(elapsed_s=time.perf_counter() - started, load_after=loadavg(), complete=True)
    text = render(data)
    print()
    print(text)
    write(text, data, out, is_full(data))


if __name__ == "__main__":
    main()
