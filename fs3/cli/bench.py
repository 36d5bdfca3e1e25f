"""``fs3 bench [NAME [ARGS...]]``: run one of the benchmarks in ``bench/`` (each prints a table, or
JSON with ``--json``); without NAME, list them with their first docstring line.

The benchmarks live in the source tree, next to the package (an editable install, or a checkout);
an install without them says so and exits 69.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

EX_UNAVAILABLE = 69


def bench_dir() -> Path | None:
    """The source tree's ``bench/`` folder, or None when this install has none."""
    env = os.environ.get("FS3_BENCH_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "bench")
    return next((c for c in candidates if c.is_dir()), None)


def benchmarks(folder: Path) -> dict[str, str]:
    """name → the first line of its docstring, for every ``*_bench.py``."""
    out = {}
    for path in sorted(folder.glob("*_bench.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        except SyntaxError:
            doc = ""
        out[path.stem.removesuffix("_bench")] = doc.strip().splitlines()[0] if doc.strip() else ""
    return out


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 bench``; returns the exit status."""
    folder = bench_dir()
    if folder is None:
        print("fs3 bench: no bench/ folder next to this install (set FS3_BENCH_DIR)", file=sys.stderr)
        return EX_UNAVAILABLE
    found = benchmarks(folder)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: fs3 bench NAME [ARGS...]   (fs3 bench NAME --help for a benchmark's options)\n")
        width = max((len(n) for n in found), default=0)
        for name, doc in found.items():
            print(f"  {name.ljust(width)}  {doc}")
        return 0
    name = argv[0].removesuffix(".py").removesuffix("_bench")
    if name not in found:
        print(f"fs3 bench: no benchmark {argv[0]!r}; one of {', '.join(found)}", file=sys.stderr)
        return 2
    script = folder / f"{name}_bench.py"
    # exec replaces this process, so the benchmark's exit status and signals are the command's own;
    # the benchmark's usage names it as this command (its argparse prog), not as its script
    os.environ["FS3_BENCH_PROG"] = f"fs3 bench {name}"
    os.execv(sys.executable, [sys.executable, str(script), *argv[1:]])
    return 0  # not reached
