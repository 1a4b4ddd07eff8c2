"""The edit distance behind CerMetric and WerMetric against the plain dynamic programme.

Run `python bench/text_metrics.py [--length 600 --pairs 20]`: both compute the
Levenshtein distance of the same random character pairs, side by side in one process;
the script checks they agree and prints each one's time per pair and the ratio.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Callable, Sequence

from ember.train.metric.text import edit_distance


def plain(a: Sequence[str], b: Sequence[str]) -> int:
    """The textbook row-by-row programme, one Python step per cell."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def timed(
    function: Callable[[str, str], int], pairs: list[tuple[str, str]]
) -> tuple[float, list[int]]:
    start = time.perf_counter()
    results = [function(a, b) for a, b in pairs]
    return (time.perf_counter() - start) / len(pairs), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=600, help="characters per text")
    parser.add_argument("--pairs", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(0)
    alphabet = "abcdefghij "
    pairs = [
        tuple("".join(rng.choice(alphabet) for _ in range(args.length)) for _ in range(2))
        for _ in range(args.pairs)
    ]
    reference, expected = timed(plain, pairs)  # type: ignore[arg-type]
    ours, found = timed(edit_distance, pairs)  # type: ignore[arg-type]
    assert found == expected, "the two programmes disagree"
    print(f"{args.pairs} pairs of {args.length} characters")
    print(f"plain dynamic programme: {reference * 1e3:.2f} ms per pair")
    print(f"ember edit_distance:     {ours * 1e3:.2f} ms per pair")
    print(f"ratio (plain / ember):   {reference / ours:.1f}x")


if __name__ == "__main__":
    main()
