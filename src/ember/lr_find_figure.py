"""`lr-find.png`: the learning-rate range test drawn (`ember plot` and `lr_find`'s
picture): the loss against the rate, the suggestion, the largest stable rate (the rates
past it shaded as unstable) and the steps' edge marked, and each step's ratio of
realized to promised decrease below. Needs matplotlib, imported
only when a picture is drawn."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

from ember.figures import legend_beside, matplotlib, save, significant

COLOURS = {"train": "#1f77b4", "valid": "#ff7f0e"}


def plot_lr_find(source: str | os.PathLike[str], path: Path) -> Path:
    """`lr_find_figure` as a PNG at `path`."""
    return save(lr_find_figure(source), path)


def lr_find_figure(source: str | os.PathLike[str]) -> Any:
    """The learning-rate range test (`lr-find.json`): the loss of each step and its
    smoothed curve against the rate (a log scale in exponential mode), the loss axis
    fitted to the curve up to its divergence (`lr_find_range`: what rises past it is cut
    at the top), the lowest smoothed loss, the suggestion, the largest stable rate with
    the unstable rates past it shaded, and the steps' edge marked with their values;
    below, each step's ratio of realized to promised decrease."""
    from ember.train.lr_finder import CURVATURE_RULE, SAFETY, LrFinderResult

    result = LrFinderResult.load(source)
    Figure, _ = matplotlib("ember plot")
    ratios = [(lr, r) for lr, r in zip(result.lrs, result.ratios) if math.isfinite(r)]
    rows = 2 if ratios else 1
    figure = Figure(figsize=(10, 5 + 2.6 * (rows - 1)), layout="constrained")
    axes = figure.subplots(rows, 1, squeeze=False, sharex=True, height_ratios=[2, 1][:rows])
    ax = axes[0, 0]
    colour = COLOURS["train"]
    ax.plot(result.lrs, result.losses, color=colour, alpha=0.35, linewidth=0.9, label="loss")
    ax.plot(result.lrs, result.smoothed, color=colour, linewidth=2.0, label="smoothed loss")
    ax.set_ylim(*lr_find_range(result.losses, result.smoothed, result.diverged))
    finite = [i for i, v in enumerate(result.smoothed) if math.isfinite(v)]
    if finite:
        lowest = min(finite, key=lambda i: result.smoothed[i])
        ax.plot(
            [result.lrs[lowest]],
            [result.smoothed[lowest]],
            marker="v",
            markersize=8,
            linestyle="none",
            color=colour,
            label=f"lowest smoothed loss {significant(result.smoothed[lowest])} "
            f"at {significant(result.lrs[lowest])}",
        )
    # the unstable rates: past the largest stable rate (the curvature's), else past
    # the steps' edge; the suggestion is always below where this begins
    unstable = result.limit if result.limit is not None else result.edge
    marks = []
    if result.limit is not None:
        marks.append((result.limit, "-", f"largest stable rate {significant(result.limit)}"))
    if result.edge is not None:
        marks.append((result.edge, ":", f"steps stop gaining {significant(result.edge)}"))
    if result.suggestion is not None:
        rule = {CURVATURE_RULE: f"{SAFETY:g} x largest stable rate"}.get(
            result.rule or "", result.rule or "half the edge"
        )
        text = f"suggestion {significant(result.suggestion)} ({rule})"
        marks.append((result.suggestion, "--", text))
    for at, style, label in marks:
        for row in axes[:, 0]:
            row.axvline(at, color=COLOURS["valid"], linestyle=style, linewidth=1.6)
        ax.plot([], [], color=COLOURS["valid"], linestyle=style, label=label)
    xs = result.lrs + [at for at, _, _ in marks]
    low, high = min(xs), max(xs)
    wide = unstable is not None and unstable >= high  # room to show the shading
    if result.mode == "exp":
        ax.set_xscale("log")
        low, high = low / 1.25, high * (2.0 if wide else 1.25)
    else:
        span = high - low
        low, high = low - 0.02 * span, high + (0.1 if wide else 0.02) * span
    if unstable is not None:
        for row in axes[:, 0]:
            row.axvspan(unstable, max(high, unstable), color="#d62728", alpha=0.1, linewidth=0)
        ax.fill_between([], [], color="#d62728", alpha=0.1, label="unstable rates")
    ax.set_xlim(low, high)
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3, which="both")
    legend_beside(ax)
    if ratios:
        below = axes[1, 0]
        below.plot(
            [lr for lr, _ in ratios],
            [r for _, r in ratios],
            color="black",
            marker=".",
            linewidth=1.0,
            label="loss removed / loss promised",
        )
        below.axhline(0.5, color="grey", linewidth=0.8, linestyle="--", label="0.5: the best step")
        below.axhline(0.0, color="grey", linewidth=1.0, label="0: no gain")
        below.set_ylim(-1.5, 1.5)  # the steps past the edge are cut at the bottom
        below.set_ylabel("step ratio")
        below.grid(True, alpha=0.3, which="both")
        legend_beside(below)
    axes[-1, 0].set_xlabel("learning rate" + (" (log scale)" if result.mode == "exp" else ""))
    ended = "stopped at divergence" if result.diverged else "full range"
    if not result.reached:
        ended += "; the rates stop below the " + (
            "largest stable rate" if result.limit is not None else "edge"
        )
    figure.suptitle(f"Learning-rate range test ({ended})", fontsize=14, fontweight="bold")
    return figure


def lr_find_range(
    losses: Sequence[float], smoothed: Sequence[float], diverged: bool
) -> tuple[float, float]:
    """The loss axis of the range test: from the lowest loss drawn (raw or smoothed) to
    the highest before the curve turns up (the later of the lowest raw and the lowest
    smoothed loss), with a margin of 5 % either side; after the turn, all of the smoothed
    curve when the test did not diverge, else a quarter of the span more, so that the
    rise shows before it leaves the top."""
    finite_raw = [(i, v) for i, v in enumerate(losses) if math.isfinite(v)]
    finite_smoothed = [(i, v) for i, v in enumerate(smoothed) if math.isfinite(v)]
    everything = [v for _, v in finite_raw] + [v for _, v in finite_smoothed]
    if not everything:
        return 0.0, 1.0
    turn = max(
        min(finite_raw, key=lambda item: item[1], default=(0, 0.0))[0],
        min(finite_smoothed, key=lambda item: item[1], default=(0, 0.0))[0],
    )
    before = [v for i, v in finite_raw + finite_smoothed if i <= turn]
    low = min(everything)
    high = max(before, default=max(everything))
    if diverged:
        high += 0.25 * (high - low)
    else:
        high = max([high] + [v for _, v in finite_smoothed])
    margin = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
    return low - margin, high + margin
