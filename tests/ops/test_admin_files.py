"""``fs3 admin`` file commands (ls, stat, checksum, gc-list) against a running local cluster."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from ops_helpers import fs3, wait_for

pytestmark = pytest.mark.timeout(120)


def admin_json(cluster: Path, *args: str) -> object:
    out = fs3("admin", *args, "--local-dir", str(cluster), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def connect(cluster: Path):  # type: ignore[no-untyped-def]
    from fs3.client import FileSystem

    return FileSystem.connect(cluster / "config" / "client.toml")


def test_ls_and_stat_of_directories_and_symlinks(small_cluster: Path) -> None:
    async def make() -> None:
        async with await connect(small_cluster) as fs:
            await fs.mkdir("/d")
            await fs.write_file("/d/f", b"12345")
            await fs.symlink("f", "/d/l")

    asyncio.run(make())
    entries = {e["name"]: e for e in admin_json(small_cluster, "ls", "/d")}
    assert entries["f"]["type"] == "file" and entries["f"]["size"] == 5
    assert entries["l"]["type"] == "symlink" and entries["l"]["mode"].startswith("l")
    assert admin_json(small_cluster, "stat", "/d/l")["type"] == "symlink"  # not followed
    assert admin_json(small_cluster, "stat", "/d")["type"] == "dir"
    missing = fs3("admin", "stat", "/nope", "--local-dir", str(small_cluster))
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr


def test_stat_layout_and_checksum_with_two_replicas(small_cluster: Path) -> None:
    st = admin_json(small_cluster, "stat", "/m.bin", "--layout")
    assert st["size"] == 100_000 and len(st["chunks"]) == 1
    (chunk,) = st["chunks"]
    assert len(chunk["targets"]) == 2 and {t["state"] for t in chunk["targets"]} == {"SERVING"}
    report = admin_json(small_cluster, "checksum", "/m.bin")
    assert report["mismatches"] == 0 and report["chunks"][0]["status"] == "ok"
    assert len({r.split(":", 1)[1] for r in report["chunks"][0]["replicas"]}) == 1


def test_gc_list_shows_a_file_unlinked_while_open(small_cluster: Path) -> None:
    async def scenario() -> int:
        async with await connect(small_cluster) as fs:
            f = await fs.open("/doomed.bin", "w")
            await f.write(b"x" * 70_000)
            await f.fsync()
            inode = f.inode_id
            await fs.unlink("/doomed.bin")
            queued = await asyncio.to_thread(admin_json, small_cluster, "gc-list")
            assert inode in [e["inode"] for e in queued], queued
            await f.close()
            return inode

    inode = asyncio.run(scenario())
    # once closed, the collector (every gc_interval_s, 5 s by default) removes it
    wait_for(
        lambda: inode not in [e["inode"] for e in admin_json(small_cluster, "gc-list")],
        60,
        "the collector to remove the unlinked file",
        interval_s=0.5,
    )
