"""Every daemon serves Prometheus ``/metrics`` on its ``metrics_port``; the dashboard's queries
name metrics the daemons export."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from ops_helpers import alert_metrics, dashboard_metrics, fs3
from prometheus_client.parser import text_string_to_metric_families

from fs3.storage.chunk_files import file_fsync_persists_names

pytestmark = pytest.mark.timeout(120)


def scrape(d: Path, name: str) -> dict[str, list]:
    ports = json.loads((d / "local.json").read_text())["ports"]
    url = f"http://127.0.0.1:{ports[f'{name}_metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_mgmtd_metrics(small_cluster: Path) -> None:
    m = scrape(small_cluster, "mgmtd")
    assert m["fs3_mgmtd_is_primary"][0].value == 1
    states = {s.labels["state"]: s.value for s in m["fs3_mgmtd_targets"]}
    assert states.get("SERVING") == 2
    assert m["fs3_mgmtd_routing_version"][0].value > 0
    assert m["fs3_mgmtd_stop_fence_seconds"][0].value == 0  # none: its first start


def test_mgmtd_counts_and_times_its_requests(small_cluster: Path) -> None:
    """Every RPC by method and outcome, with its latency: the daemons' heartbeats and routing
    reads, and a call refused for want of credentials."""
    state = json.loads((small_cluster / "local.json").read_text())
    address = f"{state['host']}:{state['ports']['mgmtd']}"
    refused = fs3("admin", "--mgmtd", address, "--timeout", "10", "user-list")
    assert refused.returncode != 0
    m = scrape(small_cluster, "mgmtd")
    count = {(s.labels["method"], s.labels["code"]): s.value for s in m["fs3_mgmtd_requests"]}
    assert count.get(("Heartbeat", "OK"), 0) > 0 and count.get(("GetRoutingInfo", "OK"), 0) > 0, count
    assert count.get(("ListUsers", "UNAUTHENTICATED"), 0) >= 1, count
    seconds = {
        s.labels["method"]: s.value for s in m["fs3_mgmtd_request_seconds"] if s.name.endswith("_count")
    }
    assert seconds["Heartbeat"] >= count[("Heartbeat", "OK")], seconds


@pytest.mark.parametrize("node", ["storage-10001", "storage-10002"])
def test_storage_metrics(small_cluster: Path, node: str) -> None:
    m = scrape(small_cluster, node)
    assert any(n.startswith("fs3_storage_") for n in m)
    assert "fs3_storage_request_seconds" in m and "fs3_storage_sync_chunks" in m
    # each target says whether its small cold reads are off the event loop (a slow disk)
    off = m["fs3_storage_cold_reads_off_loop"]
    assert off and all(s.value in (0, 1) and s.labels["target"] for s in off), off
    assert len(m["fs3_storage_cold_read_seconds"]) == len(off)


def test_storage_target_space_metrics(small_cluster: Path) -> None:
    """Each target's disk space, its chunks' bytes and count, and its low-space flag."""
    used = chunks = 0.0
    for node in ("storage-10001", "storage-10002"):
        m = scrape(small_cluster, node)
        targets = {s.labels["target"] for s in m["fs3_storage_cold_reads_off_loop"]}
        got = {
            name: {s.labels["target"]: s.value for s in m[f"fs3_storage_target_{name}"]}
            for name in (
                "capacity_bytes",
                "free_bytes",
                "available_bytes",
                "used_bytes",
                "chunks",
                "low_space",
            )
        }
        assert all(set(v) == targets for v in got.values()), got
        for t in targets:
            assert got["capacity_bytes"][t] >= got["free_bytes"][t] >= got["available_bytes"][t] > 0, got
            assert got["low_space"][t] == 0
        used += sum(got["used_bytes"].values())
        chunks += sum(got["chunks"].values())
    assert chunks >= 2 and used >= 100_000, (chunks, used)  # the client's write, on both replicas


def test_storage_counts_client_bytes(small_cluster: Path) -> None:
    written = 0.0
    for node in ("storage-10001", "storage-10002"):
        m = scrape(small_cluster, node)
        written += sum(s.value for s in m.get("fs3_storage_bytes", []) if s.labels.get("dir") == "write")
    assert written >= 100_000  # the head counts the client's write


def test_storage_chunk_meta_and_file_sync_metrics(small_cluster: Path) -> None:
    """The client's write made new chunk versions, each a data file fsynced and two metadata
    changes (pending, commit) at the head, one at the tail, recorded by group commits; directories
    are fsynced only where the file system needs it (the cluster's own, as the daemons decided)."""
    changes = commits = commit_s = 0.0
    syncs: dict[str, float] = {"file": 0.0, "dir": 0.0}
    sync_s: dict[str, float] = {"file": 0.0, "dir": 0.0}
    for node in ("storage-10001", "storage-10002"):
        m = scrape(small_cluster, node)
        targets = {s.labels["target"] for s in m["fs3_storage_cold_reads_off_loop"]}
        assert {s.labels["target"] for s in m["fs3_storage_chunk_meta_changes"]} == targets
        changes += sum(s.value for s in m["fs3_storage_chunk_meta_changes"])
        commits += sum(s.value for s in m["fs3_storage_chunk_meta_commits"])
        commit_s += sum(s.value for s in m["fs3_storage_chunk_meta_commit_seconds"])
        for s in m["fs3_storage_chunk_file_syncs"]:
            syncs[s.labels["what"]] += s.value
        for s in m["fs3_storage_chunk_file_sync_seconds"]:
            sync_s[s.labels["what"]] += s.value
    assert changes >= commits >= 2 and changes >= 3 and commit_s > 0, (changes, commits, commit_s)
    assert syncs["file"] >= 2 and sync_s["file"] > 0, (syncs, sync_s)  # a version on each replica
    if file_fsync_persists_names(small_cluster):
        assert syncs["dir"] == 0 and sync_s["dir"] == 0, syncs
    else:
        assert syncs["dir"] >= 2, syncs


def test_meta_metrics(small_cluster: Path) -> None:
    m = scrape(small_cluster, "meta")
    methods = {s.labels.get("method") for s in m["fs3_meta_requests"]}
    assert {"Create", "Close"} <= methods, methods


@pytest.mark.parametrize("name", ["meta", "mgmtd"])
def test_kv_group_commit_metrics(small_cluster: Path, name: str) -> None:
    """Both daemons on the lmdb store report its group commit: the cluster's set-up committed
    (mgmtd: registrations, chain tables; meta: the files written), each batch made durable."""
    m = scrape(small_cluster, name)
    value = {n: m[n][0].value for n in m if n.startswith("fs3_kv_")}
    assert value["fs3_kv_commit_transactions"] >= value["fs3_kv_commit_batches"] >= 1, value
    assert value["fs3_kv_commit_seconds"] > 0 and value["fs3_kv_fsyncs"] >= 1, value
    assert value["fs3_kv_fsync_seconds"] > 0 and value["fs3_kv_commit_conflicts"] >= 0, value


def test_dashboard_and_alert_queries_name_exported_metrics(small_cluster: Path) -> None:
    exported: set[str] = set()
    for name in ("mgmtd", "meta", "storage-10001", "storage-10002"):
        exported |= set(scrape(small_cluster, name))
    daemons = ("fs3_mgmtd_", "fs3_storage_", "fs3_meta_", "fs3_kv_", "fs3_process_")
    for what, names in (("dashboard", dashboard_metrics()), ("alert rules", alert_metrics())):
        wanted = {n for n in names if n.startswith(daemons)}
        assert wanted, what
        missing = {n for n in wanted if n.removesuffix("_total") not in exported and n not in exported}
        assert not missing, f"the {what} query metrics no daemon exports: {sorted(missing)}"


def test_the_series_alerts_watch_exist_before_their_first_event(small_cluster: Path) -> None:
    """An alert on increase() misses a labelled counter's first event when the series appears only
    with it, already at 1: a storage daemon's data-error and damaged-copy series exist at 0 from
    its start. Failed reads of batch reads are counted by code (the batch read itself is OK)."""
    m = scrape(small_cluster, "storage-10001")
    failures = {s.labels["code"] for s in m["fs3_storage_read_failures"]}
    assert {"STORAGE_IO_ERROR", "STORAGE_CHECKSUM_MISMATCH", "INTERNAL"} <= failures, failures
    errors = {(s.labels["method"], s.labels["code"]) for s in m["fs3_storage_requests"]}
    assert ("Write", "STORAGE_IO_ERROR") in errors and ("Update", "STORAGE_CHECKSUM_MISMATCH") in errors
    targets = {s.labels["target"] for s in m["fs3_storage_target_used_bytes"]}
    damaged = {s.labels["target"] for s in m["fs3_storage_damaged_reads"]}
    assert targets and targets <= damaged, (targets, damaged)


def test_meta_read_session_metrics(small_cluster: Path) -> None:
    """A read-only open's session, written just after its answer, counts in meta's metrics (a
    real meta daemon: the queue's writer runs on its uvloop)."""
    import asyncio

    from fs3.client import FileSystem

    async def read_twice() -> None:
        fs = await FileSystem.connect(small_cluster / "config" / "client.toml")
        async with fs:
            async with await fs.open("/read-session.bin", "w") as f:
                await f.write(b"x" * 100)
            for _ in range(2):
                async with await fs.open("/read-session.bin", "r") as f:
                    assert await f.read(1000) == b"x" * 100

    def value(m: dict, name: str) -> float:
        return m[name][0].value if name in m else 0.0

    before = scrape(small_cluster, "meta")
    asyncio.run(read_twice())
    # the last close's end is written just after its answer: wait until the queue is empty
    deadline = time.monotonic() + 30
    while value(after := scrape(small_cluster, "meta"), "fs3_meta_read_sessions_queued") > 0:
        assert time.monotonic() < deadline, "meta's read-session queue did not drain"
        time.sleep(0.05)

    # two sessions ended: each either written and cleared, or cleared while still queued
    assert (
        value(after, "fs3_meta_read_sessions_cleared") - value(before, "fs3_meta_read_sessions_cleared") == 2
    )
    assert value(after, "fs3_meta_read_sessions_batches") > value(before, "fs3_meta_read_sessions_batches")
    assert value(after, "fs3_meta_read_sessions_lost") == value(after, "fs3_meta_read_sessions_dropped") == 0
    assert value(after, "fs3_meta_read_sessions_queued") >= 0
