"""``fs3 admin`` file commands (ls, stat, checksum, gc-list, set-layout) against a running local
cluster."""

from __future__ import annotations

import asyncio
import errno
import json
from pathlib import Path

import pytest
from cluster import expect_errno
from ops_helpers import fs3, wait_for

from fs3.net.transport import format_address

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
    assert "a path on this machine" not in missing.stderr
    # a path of this machine (through a mount, most likely) is not one inside fs3: said so
    local = fs3("admin", "ls", str(small_cluster), "--local-dir", str(small_cluster))
    assert local.returncode == 1 and f"{small_cluster} is a path on this machine" in local.stderr, (
        local.stderr
    )


def test_stat_layout_and_checksum_with_two_replicas(small_cluster: Path) -> None:
    st = admin_json(small_cluster, "stat", "/m.bin", "--layout")
    assert st["size"] == 100_000 and len(st["chunks"]) == 1
    (chunk,) = st["chunks"]
    assert len(chunk["targets"]) == 2 and {t["state"] for t in chunk["targets"]} == {"SERVING"}
    report = admin_json(small_cluster, "checksum", "/m.bin")
    assert report["mismatches"] == 0 and report["chunks"][0]["status"] == "ok"
    assert len({r.split(":", 1)[1] for r in report["chunks"][0]["replicas"]}) == 1


def test_checksum_of_a_sparse_file_lists_the_chunks_it_holds(small_cluster: Path) -> None:
    """The check made a row for every chunk place the length spans: a 16 GiB sparse file took
    seconds and listed 262,144 chunks, one of 256 TiB never ended."""

    async def make() -> None:
        async with await connect(small_cluster) as fs:
            await fs.write_file("/sparse.bin", b"head")
            await fs.truncate("/sparse.bin", 1 << 48)  # 256 TiB: 2**28 chunk places of 1 MiB
            async with await fs.open("/sparse.bin", "r+") as f:
                await f.pwrite(b"tail", (1 << 48) - 4)

    asyncio.run(make())
    out = fs3("admin", "checksum", "/sparse.bin", "--local-dir", str(small_cluster), "--json", timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert [c["chunk"] for c in report["chunks"]] == [0, (1 << 28) - 1], report
    assert {c["status"] for c in report["chunks"]} == {"ok"}
    text = fs3("admin", "checksum", "/sparse.bin", "--local-dir", str(small_cluster), timeout=60)
    assert "2 chunks held (its length spans 268435456)" in text.stdout, text.stdout + text.stderr


def test_checksum_reads_every_replica_back_and_finds_a_damaged_one(small_cluster: Path) -> None:
    """Replicas whose metadata agree but whose bytes on one disk are damaged: the metadata
    comparison alone said ok (exit 0); reading each replica back finds the damaged copy, and that
    read has its daemon repair it from the other replica."""
    asyncio.run(_write(small_cluster, "/damaged.bin", bytes(range(256)) * 400))
    st = admin_json(small_cluster, "stat", "/damaged.bin", "--layout")
    victim = st["chunks"][0]["targets"][0]["target_id"]
    (path,) = small_cluster.glob(f"storage/*/target-{victim}/chunks/*/{st['inode']:016x}{0:016x}.*")
    with open(path, "r+b") as f:
        f.seek(50_000)
        f.write(b"\xff\x00\xff")
    quick = fs3("admin", "checksum", "/damaged.bin", "--metadata-only", "--local-dir", str(small_cluster))
    assert quick.returncode == 0, quick.stdout + quick.stderr
    out = fs3("admin", "checksum", "/damaged.bin", "--local-dir", str(small_cluster), "--json")
    assert out.returncode == 3, out.stdout + out.stderr  # EX_MISMATCH
    report = json.loads(out.stdout)
    (row,) = report["chunks"]
    assert report["mismatches"] == 1 and row["status"] == "DAMAGED", row
    (bad,) = [r for r in row["replicas"] if "DAMAGED" in r]
    assert bad.startswith(f"{victim}:"), row
    # the read that found it had the daemon repair its copy from the other replica
    wait_for(
        lambda: fs3("admin", "checksum", "/damaged.bin", "--local-dir", str(small_cluster)).returncode == 0,
        30,
        "the damaged copy to be repaired",
        interval_s=0.5,
    )


async def _write(cluster: Path, path: str, data: bytes) -> None:
    async with await connect(cluster) as fs:
        await fs.write_file(path, data)


def test_gc_list_shows_a_file_unlinked_while_open(small_cluster: Path) -> None:
    async def scenario() -> int:
        async with await connect(small_cluster) as fs:
            f = await fs.open("/doomed.bin", "w")
            await f.write(b"x" * 70_000)
            await f.fsync()
            inode = f.inode_id
            await fs.unlink("/doomed.bin")
            queued = await asyncio.to_thread(admin_json, small_cluster, "gc-list")
            (entry,) = [e for e in queued if e["inode"] == inode]
            # held open by this client: the collector waits for the close
            assert entry["state"] == "open" and entry["open_by"] == str(fs.meta.client_id), entry
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


def test_set_layout_applies_to_files_created_later(small_cluster: Path) -> None:
    async def mkdir_and_write(path: str, data: bytes) -> None:
        async with await connect(small_cluster) as fs:
            if path == "/lay/before":
                await fs.mkdir("/lay")
            await fs.write_file(path, data)

    asyncio.run(mkdir_and_write("/lay/before", b"b" * 200_000))
    set_ = admin_json(small_cluster, "set-layout", "/lay", "--chunk-size", "64K", "--stripe", "1")
    assert (set_["chunk_size"], set_["stripe_count"]) == (64 << 10, 1), set_
    asyncio.run(mkdir_and_write("/lay/after", b"a" * 200_000))
    after = admin_json(small_cluster, "stat", "/lay/after", "--layout")
    assert len(after["chunks"]) == 4 and after["size"] == 200_000, after  # 200,000 bytes in 64 KiB chunks
    before = admin_json(small_cluster, "stat", "/lay/before", "--layout")
    assert len(before["chunks"]) == 1, before  # the cluster's 1 MiB chunks: created before the change

    for args, status, words in (
        (["/lay", "--chunk-size", "100K"], 1, "chunk"),  # not a power of two
        (["/lay", "--chunk-size", "128M"], 1, "chunk"),  # above 64 MiB
        (["/lay/after", "--stripe", "1"], 1, "directory"),  # a file
        (["/nope", "--stripe", "1"], 1, "nope"),
        (["/lay"], 2, "at least one"),
        (["/lay", "--chunk-size", "lots"], 2, "size"),
        (["/lay", "--stripe", "-1"], 2, "stripe"),
        (["/lay", "--stripe", str(1 << 32)], 2, "stripe"),
    ):
        out = fs3("admin", "set-layout", *args, "--local-dir", str(small_cluster))
        assert out.returncode == status, (args, out.stdout, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert words in out.stderr.lower() and (status == 2 or len(lines) == 1), (args, out.stderr)
    assert admin_json(small_cluster, "stat", "/lay")["type"] == "dir"


def test_set_layout_takes_a_chain_table_uploaded_a_moment_ago(small_cluster: Path) -> None:
    """set-layout --chain-table N right after upload-chain-table N was refused ("does not exist")
    until meta's next routing refresh, 2 s later (helper review): meta asks mgmtd first."""
    from fs3.client.mgmtd_client import MgmtdClient

    chain_ids = [c["chain_id"] for c in admin_json(small_cluster, "list-chains")]
    state = json.loads((small_cluster / "local.json").read_text())
    mgmtd = format_address(state["host"], state["ports"]["mgmtd"])
    token = (small_cluster / "admin.token").read_text().strip()

    async def upload_then_set() -> None:
        async with await connect(small_cluster) as fs, MgmtdClient([mgmtd], token=token) as admin:
            await fs.mkdir("/table7")
            await admin.upload_chain_table(7, chain_ids)
            layout = await fs.set_layout("/table7", chain_table_id=7)  # at once
            assert layout.chain_table_id == 7
            await expect_errno(errno.EINVAL, fs.set_layout("/table7", chain_table_id=8))

    asyncio.run(upload_then_set())


def test_set_layout_with_a_stripe_above_the_chain_table_says_what_files_get(small_cluster: Path) -> None:
    """The cluster has 1 chain: meta keeps the stripe of 100 and gives each new file that 1 chain
    (it said 'stripe 100')."""

    async def mkdir() -> None:
        async with await connect(small_cluster) as fs:
            await fs.mkdir("/wide")

    asyncio.run(mkdir())
    out = fs3("admin", "set-layout", "/wide", "--stripe", "100", "--local-dir", str(small_cluster))
    assert out.returncode == 0, out.stderr
    assert (
        "files created here get chunk size 1048576, stripe 1, not 100 (chain table 1 has 1 chain and a "
        "file takes each at most once; the directory keeps 100 for when the table grows), chain table 1"
    ) in out.stdout, out.stdout
    shown = admin_json(small_cluster, "set-layout", "/wide", "--stripe", "100")
    assert (shown["stripe_count"], shown["files_stripe"]) == (100, 1), shown

    async def create() -> None:
        async with await connect(small_cluster) as fs:
            await fs.write_file("/wide/f", b"x")

    asyncio.run(create())
    assert admin_json(small_cluster, "stat", "/wide/f")["layout"]["stripe"] == 1
    fits = admin_json(small_cluster, "set-layout", "/wide", "--stripe", "1")
    assert "files_stripe" not in fits


def test_file_commands_without_the_cluster_secret_say_they_need_it(small_cluster: Path) -> None:
    """They reach meta and storage as cluster members; without the secret they tried the development
    one, and the refusal read as the server's fault ("does not know the cluster secret")."""
    state = json.loads((small_cluster / "local.json").read_text())
    mgmtd = f"{state['host']}:{state['ports']['mgmtd']}"
    out = fs3("admin", "ls", "/", "--mgmtd", mgmtd, "--token-file", str(small_cluster / "admin.token"))
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("fs3 admin ls: ") and "--secret-file" in last, out.stderr


def test_ls_lists_a_directory_of_any_size_with_names_told_apart(small_cluster: Path) -> None:
    """ls of a directory of more than 4,096 entries failed (one batch stat, which meta refuses
    past 4,096); names that are not UTF-8 all showed as U+FFFD (one name for many) and a newline
    in a name broke the text output's lines."""
    odd = [b"caf\xe9", b"caf\xe8", b"two\nlines", b"back\\slash", "naïve".encode()]

    async def make() -> None:
        async with await connect(small_cluster) as fs:
            await fs.mkdir("/big")
            for name in odd:
                await fs.write_file(b"/big/" + name, b"x")
            sem = asyncio.Semaphore(64)

            async def one(i: int) -> None:
                async with sem:
                    await fs.mknod(f"/big/f{i:05d}", 0o100644)

            await asyncio.gather(*(one(i) for i in range(4200)))

    asyncio.run(make())
    rows = admin_json(small_cluster, "ls", "/big")
    names = [r["name"] for r in rows]  # type: ignore[union-attr]
    assert len(names) == len(set(names)) == 4200 + len(odd)
    assert {"caf\\xe9", "caf\\xe8", "two\\nlines", "back\\\\slash", "naïve"} <= set(names)
    text = fs3("admin", "ls", "/big", "--local-dir", str(small_cluster))
    assert text.returncode == 0, text.stderr
    assert len(text.stdout.strip().splitlines()) == 1 + 4200 + len(odd)  # a header, a line each
