"""The Markdown report of `bench/run.py`, from the numbers it saved (its .json).

Fit times are compared with the raw loop's three ways, each beside the same figure for
`raw_again` (the raw loop in another process: what the machine's noise alone gives):
the paired median (each repetition's fit time over raw's of the same repetition, the
median over repetitions), the ratio of the median fit times, and the fastest run over
raw's fastest (best / best). The least favourable of the three is the one a target is
held to.

Beside the ratio of medians stands its 95% interval (`interval`): resampling each side's
runs gives the range a run of as many repetitions on this machine could have given.
When a target lies inside it, the run cannot tell whether the target is met.
"""

from __future__ import annotations

import random
import statistics
from typing import Any

from report_text import WORKLOAD, bytecode_text, loader_text, malloc_text

TARGETS = {"mlp": 1.03, "cnn": 1.01}
"""ember / raw fit time, the least favourable of the three ratios, at every thread count."""
FIXED_TARGET_MS = 10.0  # ember's fixed cost of a fit over raw's, in ms
IMPORT_TARGET_S = 0.15  # `import ember` over `import torch`
RSS_TARGET = 1.05  # ember peak RSS / raw peak RSS
IMPORTS = {
    "torch": "import torch",
    "ember": "import ember",
    "torch, ember": "import torch, ember",
    "ember.train": "import ember.train",
}
NOISE = "raw_again"
STATISTICS = ("paired", "medians", "best")
NAMES = {"paired": "paired median", "medians": "ratio of medians", "best": "best / best"}
OWN_SECTIONS = ("## Machine", "## Workload", "## Results", "## Fixed", "## Import", "## Targets")
"""The sections this report writes into bench/RESULTS.md (every other one is kept)."""


def span(values: list[float], digits: int = 3) -> str:
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}"


def ratio_text(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def yes(ok: bool) -> str:
    return "yes" if ok else "no"


def thread_counts(data: dict) -> list[int]:
    """The run's torch thread counts (a run before they were a list had one)."""
    threads = data["settings"]["threads"]
    return list(threads) if isinstance(threads, list) else [threads]


def threads_text(threads: int) -> str:
    return f"{threads} torch thread{'s' if threads != 1 else ''}"


def runs_of(data: dict, model: str, variant: str, threads: int) -> list[dict]:
    first = thread_counts(data)[0]
    return [
        r
        for r in data.get("results", [])
        if r["model"] == model and r["variant"] == variant and r.get("threads", first) == threads
    ]


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


# Ratios -------------------------------------------------------------------------------
def ratios(data: dict, model: str, variant: str, threads: int) -> dict[str, Any] | None:
    """`variant`'s fit time over raw's: `paired` (the per-repetition ratios, each over
    raw's run of the same repetition, run back to back), `medians` and `best`."""
    raw = runs_of(data, model, "raw", threads)
    runs = runs_of(data, model, variant, threads)
    if not raw or not runs:
        return None
    raw_by_rep = {r["rep"]: r["fit_s"] for r in raw}
    pairs = [r["fit_s"] / raw_by_rep[r["rep"]] for r in runs if r["rep"] in raw_by_rep]
    found = {
        "pairs": pairs,
        "paired": statistics.median(pairs) if pairs else None,
        "medians": median_of(runs, "fit_s") / median_of(raw, "fit_s"),
        "best": min(r["fit_s"] for r in runs) / min(r["fit_s"] for r in raw),
        "interval": interval([r["fit_s"] for r in runs], [r["fit_s"] for r in raw]),
    }
    known = [(found[name], name) for name in STATISTICS if found[name] is not None]
    found["worst"], found["worst_name"] = max(known)
    return found


def interval(times: list[float], raw: list[float], draws: int = 4000) -> tuple[float, float]:
    """The 95% bootstrap interval of median(times) / median(raw): each side's runs drawn
    again with replacement, `draws` times (a fixed seed: the report is reproducible)."""
    draw = random.Random(0).choices
    found = sorted(
        statistics.median(draw(times, k=len(times))) / statistics.median(draw(raw, k=len(raw)))
        for _ in range(draws)
    )
    return found[int(0.025 * draws)], found[int(0.975 * draws) - 1]


def medians_text(found: dict | None) -> str:
    if found is None:
        return "–"
    low, high = found["interval"]
    return f"{found['medians']:.3f} ({low:.3f}–{high:.3f})"


def paired_text(found: dict | None) -> str:
    if found is None or not found["pairs"]:
        return "–"
    return f"{found['paired']:.3f} ({span(found['pairs'], 2)})"


def over_raw(runs: list[dict], raw: list[dict], key: str) -> str:
    return ratio_text(median_of(runs, key) / median_of(raw, key) if raw else None)


def absolute_rows(data: dict, threads: int) -> list[str]:
    rows = [
        "| model | variant | fit s (median) | fit min–max | fit CPU s (median) | CPU / raw "
        "| process s (median) | peak RSS MiB (median) | RSS / raw | train loss | valid acc % |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in data["models"]:
        raw = runs_of(data, model, "raw", threads)
        for variant in data["variants"]:
            runs = runs_of(data, model, variant, threads)
            if not runs:
                continue
            rows.append(
                f"| {model} | {variant} | {median_of(runs, 'fit_s'):.3f} "
                f"| {span([r['fit_s'] for r in runs])} "
                f"| {median_of(runs, 'fit_cpu_s'):.3f} | {over_raw(runs, raw, 'fit_cpu_s')} "
                f"| {median_of(runs, 'process_s'):.2f} "
                f"| {median_of(runs, 'maxrss_mb'):.0f} | {over_raw(runs, raw, 'maxrss_mb')} "
                f"| {median_of(runs, 'train_loss'):.4f} | {median_of(runs, 'valid_acc'):.2f} |"
            )
    return rows


def ratio_rows(data: dict, threads: int) -> list[str]:
    rows = [
        "Fit time over the raw loop's, three ways, each beside the raw loop's second "
        "process (`raw_again`, the machine's noise):",
        "",
        "| model | variant | paired median (min–max) | noise | ratio of medians (95% interval) "
        "| noise | best / best | noise | least favourable |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in data["models"]:
        noise = ratios(data, model, NOISE, threads)
        for variant in data["variants"]:
            if variant in ("raw", NOISE):
                continue
            found = ratios(data, model, variant, threads)
            if found is None:
                continue
            rows.append(
                f"| {model} | {variant} | {paired_text(found)} | {paired_text(noise)} "
                f"| {medians_text(found)} | {ratio_text(noise and noise['medians'])} "
                f"| {ratio_text(found['best'])} | {ratio_text(noise and noise['best'])} "
                f"| {found['worst']:.3f} |"
            )
    return rows


def least_favourable(data: dict, model: str, threads: list[int]) -> dict | None:
    """ember's largest ratio to raw over the three statistics and `threads`, with
    raw_again's largest over the same."""
    worst: tuple | None = None
    noise = None
    for count in threads:
        found = ratios(data, model, "ember", count)
        if found is not None and (worst is None or found["worst"] > worst[0]):
            worst = (found["worst"], found["worst_name"], count, found["interval"])
        again = ratios(data, model, NOISE, count)
        if again is not None:
            noise = again["worst"] if noise is None else max(noise, again["worst"])
    if worst is None:
        return None
    return {
        "value": worst[0],
        "statistic": worst[1],
        "threads": worst[2],
        "interval": worst[3],
        "noise": noise,
    }


def least_text(data: dict, model: str, threads: list[int]) -> str | None:
    found = least_favourable(data, model, threads)
    if found is None:
        return None
    limit = TARGETS.get(model)
    verdict = "" if limit is None else f"; target <= {limit:.2f}: {yes(found['value'] <= limit)}"
    noise = "" if found["noise"] is None else f"; raw_again's largest {found['noise']:.3f}"
    where = f", {threads_text(found['threads'])}" if len(threads) > 1 else ""
    low, high = found["interval"]
    spread = f" The ratio of medians there lies in {low:.3f}–{high:.3f} (95%)"
    if limit is not None and low <= limit <= high:
        spread += f": {limit:.2f} is inside it, so this run cannot tell whether the target is met"
    return (
        f"Least favourable, {model}: ember / raw {found['value']:.3f} "
        f"({NAMES[found['statistic']]}{where}){noise}{verdict}.{spread}."
    )


# Fixed cost --------------------------------------------------------------------------
def fixed_cost(data: dict) -> dict | None:
    """ember's fixed cost over raw's, in ms, from the one-batch fits: the difference of
    the median fit times, of the fastest, and the median of the paired differences."""
    runs = data.get("fixed") or []
    raw = [r for r in runs if r["variant"] == "raw"]
    ember = [r for r in runs if r["variant"] == "ember"]
    if not raw or not ember:
        return None
    raw_by_rep = {r["rep"]: r["fit_s"] for r in raw}
    pairs = [1e3 * (r["fit_s"] - raw_by_rep[r["rep"]]) for r in ember if r["rep"] in raw_by_rep]
    found = {
        "raw": raw,
        "ember": ember,
        "medians": 1e3 * (median_of(ember, "fit_s") - median_of(raw, "fit_s")),
        "best": 1e3 * (min(r["fit_s"] for r in ember) - min(r["fit_s"] for r in raw)),
        "paired": statistics.median(pairs) if pairs else None,
    }
    found["worst"] = max(found[name] for name in STATISTICS if found[name] is not None)
    return found


def fixed_rows(data: dict) -> list[str]:
    found = fixed_cost(data)
    if found is None:
        return []
    settings = data["settings"]
    lines = [
        f"## Fixed cost of a fit ({settings.get('fixed_train', 64)} training samples and "
        f"{settings.get('fixed_valid', 64)} validation samples: one batch each, "
        f"{threads_text(settings.get('fixed_threads', thread_counts(data)[0]))})",
        "",
        "raw and ember alternate, each a fresh process; the MLP. With one batch, the fit "
        "time is the time to the first step, one step and one validation batch, and the "
        "time after them: ember's over raw's is its fixed cost of a fit (with one step's "
        "bookkeeping, tens of µs).",
        "",
        "| variant | runs | fit ms (median) | fit ms (min) | fit ms min–max | process s (median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant in ("raw", "ember"):
        runs = found[variant]
        times = [1e3 * r["fit_s"] for r in runs]
        lines.append(
            f"| {variant} | {len(runs)} | {statistics.median(times):.1f} | {min(times):.1f} "
            f"| {span(times, 1)} | {median_of(runs, 'process_s'):.2f} |"
        )
    paired = "–" if found["paired"] is None else f"{found['paired']:+.1f} ms"
    lines += [
        "",
        f"ember − raw: {found['medians']:+.1f} ms (difference of the medians), "
        f"{found['best']:+.1f} ms (of the fastest), {paired} (median of the paired "
        f"differences); the largest, {found['worst']:+.1f} ms, against the target "
        f"<= {FIXED_TARGET_MS:.0f} ms: {yes(found['worst'] <= FIXED_TARGET_MS)}.",
        "",
    ]
    return lines


def import_rows(data: dict) -> list[str]:
    imports = data.get("imports")
    if not imports:
        return []
    med = {name: statistics.median(values) for name, values in imports.items()}
    lines = [
        f"## Import time (median of {len(imports['torch'])} alternating runs each, "
        f"whole `python -c` process, {threads_text(thread_counts(data)[0])}, the byte code "
        "as above)",
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
            f"(median of {len(probes)}), of which {gc_s:.3f} s are garbage collections (the "
            "import's allocations can set off a full collection, which walks every object "
            "torch made; a script importing torch pays one as soon as it allocates enough).",
        ]
    return [*lines, ""]


def target_rows(data: dict) -> list[str]:
    threads = thread_counts(data)
    lines = ["## Targets", "", "| target | measured | met |", "|---|---:|:---:|"]
    for model, limit in TARGETS.items():
        for count in threads:
            found = ratios(data, model, "ember", count)
            if found is None:
                continue
            figures = ", ".join(
                f"{NAMES[name]} {found[name]:.3f}" for name in STATISTICS if found[name]
            )
            lines.append(
                f"| ember / raw fit time, {model}, {threads_text(count)}, <= {limit:.2f}, "
                f"least favourable of: {figures} | {found['worst']:.3f} "
                f"| {yes(found['worst'] <= limit)} |"
            )
            noise = ratios(data, model, NOISE, count)
            if noise is not None:
                lines.append(
                    f"| (the machine's noise: raw_again / raw, the same) "
                    f"| {noise['worst']:.3f} | – |"
                )
    fixed = fixed_cost(data)
    if fixed is not None:
        lines.append(
            f"| ember's fixed cost of a fit over raw's <= {FIXED_TARGET_MS:.0f} ms "
            f"| {fixed['worst']:+.1f} ms | {yes(fixed['worst'] <= FIXED_TARGET_MS)} |"
        )
    imports = data.get("imports")
    if imports:
        med = {name: statistics.median(values) for name, values in imports.items()}
        for name in ("ember", "ember.train"):
            over = med[name] - med["torch"]
            lines.append(
                f"| `{IMPORTS[name]}` adds <= {IMPORT_TARGET_S:.2f} s to `import torch` "
                f"| {over:+.3f} s | {yes(over <= IMPORT_TARGET_S)} |"
            )
    for model in TARGETS:
        for count in threads:
            raw, ember = (runs_of(data, model, v, count) for v in ("raw", "ember"))
            if raw and ember:
                rss = median_of(ember, "maxrss_mb") / median_of(raw, "maxrss_mb")
                lines.append(
                    f"| ember peak RSS within 5% of raw, {model}, {threads_text(count)} "
                    f"| {rss:.3f} | {yes(rss <= RSS_TARGET)} |"
                )
    return lines


def render(data: dict) -> str:
    args = data["settings"]
    threads = thread_counts(data)
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
        WORKLOAD.format(
            train=args["train"],
            valid=args["valid"],
            reps=args["reps"],
            threads=" and ".join(threads_text(count) for count in threads),
            loader=loader_text(args.get("loader", "ember")),
            bytecode=bytecode_text(data),
            malloc=malloc_text(args.get("glibc_malloc", "defaults")),
        )
        if data.get("results")  # else the fixed cost alone (--fixed-only)
        else f"{bytecode_text(data)}\n\n{malloc_text(args.get('glibc_malloc', 'defaults'))}",
        "",
    ]
    if data.get("results"):
        for count in threads:
            lines += [f"## Results, {threads_text(count)}", ""]
            lines += [*absolute_rows(data, count), "", *ratio_rows(data, count), ""]
            notes = [least_text(data, model, [count]) for model in data["models"]]
            lines += [f"- {note}" for note in notes if note]
            lines.append("")
        if len(threads) > 1:
            notes = [least_text(data, model, threads) for model in data["models"]]
            lines += [f"Over {' and '.join(map(str, threads))} threads:", ""]
            lines += [*[f"- {note}" for note in notes if note], ""]
    lines += fixed_rows(data)
    lines += import_rows(data)
    lines += target_rows(data)
    if data.get("skipped"):
        lines += ["", f"Not run (framework not installed): {', '.join(data['skipped'])}."]
    lines.append("")
    return "\n".join(lines)
