"""The `ember` command: `ember summary DIR`, `ember plot DIR [-o OUT]`, `ember compare
DIR... [-o OUT]`, `ember runs ROOT`, `ember repair DIR`, `ember --version`."""

from __future__ import annotations

import argparse
import sys

from ember._version import __version__
from ember.errors import EmberError
from ember.printable import printable, printable_lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ember", description="Inspect ember training runs.")
    parser.add_argument("--version", action="version", version=f"ember {__version__}")
    commands = parser.add_subparsers(dest="command")
    summary = commands.add_parser("summary", help="print the metric summary of a run")
    summary.add_argument("artifact_dir")
    plot = commands.add_parser(
        "plot", help="write PNG charts of a run's metrics (needs matplotlib: ember[plot])"
    )
    plot.add_argument("artifact_dir")
    plot.add_argument(
        "-o", "--output-dir", default=None, help="where to write them (default: ARTIFACT_DIR/plots)"
    )
    compare = commands.add_parser(
        "compare", help="compare runs: a table, and with -o overlaid PNG charts per metric"
    )
    compare.add_argument("artifact_dirs", nargs="+", metavar="artifact_dir")
    compare.add_argument(
        "-o", "--output-dir", default=None, help="write one PNG per metric there (needs matplotlib)"
    )
    runs = commands.add_parser("runs", help="list the runs under a folder with their status")
    runs.add_argument("root")
    repair = commands.add_parser(
        "repair",
        help="make a run's damaged or missing records whole again (history.jsonl, "
        "sessions.json, hparams.json), keeping the damaged files as <name>.damaged",
    )
    repair.add_argument("artifact_dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "summary":
            from ember.train.summary import LearnerSummary

            _say(LearnerSummary.from_dir(args.artifact_dir).table())
            return 0
        if args.command == "plot":
            from ember.plot import plot_run

            for path in plot_run(args.artifact_dir, args.output_dir):
                _say(printable(path))
            return 0
        if args.command == "compare":
            from ember.comparison import compare as compare_runs

            comparison = compare_runs(args.artifact_dirs)
            _say(comparison.table())
            if args.output_dir is not None:
                for path in comparison.plot(args.output_dir):
                    _say(printable(path))
            return 0
        if args.command == "runs":
            from ember.comparison import runs as find_runs
            from ember.comparison import runs_table

            _say(runs_table(find_runs(args.root), args.root))
            return 0
        if args.command == "repair":
            from ember.train.repair import repair_run

            done = repair_run(args.artifact_dir)
            for line in done:
                _say(printable(line))
            if not done:
                where = printable(args.artifact_dir)
                _say(f"Nothing to repair: every record of {where} reads back as written.")
            return 0
    except EmberError as error:
        print(f"ember: {printable(error)}", file=sys.stderr)
        return 2
    parser.print_help()
    return 1


def _say(text: str) -> None:
    """Print text laid out by ember (its fields escaped already), every line of it
    escaped once more: nothing read from a run reaches the terminal raw."""
    print(printable_lines(text))


if __name__ == "__main__":
    sys.exit(main())
