"""The documentation runs: every Python example in docs/*.md and README.md is executed.

Rules, so the docs cannot drift from the code:

- Every fenced block whose language is `python` (or `py`) runs, in file order. The
  blocks of one page share one namespace (a page reads like one script) and run in a
  fresh temporary working directory of their own, so relative paths such as
  `artifacts/run` land there.
- A block that is not meant to run carries the marker `<!-- not run -->` on the line
  just before its opening fence (invisible on the rendered page), or the info string
  `title="not run"`. Such blocks are counted and compiled (they must stay valid
  Python), never executed.
- A line `--8<-- "path/to/file.py"` (pymdownx.snippets, path from the repository
  root) is replaced by that file; a block made only of such lines executes each file
  with `__file__` set to it, so the example files the guide shows run as they are.
- Nothing is set up for any page: each one runs as a reader would copy it (README's
  quick start reads the MNIST cache that `make test` fills). `SETUP` may give a page
  code to run before its first block.
- Every page runs twice in a row, in the same working directory, the second time in
  a fresh namespace: as a reader who runs the example again. A snippet that leaves
  something behind that stops its second run (a run directory without
  `overwrite=True`, a file it refuses to replace) fails.

All pages run in one subprocess (torch is imported once), so a page cannot disturb
the test process (signal handlers, sys.path, logging). `python tests/test_docs.py
docs/learner.md` runs pages by hand and prints what each block did.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOT_RUN = "<!-- not run -->"
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

SETUP: dict[str, str] = {}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")
_SNIPPET = re.compile(r"""^\s*-{1,}8<-{1,}\s+["'](?P<path>[^"']+)["']\s*$""")


@dataclass
class Block:
    """One fenced code block of a page."""

    line: int  # 1-based line of the opening fence
    language: str
    info: str
    code: str
    marked_not_run: bool

    @property
    def runs(self) -> bool:
        return self.language in ("python", "py") and not self.marked_not_run

    @property
    def is_python(self) -> bool:
        return self.language in ("python", "py")


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with their not-run marks."""
    lines = text.splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence, info = match["indent"], match["fence"], match["info"].strip()
        language = info.split()[0].lstrip(".").lower() if info else ""
        language = language.split("{")[0]
        before = (lines[j].strip() for j in range(index - 1, -1, -1))
        previous = next((line for line in before if line), "")
        marked = previous == NOT_RUN or re.search(r'title\s*=\s*"not run"', info) is not None
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence[0] * len(fence)) and set(closing) == {fence[0]}:
                break
            line = lines[end]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            end += 1
        found.append(Block(index + 1, language, info, "\n".join(body) + "\n", marked))
        index = end + 1
    return found


def _snippet_files(code: str) -> list[Path] | None:
    """The files of a block made only of snippet lines (None if it has other code)."""
    paths = []
    for line in code.splitlines():
        if not line.strip():
            continue
        match = _SNIPPET.match(line)
        if not match:
            return None
        paths.append(ROOT / match["path"])
    return paths or None


def _expand(code: str) -> str:
    def replace(line: str) -> str:
        match = _SNIPPET.match(line)
        return (ROOT / match["path"]).read_text(encoding="utf-8") if match else line

    return "\n".join(replace(line) for line in code.splitlines()) + "\n"


RUNS = 2
"""How many times in a row each page runs in its working directory."""


def run_page(page: Path, echo: bool = False, runs: int = RUNS) -> dict:
    """Execute the runnable blocks of `page` in order, `runs` times in a row in one
    working directory (each time in a fresh namespace); report the blocks run (of the
    first time), those not run, and the first error."""
    text = page.read_text(encoding="utf-8")
    found = [b for b in blocks(text) if b.is_python]
    report = {"run": 0, "not_run": sum(not b.runs for b in found), "error": None, "seconds": 0.0}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ember-docs-") as workdir:
        for time_run in range(1, runs + 1):
            ran, error = _run_blocks(page, found, workdir, echo)
            if time_run == 1:
                report["run"] = ran
            if error is not None:
                again = (
                    "" if time_run == 1 else f" (run {time_run} of the page, in the same folder)"
                )
                report["error"] = error.replace(" raised:", f"{again} raised:", 1)
                break
    report["seconds"] = round(time.perf_counter() - started, 2)
    return report


def _run_blocks(page: Path, found: list[Block], workdir: str, echo: bool) -> tuple[int, str | None]:
    """Run the blocks once in `workdir`, in a fresh namespace: (blocks run, first error)."""
    ran, error = 0, None
    module = types.ModuleType(f"docs_page_{re.sub(r'[^0-9A-Za-z]', '_', page.stem)}")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    cwd, path = os.getcwd(), list(sys.path)
    output = io.StringIO()
    os.chdir(workdir)
    try:
        setup = SETUP.get(page.name)
        if setup:
            exec(compile(setup, f"<setup of {page.name}>", "exec"), namespace)
        for block in found:
            where = f"{page.name}:{block.line}"
            if not block.runs:
                try:
                    compile(_expand(block.code), where, "exec")
                except SyntaxError:
                    error = (
                        f"The not-run block at {where} is not valid Python:\n"
                        f"{traceback.format_exc()}"
                    )
                    break
                continue
            try:
                with contextlib.redirect_stdout(output if not echo else sys.stdout):
                    files = _snippet_files(block.code)
                    if files is not None:
                        for file in files:
                            namespace["__file__"] = str(file)
                            source = file.read_text(encoding="utf-8")
                            exec(compile(source, str(file), "exec"), namespace)
                            del namespace["__file__"]
                    else:
                        exec(compile(_expand(block.code), where, "exec"), namespace)
            except BaseException:
                error = (
                    f"The block at {where} raised:\n{traceback.format_exc()}\n"
                    "Output of the page so far (last 3000 characters):\n"
                    f"{output.getvalue()[-3000:]}"
                )
                break
            ran += 1
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        sys.modules.pop(module.__name__, None)
    return ran, error


def _main(argv: list[str]) -> int:
    """`test_docs.py [--json OUT] PAGE...`: run pages, print or write the reports."""
    out = None
    if argv[:1] == ["--json"]:
        out, argv = argv[1], argv[2:]
    reports = {}
    for name in argv:
        page = Path(name).resolve()
        reports[str(page.relative_to(ROOT))] = run_page(page, echo=out is None)
    if out is not None:
        Path(out).write_text(json.dumps(reports), encoding="utf-8")
    else:
        print(json.dumps(reports, indent=2))
    return 0 if all(r["error"] is None for r in reports.values()) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(_main(sys.argv[1:]))


# The tests ---------------------------------------------------------------------------

import pytest  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("EMBER_PROGRESS_INTERVAL", "3600")
    env.setdefault("OMP_NUM_THREADS", "1")  # the examples' models are tiny: threads only cost
    env["NO_MKDOCS_2_WARNING"] = "1"
    return env


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("docs") / "reports.json"
    pages = [str(p) for p in PAGES if p.exists()]
    done = subprocess.run(
        [sys.executable, __file__, "--json", str(out), *pages],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
        cwd=ROOT,
    )
    assert out.exists(), f"the docs runner crashed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT)) for p in PAGES])
def test_every_python_block_of_the_page_runs(reports, page):
    report = reports[page]
    assert report["error"] is None, report["error"]


def test_the_docs_hold_runnable_examples(reports):
    ran = sum(r["run"] for r in reports.values())
    skipped = sum(r["not_run"] for r in reports.values())
    print(
        f"\ndocs: {ran} blocks executed, {skipped} marked not run, in "
        f"{sum(r['seconds'] for r in reports.values()):.1f} s"
    )
    assert ran >= 40, reports


def test_mkdocs_builds_the_site_strictly_without_warnings(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert "No module named mkdocs" not in output, (
        "mkdocs is not installed: pip install -r requirements-dev.txt"
    )
    assert done.returncode == 0, output
    warnings = [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "train" / "index.html").exists()


def test_a_raising_block_fails_and_a_marked_block_is_skipped(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n<!-- not run -->\n```python\nraise SystemExit('never')\n```\n\n"
        "```python\nassert x == 1\nraise ValueError('boom')\n```\n\n```python\nnot reached\n```\n",
        encoding="utf-8",
    )
    report = run_page(page)
    assert report["run"] == 1 and report["not_run"] == 1
    assert "page.md:10" in report["error"] and "ValueError: boom" in report["error"]

    page.write_text("<!-- not run -->\n```python\ndef broken(:\n```\n", encoding="utf-8")
    report = run_page(page)
    assert report["run"] == 0 and "not valid Python" in report["error"]


def test_a_page_that_cannot_run_twice_in_a_row_fails(tmp_path):
    """The second run of a page is in the folder the first one left: a snippet that
    cannot run again there fails, and the error says it was the second run."""
    page = tmp_path / "page.md"
    page.write_text("```python\nimport os\nos.mkdir('made')\n```\n", encoding="utf-8")
    report = run_page(page)
    assert report["run"] == 1
    assert "(run 2 of the page, in the same folder) raised" in report["error"]
    assert "FileExistsError" in report["error"]
    page.write_text(
        "```python\nimport os\nos.makedirs('made', exist_ok=True)\n```\n", encoding="utf-8"
    )
    assert run_page(page)["error"] is None
