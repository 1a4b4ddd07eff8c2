"""The prose of `bench/run.py`'s report (bench/report.py): the workload, the variants
and the method, with what the run's settings change in them."""

from __future__ import annotations

WORKLOAD = """\
{train:,} synthetic MNIST-shaped training samples (uint8 28x28 from a seeded generator, labels \
from a fixed patch rule with 10% label noise) and {valid:,} validation samples, map-style \
dataset, batch 64, {loader}, num_workers=0; one training epoch then one validation pass; Adam \
(lr 1e-3, eps 1e-8); the MLP 784-128-10 and the guide's CNN (two 3x3 convolutions, adaptive \
average pooling to 8x8, 1024-512-10, dropout 0.5). {reps} repetition(s) at each of {threads}; \
each repetition runs every (thread count, model, variant) once in a fresh process, round-robin, \
the variant order rotating between repetitions.

- `raw`: a hand-written loop (accuracy and loss accumulated on the device and read once per \
split; nothing written per iteration), validation in eval mode under `inference_mode`.
- `raw_again`: the same loop in a process of its own: its ratio to `raw` is what the \
machine's noise alone gives, the yardstick for the other ratios.
- `ember`: Accuracy and Loss on train and valid, the per-iteration metric files (always on), \
no checkpointer, and the renderer the builder picks by default: with stdout a pipe (as here), \
`PlainRenderer()`, a start line, the model summary, a progress line every 10 s \
(`EMBER_PROGRESS_INTERVAL`, unset in every process) and a line per split.
- `ember_ckpt`: `ember` plus `with_file_checkpointer(CompactRecorder())` (a checkpoint per epoch).
- `lightning_min`: `Trainer(max_epochs=1, logger=False, enable_checkpointing=False, \
enable_progress_bar=False, enable_model_summary=False)`; accuracy and loss logged with \
`self.log_dict(..., on_step=True, on_epoch=True, prog_bar=True)` in `training_step` and \
`self.log_dict(...)` in `validation_step`.
- `lightning_default`: `Trainer(max_epochs=1)`: its default logger, checkpointing, progress bar \
(writing to a pipe, not a TTY) and model summary; the same logging.
- `keras`: Keras 3 with `KERAS_BACKEND=torch`, `model.fit(train, validation_data=valid, \
epochs=1)` on the same DataLoaders, `accuracy` metric, its own weight initialisation.

{bytecode}

{malloc}

`fit s` runs from just before the first batch (the call to fit, or the raw loop) to the end \
of validation; imports, data generation, model and trainer construction are outside it, but \
anything imported or compiled inside fit counts. `fit CPU s` is the process's CPU time (all \
threads) over the same span: with one torch thread it equals the wall time on an idle machine \
and is much less sensitive to other processes. `process s` is the whole process, start to \
exit, timed by the parent. Peak RSS is `getrusage(RUSAGE_SELF).ru_maxrss`. `CPU / raw` and \
`RSS / raw` are ratios of medians. The fit time is compared with raw's three ways: the paired \
median (each repetition's time over raw's in the same repetition, run back to back, so slow \
changes in the machine's load mostly cancel), the ratio of the medians, and best / best (the \
fastest runs, the least disturbed by other processes); each beside the same figure for \
`raw_again`. A target is held to the least favourable of the three. The ratio of medians \
comes with its 95% interval (each side's runs drawn again with replacement, 4,000 times): \
the range another run of as many repetitions could give on this machine; a target inside \
it is not resolved by the run. Train loss is the epoch's \
sample-weighted mean (Keras: its running mean of batch losses)."""


def loader_text(loader: str) -> str:
    if loader == "ember":
        return (
            "the seeded shuffle order of ember's ResumableSampler (ember: its own "
            "DataLoaderBuilder; the others: a torch DataLoader with a sampler giving the "
            "same order)"
        )
    return (
        "one torch DataLoader construction for every variant, ember's included (a sampler "
        "giving the seeded order of ember's ResumableSampler)"
    )


def bytecode_text(data: dict) -> str:
    settings = data["settings"]
    if settings.get("bytecode_cache", True):
        return (
            "Every process reads and writes byte-code caches of every module under "
            "bench/results/pycache (`--bytecode-cache`): no process compiles sources."
        )
    found = [r["bytecode"] for r in data.get("results", []) + data.get("fixed", [])]
    found = [b for b in found if b]
    checked = ""
    if found:
        cached = sum(b["cached"] for b in found)
        every = data.get("results", []) + data.get("fixed", [])
        written = sum(r.get("cache_files_written", 0) for r in every)
        checked = (
            f" Checked in every process: {min(b['modules'] for b in found):,}–"
            f"{max(b['modules'] for b in found):,} modules imported from sources, "
            f"{cached} of them with a byte-code file where the process looked for one, "
            f"{written} files written."
        )
    return (
        "As a user's script runs from a fresh checkout, no process has a byte-code cache: "
        "each runs with `PYTHONDONTWRITEBYTECODE=1` and a fresh, empty "
        "`PYTHONPYCACHEPREFIX` of its own, so every module (torch's, ember's, ...) is "
        "compiled from its source, and nothing is read from or written to a cache." + checked
    )


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
