"""bench/run.py's report, on made-up measurements (no process is started): the fit time
over the raw loop's three ways beside raw_again's, the least favourable of them against
the target, per thread count, and the fixed cost of a fit."""

from __future__ import annotations

from pathlib import Path

from ember_testing import load_example

run = load_example(Path(__file__).parents[1] / "bench" / "run.py", "bench_run")
report = run.render.__globals__  # bench/report.py's names, as run.py imported them

RAW = {1: [1.00, 1.10, 1.05], 2: [0.60, 0.62, 0.61]}
EMBER = {1: [1.02, 1.08, 1.12], 2: [0.63, 0.61, 0.66]}
AGAIN = {1: [1.01, 1.09, 1.04], 2: [0.60, 0.63, 0.60]}


def result(variant, threads, rep, fit_s, model="mlp"):
    return dict(
        variant=variant,
        model=model,
        threads=threads,
        rep=rep,
        fit_s=fit_s,
        fit_cpu_s=fit_s,
        process_s=3.0,
        maxrss_mb=300.0,
        train_loss=0.5,
        valid_acc=90.0,
        bytecode={"dont_write": True, "prefix": "/tmp/x", "modules": 1800, "cached": 0},
        cache_files_written=0,
    )


def data():
    results = [
        result(variant, threads, rep, times[threads][rep])
        for variant, times in (("raw", RAW), ("raw_again", AGAIN), ("ember", EMBER))
        for threads in (1, 2)
        for rep in range(3)
    ]
    fixed = [
        result(v, 1, rep, t) for rep in range(9) for v, t in (("raw", 0.010), ("ember", 0.016))
    ]
    return {
        "command": "python bench/run.py",
        "date": "2026-01-01",
        "elapsed_s": 60.0,
        "settings": dict(
            reps=3, train=6000, valid=1000, threads=[1, 2], quick=True, bytecode_cache=False
        ),
        "machine": {"cpu": "test"},
        "load_before": "0",
        "load_after": "0",
        "variants": ["raw", "raw_again", "ember"],
        "models": ["mlp"],
        "skipped": [],
        "imports": {},
        "fixed": fixed,
        "results": results,
        "complete": True,
    }


def test_three_ratios_and_the_least_favourable_of_them():
    found = report["ratios"](data(), "mlp", "ember", 2)
    assert found["pairs"] == [0.63 / 0.60, 0.61 / 0.62, 0.66 / 0.61]
    assert found["medians"] == 0.63 / 0.61
    assert found["best"] == 0.61 / 0.60
    assert (found["worst"], found["worst_name"]) == (max(found["pairs"][0], 0.63 / 0.61), "paired")
    over_both = report["least_favourable"](data(), "mlp", [1, 2])
    assert over_both["threads"] == 2 and over_both["value"] == found["worst"]


def test_the_report_has_the_ratios_beside_the_noise_per_thread_count_and_the_fixed_cost():
    text = run.render(data())
    for heading in ("## Results, 1 torch thread", "## Results, 2 torch threads"):
        assert heading in text
    columns = (
        "| paired median (min–max) | noise | ratio of medians (95% interval) | noise "
        "| best / best | noise |"
    )
    assert columns in text
    assert "- Least favourable, mlp: ember / raw 1.050 (paired median, 2 torch threads)" in text
    assert "target <= 1.03: no." in text
    assert "## Fixed cost of a fit" in text
    assert "+6.0 ms (difference of the medians)" in text
    assert "| ember's fixed cost of a fit over raw's <= 10 ms | +6.0 ms | yes |" in text
    assert "0 of them with a byte-code file" in text


def test_results_md_keeps_the_other_benchmarks_sections_only():
    kept = "# ember benchmark\n\n## Results\n\nold\n\n## Targets\n\nold\n\n## Compact\n\nkept\n"
    assert run.other_sections(kept) == "\n## Compact\n\nkept\n"


def test_the_ratio_of_medians_comes_with_its_95_percent_interval():
    found = report["ratios"](data(), "mlp", "ember", 2)
    low, high = found["interval"]
    # resampled medians of 3 runs are among the runs: the interval's ends are ratios of them
    ratios = {e / r for e in EMBER[2] for r in RAW[2]}
    assert low in ratios and high in ratios
    assert low <= found["medians"] <= high and low < high
    assert report["ratios"](data(), "mlp", "ember", 2)["interval"] == (low, high)  # seeded
    text = run.render(data())
    assert f"| {found['medians']:.3f} ({low:.3f}–{high:.3f}) |" in text
    assert f"The ratio of medians there lies in {low:.3f}–{high:.3f} (95%)" in text
    assert "1.03 is inside it, so this run cannot tell whether the target is met." in text


def test_a_target_outside_the_interval_is_not_said_to_be_unresolved():
    far = data()
    for row in far["results"]:
        if row["variant"] == "ember":
            row["fit_s"] *= 1.5
    text = run.render(far)
    assert "target <= 1.03: no. The ratio of medians there lies in" in text
    assert "cannot tell" not in text
