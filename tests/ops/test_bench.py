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


@pytest.mark.parametrize("script", sorted((REPO / "bench").glob("*_bench.py")), ids=lambda p: p.stem)
def test_runs_a_benchmark_with_its_arguments(script) -> None:  # type: ignore[no-untyped-def]
    """Its own --help, whose usage names the command the user typed, not the script."""
    name = script.stem.removesuffix("_bench")
    out = fs3("bench", name, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: fs3 bench {name} "), out.stdout[:200]


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


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--layout", "sideways"], "'sideways'"),
        (["--layout", "one-dir,many"], "'many'"),
        (["--clients", "16,x"], "'16,x'"),
        (["--clients", "0"], "'0'"),
        (["--items", "0"], "--items"),
        (["--runs", "0"], "--runs"),
    ],
)
def test_meta_bench_refuses_what_it_cannot_run(args, named) -> None:  # type: ignore[no-untyped-def]
    """A usage error naming the bad value, before any daemon starts (a layout it did not know
    once ran as many-dirs, and its rows were labelled with the name given)."""
    out = fs3("bench", "meta", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert named in out.stderr and "Traceback" not in out.stderr
    assert not out.stdout


def test_meta_bench_runs_each_case_again_and_shows_the_medians(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--runs 2: every phase twice, each run on a store (and daemon) of its own, then the medians."""
    import json

    args = ("bench", "meta", "--clients", "2", "--layout", "many-dirs", "--items", "10", "--procs", "1")
    out = fs3(*args, "--runs", "2", "--json", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many-dirs-2-run1", "many-dirs-2-run2"]
    assert all(
        (tmp_path / name / "kv" / "data.mdb").exists() for name in ("many-dirs-2-run1", "many-dirs-2-run2")
    )
    rows = json.loads(out.stdout)
    assert sorted((r["run"], r["phase"]) for r in rows) == sorted(
        (run, phase) for run in (1, 2) for phase in ("mkdir", "create", "stat", "open", "unlink")
    )
    assert all(r["ops"] == 20 and r["rate"] > 0 for r in rows)
    out = fs3(*args, "--runs", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    at = lines.index("medians of 2 runs (ops/s: lowest, median, highest)")
    medians = [line.split() for line in lines[at + 2 :]]
    assert [m[2] for m in medians] == ["mkdir", "create", "stat", "open", "unlink"]
    assert all(0 < float(m[3]) <= float(m[4]) <= float(m[5]) for m in medians), medians
