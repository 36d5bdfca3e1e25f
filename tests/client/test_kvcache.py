"""The KV cache over a real cluster: mgmtd, one meta and three storage daemons (processes)."""

from __future__ import annotations

import array
import asyncio
import logging
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cluster import wait_until
from fs_cluster import FsCluster

from fs3.client import FileSystem, SyncFileSystem
from fs3.client.filesystem import StatResult
from fs3.client.kvcache import CacheUsage, KVCache, SyncKVCache, encode_entry, entry_name
from fs3.errors import FS3Error, StatusCode

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHUNK = 64 << 10


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(tmp_path_factory.mktemp("kv"), chunk_size=CHUNK) as c:
        yield c


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def fs(cluster: FsCluster) -> FileSystem:
    return await cluster.connect()


async def test_values_round_trip_across_chunks(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-round")
    values = {
        b"empty": b"",
        "text key": b"small value",
        b"\x00binary\xff": os.urandom(CHUNK - 10),  # the header pushes it over a chunk boundary
        b"big": os.urandom(3 * CHUNK + 777),
    }
    await cache.put_many(values.items())
    for key, value in values.items():
        assert await cache.get(key) == value
    assert await cache.get_many(list(values)) == list(values.values())
    # one file per entry, named by the key's hash, in a shard directory
    st = await fs.stat(cache.path_of(b"big"))
    assert st.st_size == len(encode_entry(b"big", values[b"big"]))
    assert cache.path_of(b"big") == f"/kv-round/{entry_name(b'big')[:2]}/{entry_name(b'big')}"


async def test_missing_keys_read_as_none_in_order(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-missing")
    assert await cache.get(b"nothing") is None  # not even the root exists yet
    await cache.put(b"a", b"1")
    await cache.put(b"c", b"3")
    assert await cache.get_many([b"a", b"b", b"c", b"d"]) == [b"1", None, b"3", None]
    assert await cache.get_many([]) == []
    assert await cache.contains(b"a") and not await cache.contains(b"b")
    assert await cache.delete(b"a") is True
    assert await cache.delete(b"a") is False
    assert await cache.get(b"a") is None


async def test_other_clients_see_puts_and_the_last_put_wins(cluster: FsCluster, fs: FileSystem) -> None:
    mine, theirs = KVCache(fs, "/kv-shared"), KVCache(await cluster.connect(), "/kv-shared")
    await mine.put(b"k", b"first")
    assert await theirs.get(b"k") == b"first"
    await theirs.put(b"k", b"second, longer value")
    assert await mine.get(b"k") == b"second, longer value"
    # racing puts of one key: a reader sees one whole value, never a mix or a part
    a, b = os.urandom(2 * CHUNK), os.urandom(3 * CHUNK)
    for _ in range(3):
        await asyncio.gather(mine.put(b"race", a), theirs.put(b"race", b), mine.get(b"race"))
        assert await theirs.get(b"race") in (a, b)
    # no temporary files are left behind by successful puts
    assert (await mine.usage()).temporary_files == 0


async def test_a_file_that_is_not_the_keys_entry_is_an_error(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-bad")
    await cache.put(b"good", b"value")
    for key in (b"foreign", b"other", b"cut"):
        await fs.mkdir(cache.path_of(key).rsplit("/", 1)[0], parents=True)
    await fs.write_file(cache.path_of(b"foreign"), b"not an entry at all, just bytes")
    with pytest.raises(FS3Error, match="not a cache entry") as e:
        await cache.get(b"foreign")
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    await fs.write_file(cache.path_of(b"other"), encode_entry(b"good", b"value"))
    with pytest.raises(FS3Error, match="another key"):
        await cache.get(b"other")
    assert await cache.get(b"good") == b"value"  # the cache itself is unharmed


async def test_entries_cut_short_or_grown_read_as_misses_until_put_again(fs: FileSystem) -> None:
    """An entry file damaged outside the cache (cut, grown, emptied) is no whole value: a miss,
    as get_many promises, which the next put replaces (every get of the key raised until then)."""
    cache = KVCache(fs, "/kv-cut")
    whole = encode_entry(b"cut", os.urandom(1000))
    for damaged in (whole[:-3], whole + b"more", whole[:500], whole[:10], whole[:2], b""):
        await fs.mkdir(cache.path_of(b"cut").rsplit("/", 1)[0], parents=True)
        await fs.write_file(cache.path_of(b"cut"), damaged)
        assert await cache.get(b"cut") is None
        assert await cache.get_many([b"cut"]) == [None]
        await cache.put(b"cut", b"again")
        assert await cache.get(b"cut") == b"again"


async def test_entries_that_fail_their_checksum_read_as_misses(
    fs: FileSystem, caplog: pytest.LogCaptureFixture
) -> None:
    # What a read racing a removal gets when meta has collected some of the entry's chunks (they
    # read as zeros), or all of them; and entries of the first format, which have no checksum.
    cache = KVCache(fs, "/kv-torn")
    value = os.urandom(3 * CHUNK)
    entry = encode_entry(b"torn", value)
    torn = entry[:CHUNK] + bytes(CHUNK) + entry[2 * CHUNK :]
    v1 = struct.pack("<8sIQ", b"fs3kv\x00\x01\x00", 2, 5) + b"v1" + b"value"
    for key, data in ((b"torn", torn), (b"zeros", bytes(len(entry))), (b"v1", v1)):
        await fs.mkdir(cache.path_of(key).rsplit("/", 1)[0], parents=True)
        await fs.write_file(cache.path_of(key), data)
    with caplog.at_level(logging.WARNING, logger="fs3.client.kvcache"):
        assert await cache.get_many([b"torn", b"zeros", b"v1"]) == [None, None, None]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "checksum that fails" in warned and "header of zeros" in warned
    await cache.put(b"torn", value)  # what a caller does after a miss mends the entry
    assert await cache.get(b"torn") == value
    assert (await cache.usage()).entries == 3  # eviction still sees every entry


async def test_a_get_racing_a_delete_reads_a_miss(
    cluster: FsCluster, fs: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reader finds the entry by path, then reads its chunks. Removed in between (here by
    # delete(); evict() and a put renaming over it do the same), the entry's chunks are collected
    # by meta and read as zeros: that is a miss, not a value of zeros nor a "bad magic" error.
    reader = await cluster.connect()
    cache, other = KVCache(reader, "/kv-race-delete"), KVCache(fs, "/kv-race-delete")
    await other.put(b"k", os.urandom(3 * CHUNK))
    raced = await _race_storage_reads(reader, monkeypatch, lambda: other.delete(b"k"))
    assert await cache.get(b"k") is None
    assert raced == [True]


async def test_a_get_racing_a_put_reads_the_new_value(
    cluster: FsCluster, fs: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = await cluster.connect()
    cache, other = KVCache(reader, "/kv-race-put"), KVCache(fs, "/kv-race-put")
    old, new = os.urandom(3 * CHUNK), os.urandom(2 * CHUNK)
    await other.put(b"k", old)
    raced = await _race_storage_reads(reader, monkeypatch, lambda: other.put(b"k", new))
    assert await cache.get_many([b"k"]) == [new]  # read again after the race: the new entry
    assert raced == [True]


async def _race_storage_reads(
    reader: FileSystem, monkeypatch: pytest.MonkeyPatch, action: Callable[[], Awaitable[object]]
) -> list[bool]:
    """Make ``reader``'s next storage read run ``action`` first, then wait until meta has collected
    the chunks that read asked for: the reader has looked an entry up, and it is gone."""
    real = reader.storage.batch_read_into
    raced: list[bool] = []

    async def read_after(ios: Any, buffers: Any) -> list[int]:
        if not raced:
            raced.append(True)
            await action()

            async def collected() -> bool:
                return not any(await reader.storage.batch_read(ios))

            await wait_until(collected, 30, "the removed entry's chunks collected")
        return await real(ios, buffers)

    monkeypatch.setattr(reader.storage, "batch_read_into", read_after)
    return raced


async def test_eviction_removes_only_the_caches_own_files(fs: FileSystem) -> None:
    cache = KVCache(fs, "/")  # the root of the whole file system, shared with everything else
    await cache.put(b"mine", b"an entry")
    shard = cache.path_of(b"mine").rsplit("/", 1)[0]
    elsewhere = next(c * 64 for c in "0123456789abcdef" if c * 2 != shard[1:])  # not in this shard
    others = [
        "/ml/weights.bin",  # a two-character directory that is not a shard
        "/AB/weights.bin",  # nor is this one
        f"{shard}/notes.txt",  # a foreign file in a shard
        f"{shard}/{elsewhere}",  # an entry's name, in the wrong shard
        f"{shard}/{entry_name(b'mine').upper()}",
        f"{shard}/{entry_name(b'mine')}.tmp",  # not a temporary name that put makes
    ]
    for path in others:
        await fs.mkdir(path.rsplit("/", 1)[0], parents=True)
        await fs.write_file(path, b"not the cache's")
    await fs.mkdir(f"{shard}/{shard[1:] * 32}")  # a directory with an entry's name
    assert await cache.usage() == CacheUsage(1, len(encode_entry(b"mine", b"an entry")), 0)
    assert (await cache.evict(0)).removed == 1
    for path in others:
        assert await fs.read_file(path) == b"not the cache's"
    await fs.write_file("/ab", b"a plain file with a shard's name")
    await cache.put(b"mine", b"again")
    assert (await cache.evict(0)).removed == 1
    assert await fs.read_file("/ab") == b"a plain file with a shard's name"


async def test_eviction_spares_an_entry_a_put_replaced_meanwhile(
    cluster: FsCluster, fs: FileSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    evictor = await cluster.connect()
    cache, writer = KVCache(evictor, "/kv-evict-race"), KVCache(fs, "/kv-evict-race")
    await writer.put(b"k", b"old value")
    path = cache.path_of(b"k")
    real_stat = evictor.stat
    raced: list[bool] = []

    async def stat_then_put(p: str | bytes, follow_symlinks: bool = True) -> StatResult:
        st = await real_stat(p, follow_symlinks)
        if p == path and not raced:  # evict() has seen the old entry: the put lands before its unlink
            raced.append(True)
            await writer.put(b"k", b"new value")
        return st

    monkeypatch.setattr(evictor, "stat", stat_then_put)
    report = await cache.evict(0)
    assert raced == [True]
    assert await writer.get(b"k") == b"new value"
    assert (report.removed, report.remaining_bytes) == (0, len(encode_entry(b"k", b"new value")))
    assert (await cache.evict(0)).removed == 1  # the new entry is a victim like any other
    assert await writer.get(b"k") is None


async def test_bad_keys_and_roots_are_refused(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-keys")
    for key in (b"", "x" * 5000):
        with pytest.raises(FS3Error) as e:
            await cache.put(key, b"v")
        assert e.value.code == StatusCode.INVALID_ARGUMENT
    for bad in (3, 2.5, None):  # bytes(3) was three zero bytes: a put stored under another key
        with pytest.raises(TypeError):
            await cache.put(bad, b"v")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await cache.get(bad)  # type: ignore[arg-type]
    assert await cache.get(bytes(3)) is None
    await cache.put(bytearray(b"k"), b"v")
    assert await cache.get("k") == b"v"
    with pytest.raises(FS3Error) as e:
        KVCache(fs, "relative/root")
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    with pytest.raises(FS3Error):
        await KVCache(fs, "/kv-keys").evict(-1)


async def test_eviction_removes_the_oldest_entries_and_dead_puts(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-evict", tmp_grace_s=0)
    for i in range(6):
        await cache.put(f"k{i}", bytes([i]) * 10_000)
    used = await cache.usage()
    assert used.entries == 6 and used.bytes == 6 * len(encode_entry(b"k0", bytes(10_000)))
    # a put that died leaves a temporary file: eviction sweeps it
    shard = cache.path_of(b"k0").rsplit("/", 1)[0]
    await fs.write_file(f"{shard}/{entry_name(b'k0')}.1f2e-0123456789ab.tmp", b"partial")
    assert (await cache.usage()).temporary_files == 1
    per_entry = used.bytes // 6
    report = await cache.evict(4 * per_entry)
    assert (report.removed, report.freed, report.temporary_removed) == (2, 2 * per_entry, 1)
    assert report.remaining_bytes == 4 * per_entry
    assert await cache.get_many([f"k{i}" for i in range(6)]) == [None, None] + [
        bytes([i]) * 10_000 for i in range(2, 6)
    ]
    assert await cache.usage() == type(used)(4, 4 * per_entry, 0)
    assert (await cache.evict(0)).removed == 4
    assert (await cache.usage()).entries == 0
    await cache.put(b"again", b"after eviction")  # shard directories still work
    assert await cache.get(b"again") == b"after eviction"


async def test_touch_on_get_makes_eviction_least_recently_used(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-lru", touch_on_get=True)
    for key in (b"a", b"b", b"c"):
        await cache.put(key, b"x" * 1000)
    assert await cache.get(b"a") == b"x" * 1000  # a is now the most recently used
    per_entry = (await cache.usage()).bytes // 3
    assert (await cache.evict(2 * per_entry)).removed == 1
    assert await KVCache(fs, "/kv-lru").get_many([b"a", b"b", b"c"]) == [b"x" * 1000, None, b"x" * 1000]


async def test_a_removed_cache_directory_is_made_again(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-gone")
    await cache.put(b"k", b"1")
    await fs.rmdir("/kv-gone", recursive=True)
    assert await cache.get(b"k") is None
    await cache.put(b"k", b"2")
    assert await cache.get(b"k") == b"2"


async def test_sync_facade(cluster: FsCluster) -> None:
    await asyncio.to_thread(_sync_cache, cluster.client_config("kv-sync"))


def _sync_cache(config: Path) -> None:
    with SyncFileSystem.connect(config) as fs:
        cache = SyncKVCache(fs, "/kv-sync")
        cache.put_many([(b"one", b"1"), (b"two", b"22")])
        assert cache.get_many([b"one", b"two", b"three"]) == [b"1", b"22", None]
        assert cache.contains(b"two") and cache.delete(b"two") and not cache.contains(b"two")
        assert cache.usage().entries == 1
        assert cache.evict(0).removed == 1
        assert cache.get(b"one") is None


async def test_values_of_any_buffer_round_trip(fs: FileSystem) -> None:
    """A value's bytes count, not its items: an array of two ints (8 bytes) was stored with a
    header saying 2, an entry read as a miss for ever; a 2-D view likewise. The root may be a
    pathlib.Path."""
    cache = KVCache(fs, Path("/kv-buffers"))  # type: ignore[arg-type]
    ints = array.array("i", [1, 2])
    await cache.put(b"ints", ints)
    await cache.put(b"grid", memoryview(bytearray(b"abcdefgh")).cast("B", (2, 4)))
    await cache.put(b"strided", memoryview(b"a-b-c-d-")[::2])
    assert await cache.get_many([b"ints", b"grid", b"strided"]) == [ints.tobytes(), b"abcdefgh", b"abcd"]


async def test_put_many_checks_first_keeps_the_last_value_and_returns_once_done(fs: FileSystem) -> None:
    cache = KVCache(fs, "/kv-many")
    with pytest.raises(TypeError):  # a value that is no buffer: nothing is stored
        await cache.put_many([(b"first", b"1" * 1000), (b"second", None)])  # type: ignore[list-item]
    await asyncio.sleep(0.5)
    assert await cache.get(b"first") is None
    await cache.put_many([(b"k", b"v%d" % i) for i in range(10)] + [(b"other", b"o")])
    assert await cache.get_many([b"k", b"other"]) == [b"v9", b"o"]
    # a put that fails (its shard's parent is a file) is raised once every other put has ended
    await fs.write_file("/kv-blocked", b"a file where the cache root would be")
    blocked = KVCache(fs, "/kv-blocked")
    with pytest.raises(FS3Error):
        await blocked.put_many([(b"x%d" % i, b"v") for i in range(20)])
    assert not [t for t in asyncio.all_tasks() if "KVCache.put" in repr(t.get_coro())]
