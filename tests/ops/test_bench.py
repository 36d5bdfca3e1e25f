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


def test_meta_bench_reports_rates_and_the_stores_group_commit() -> None:
    """A small run of bench/meta_bench.py against the daemon it starts: every phase ran all its
    operations, and the phases that commit show the store's batches from its /metrics."""
    import json

    out = fs3(
        "bench", "meta", "--clients", "2", "--layout", "many-dirs", "--items", "20", "--procs", "1", "--json"
    )
    assert out.returncode == 0, out.stderr
    rows = {r["phase"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"mkdir", "create", "stat", "open", "unlink"}
    assert all(r["ops"] == 40 and r["rate"] > 0 for r in rows.values())
    for phase in ("mkdir", "create", "unlink"):
        assert rows[phase]["kv_tx_per_batch"] >= 1 and rows[phase]["kv_commit_ms"] > 0, rows[phase]
