"""train_blobs.py, killed (SIGKILL) just before one file operation of one mid-epoch
checkpoint write: every instant of that write can be hit, one run each.

Usage: python kill_in_checkpoint.py DIR --save S --kill-at K [train_blobs.py options]

The S-th mid-epoch checkpoint of the run (1-based) is the one; the process kills itself
just before the K-th file operation (a file or folder made, written, synced, renamed or
removed) from the start of that checkpoint's write to the end of its retention. With
`--kill-at 0` it kills nothing and writes the number of those operations to `--count`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import train_blobs  # noqa: E402

OPERATIONS = ("open", "mkdir", "replace", "rename", "unlink", "rmdir", "fsync")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", type=int, required=True)
    parser.add_argument("--kill-at", type=int, required=True)
    parser.add_argument("--count", default=None)
    args, rest = parser.parse_known_args(argv)

    from ember.train.checkpoint.file import FileCheckpointer

    seen = {"saves": 0, "armed": False, "operations": 0}

    def counted(operation: Any) -> Any:
        def run(*arguments: Any, **options: Any) -> Any:
            if seen["armed"]:
                seen["operations"] += 1
                if seen["operations"] == args.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
            return operation(*arguments, **options)

        return run

    for name in OPERATIONS:
        setattr(os, name, counted(getattr(os, name)))
    save = FileCheckpointer.save

    def watched(
        self: Any,
        epoch: int,
        model: Any,
        optimizer: Any,
        state: dict[str, Any],
        history: Any = (),
        on_saved: Any = None,
        before_write: Any = None,
    ) -> None:
        if not state["learner"]["complete"]:
            seen["saves"] += 1
        seen["armed"] = not state["learner"]["complete"] and seen["saves"] == args.save

        def saved(names: list[str]) -> None:
            if seen["armed"]:
                seen["armed"] = False
                if args.count is not None:
                    Path(args.count).write_text(str(seen["operations"]))
            if on_saved is not None:
                on_saved(names)

        save(self, epoch, model, optimizer, state, history, saved, before_write)

    FileCheckpointer.save = watched  # type: ignore[method-assign]
    return train_blobs.main(rest)


if __name__ == "__main__":
    sys.exit(main())
