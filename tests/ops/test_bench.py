"""``fs3 bench``: lists the benchmarks of bench/ and runs one with its own arguments."""

from __future__ import annotations

import pytest
from ops_helpers import REPO, fs3

pytestmark = pytest.mark.timeout(60)


def test_lists_every_benchmark() -> None:
    out = fs3("bench")
    assert out.returncode == 0
    for script in (REPO / "bench").glob("*_bench.py"):
        assert script.stem.removesuffix("_bench") in out.stdout


def test_runs_a_benchmark_with_its_arguments() -> None:
    out = fs3("bench", "kv", "--help")
    assert out.returncode == 0 and "kv_bench" in out.stdout


def test_unknown_benchmark_is_a_usage_error() -> None:
    out = fs3("bench", "no-such")
    assert out.returncode == 2 and "no-such" in out.stderr
