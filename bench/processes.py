"""The processes of `bench/run.py`: their environment (no byte-code cache unless asked,
glibc's malloc tuned alike, the thread count), how each is started (`python`), and the
import times of ember against torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import IMPORTS

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


GLIBC_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc's malloc, tuned alike for every variant: freed memory stays in the heap for the
next step instead of going back to the OS (and faulting in again, page by page).
Without it, whether a process does so every step depends on where small long-lived
allocations happen to land in its heap: a CNN step of the same loop takes 19.5 ms in
one process and 26 ms in the next (3,000 page faults a step)."""


def child_env(
    threads: int, glibc_defaults: bool = False, bytecode_cache: bool = False
) -> dict[str, str]:
    """The environment of every process. Without `bytecode_cache`, no byte code is read
    or written: `PYTHONDONTWRITEBYTECODE=1`, and `python()` gives each process a fresh,
    empty `PYTHONPYCACHEPREFIX` (so not even the caches installed beside torch's
    sources are read). With it, one shared cache under bench/results/, warmed first."""
    env = dict(os.environ)
    if not glibc_defaults:
        env.update(GLIBC_MALLOC)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        KERAS_BACKEND="torch",
        PYTHONHASHSEED="0",
    )
    env.pop("EMBER_PROGRESS_INTERVAL", None)  # ember's default renderer, as a user gets it
    if bytecode_cache:
        # Byte-code caches of every module (torch, ember, ...) under bench/results/, so
        # no process pays for compiling sources and nothing is written under src/.
        env["PYTHONPYCACHEPREFIX"] = str(BENCH / "results" / "pycache")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)  # python() sets a fresh one per process
    return env


def python(args: list[str], env: dict[str, str], **options) -> tuple:
    """Runs `python ARGS` in `env` from the repository root: (the completed process,
    the number of files written to its byte-code cache prefix). Without a byte-code
    cache (see child_env), the prefix is a fresh, empty folder of its own, removed after."""
    if env.get("PYTHONDONTWRITEBYTECODE") != "1":
        return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, **options), 0
    prefix = tempfile.mkdtemp(prefix="ember-bench-pycache-")
    try:
        done = subprocess.run(
            [sys.executable, *args], env={**env, "PYTHONPYCACHEPREFIX": prefix}, cwd=ROOT, **options
        )
        written = sum(len(files) for _, _, files in os.walk(prefix))
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
    return done, written


# Import time ---------------------------------------------------------------------------
def time_import(statement: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    python(["-c", statement], env, check=True)
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
        done, _ = python(["-c", GC_PROBE], env, check=True, capture_output=True)
        found.append(json.loads(done.stdout.decode().strip().splitlines()[-1]))
    return found


def import_times(runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    for statement in IMPORTS.values():  # warm the page cache (and any byte-code cache)
        time_import(statement, env)
    times: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(runs):
        for name, statement in IMPORTS.items():
            times[name].append(time_import(statement, env))
    return times
