"""Length settlement, truncate and garbage collection against a fake storage that records every
chunk: a random workload proves no chunk is left behind and none is removed while reachable."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from meta_tree import BOB

from fs3.capability import CLOCK_SKEW_S
from fs3.errors import FS3Error, StatusCode
from fs3.kv import prefix_end
from fs3.meta import schema
from fs3.meta.gc import Collector
from fs3.meta.layout import DEFAULT_CHUNK_SIZE
from fs3.meta.permissions import ROOT, W_OK, Credentials
from fs3.meta.schema import ROOT_ID
from fs3.meta.store import MetaStore
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(90)

ALICE = Credentials(1001, 100)


class FakeChunks:
    """Chunks by inode: {chunk index: length}. Removal asserts the file is unreachable."""

    def __init__(self) -> None:
        self.chunks: dict[int, dict[int, int]] = {}
        self.store: MetaStore | None = None
        self.removals: list[int] = []

    def write(self, inode_id: int, offset: int, length: int, chunk: int = DEFAULT_CHUNK_SIZE) -> None:
        files = self.chunks.setdefault(inode_id, {})
        end = offset + length
        while offset < end:
            i, off = divmod(offset, chunk)
            n = min(chunk - off, end - offset)
            files[i] = max(files.get(i, 0), off + n)
            offset += n

    async def file_length(self, layout: m.Layout, inode_id: int) -> int | None:
        files = self.chunks.get(inode_id, {})
        return max((i * layout.chunk_size + n for i, n in files.items()), default=0)

    async def truncate(self, layout: m.Layout, inode_id: int, length: int) -> None:
        files = self.chunks.get(inode_id, {})
        for i in list(files):
            start = i * layout.chunk_size
            if start >= length:
                del files[i]
            elif start + files[i] > length:
                files[i] = length - start

    async def remove(self, layout: m.Layout, inode_id: int) -> None:
        assert self.store is not None
        sprefix = schema.session_prefix(inode_id)

        async def reachable(tr) -> bool:
            raw = await tr.get(schema.inode_key(inode_id))
            if raw is None:
                return False
            return m.Inode.FromString(raw).nlink > 0 or bool(
                await tr.get_range(sprefix, prefix_end(sprefix), 1)
            )

        assert not await self.store.db.run(reachable, read_only=True), f"removing reachable inode {inode_id}"
        self.removals.append(inode_id)
        self.chunks.pop(inode_id, None)


@pytest.fixture
def fake() -> FakeChunks:
    return FakeChunks()


@pytest.fixture
def chunked(store: MetaStore, fake: FakeChunks) -> MetaStore:
    store.chunks = fake
    fake.store = store
    return store


async def test_close_queries_storage_and_truncate_trims(chunked: MetaStore, fake: FakeChunks) -> None:
    s = chunked
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644, session=True)
    f = r.inode.id
    fake.write(f, 0, 3 * DEFAULT_CHUNK_SIZE + 10)
    assert (await s.close(f, r.session_id, 0, True)).size == 3 * DEFAULT_CHUNK_SIZE + 10
    await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=DEFAULT_CHUNK_SIZE + 5))
    assert fake.chunks[f] == {0: DEFAULT_CHUNK_SIZE, 1: 5}
    _, sid = await s.open(ROOT, f, 1 | 0o1000)
    assert fake.chunks[f] == {} and (await s.stat(f)).size == 0
    await s.close(f, sid)


async def test_a_truncate_refused_for_another_field_trims_nothing(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """The trim comes before the commit, but only for a request that would succeed as a whole: a
    writer who is not the owner asking for a new size and a new mode is refused (EPERM, for the
    mode) and the file's bytes stay on storage."""
    s = chunked
    r = await s.create(ROOT, ROOT_ID, b"f", 0o666, session=True)
    f = r.inode.id
    fake.write(f, 0, 2 * DEFAULT_CHUNK_SIZE)
    await s.close(f, r.session_id, 0, True)
    with pytest.raises(FS3Error) as e:
        await s.setattr(BOB, f, m.SetattrReq(fields=m.SETATTR_SIZE | m.SETATTR_MODE, size=0, mode=0o600))
    assert e.value.code == StatusCode.META_NOT_PERMITTED
    assert fake.chunks[f] == {0: DEFAULT_CHUNK_SIZE, 1: DEFAULT_CHUNK_SIZE}
    assert (await s.stat(f)).size == 2 * DEFAULT_CHUNK_SIZE
    assert (await s.setattr(BOB, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=10))).size == 10
    assert fake.chunks[f] == {0: 10}


async def test_a_writer_report_made_across_a_truncate_does_not_bring_the_length_back(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """`logrotate copytruncate`: another client truncates a log its writer holds open; the writer's
    written length (the highest byte it ever wrote) predates the truncate and must not be the file's
    length again: meta asks storage, then and for every later report up to that length."""
    s = chunked
    r = await s.create(ROOT, ROOT_ID, b"log", 0o644, session=True)
    f, sid = r.inode.id, r.session_id
    fake.write(f, 0, 10 << 20)
    assert (await s.sync(f, sid, 10 << 20, True)).size == 10 << 20
    await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=0))  # the other client
    assert fake.chunks[f] == {}
    fake.write(f, 0, 1)  # the writer's next byte, at offset 0 (O_APPEND after the truncate)
    assert (await s.sync(f, sid, 10 << 20, True)).size == 1
    fake.write(f, 1, 99)
    assert (await s.sync(f, sid, 10 << 20, True)).size == 100  # still from storage
    fake.write(f, 100, (12 << 20) - 100)
    assert (await s.sync(f, sid, 12 << 20, True)).size == 12 << 20  # past the stale mark: a hint
    # a truncate to the length meta already has counts too (the writer had not reported more)
    await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=12 << 20))
    assert (await s.close(f, sid, 12 << 20, True)).size == 12 << 20
    r2 = await s.create(ROOT, ROOT_ID, b"log2", 0o644, session=True)
    fake.write(r2.inode.id, 0, 5000)
    await s.sync(r2.inode.id, r2.session_id, 5000, True)
    await s.setattr(ROOT, r2.inode.id, m.SetattrReq(fields=m.SETATTR_SIZE, size=5000))
    await s.setattr(ROOT, r2.inode.id, m.SetattrReq(fields=m.SETATTR_SIZE, size=0))
    assert (await s.close(r2.inode.id, r2.session_id, 5000, True)).size == 0


async def test_a_storage_length_asked_before_a_truncate_is_asked_again(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """A close that asks storage for the length races a truncate: the answer it got before the
    truncate committed is not used (the settlement asks again)."""
    s = chunked
    r = await s.create(ROOT, ROOT_ID, b"raced", 0o644, session=True)
    f, sid = r.inode.id, r.session_id
    fake.write(f, 0, 5 << 20)
    asked = fake.file_length
    calls = 0

    async def file_length(layout: m.Layout, inode_id: int) -> int | None:
        nonlocal calls
        calls += 1
        n = await asked(layout, inode_id)
        if calls == 1:  # the truncate commits (and trims storage) while the answer travels
            await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=0))
        return n

    fake.file_length = file_length  # type: ignore[method-assign]
    assert (await s.close(f, sid, 0, True)).size == 0
    assert calls == 2


async def test_a_truncate_past_the_settled_size_cuts_the_unreported_bytes_beyond_it(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """write(1000) then ftruncate(500) through the native API: the bytes are on storage, their
    length not yet reported (meta's size is 0), so 500 extends the settled size; the bytes past
    500 must be cut all the same, or the close's report (which, across a truncate, asks storage)
    makes the file 1000 bytes again. Likewise when another client truncates below a writer's
    unreported bytes."""
    s = chunked
    r = await s.create(ROOT, ROOT_ID, b"f", 0o644, session=True)
    f, sid = r.inode.id, r.session_id
    fake.write(f, 0, 1000)
    assert (
        await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=500, session_id=sid))
    ).size == 500
    assert fake.chunks[f] == {0: 500}
    assert (await s.close(f, sid, 500, True)).size == 500
    r = await s.create(ROOT, ROOT_ID, b"g", 0o644, session=True)
    g, sid = r.inode.id, r.session_id
    fake.write(g, 0, 3 * DEFAULT_CHUNK_SIZE)
    await s.setattr(ROOT, g, m.SetattrReq(fields=m.SETATTR_SIZE, size=DEFAULT_CHUNK_SIZE))  # another client
    assert fake.chunks[g] == {0: DEFAULT_CHUNK_SIZE}
    assert (await s.close(g, sid, 3 * DEFAULT_CHUNK_SIZE, True)).size == DEFAULT_CHUNK_SIZE


async def test_a_length_report_committed_between_a_trim_and_its_truncate_is_cut_too(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """A truncate trims storage, then its transaction conflicts with a writer's fsync that
    committed meanwhile (bytes written after the trim): that fsync came first, so the truncate
    must cut its bytes as well, not commit on the strength of the earlier trim (a later extension
    would read them where zeros belong)."""
    s = chunked
    r = await s.create(ROOT, ROOT_ID, b"log", 0o644, session=True)
    f, sid = r.inode.id, r.session_id
    fake.write(f, 0, 2 * DEFAULT_CHUNK_SIZE)
    assert (await s.sync(f, sid, 2 * DEFAULT_CHUNK_SIZE, True)).size == 2 * DEFAULT_CHUNK_SIZE
    trim = fake.truncate
    trims = 0

    async def truncate(layout: m.Layout, inode_id: int, length: int, **kw: object) -> None:
        nonlocal trims
        trims += 1
        await trim(layout, inode_id, length)
        if trims == 1:  # the writer writes and fsyncs between the trim and the truncate's commit
            fake.write(f, 0, 3 * DEFAULT_CHUNK_SIZE)
            assert (await s.sync(f, sid, 3 * DEFAULT_CHUNK_SIZE, True)).size == 3 * DEFAULT_CHUNK_SIZE

    fake.truncate = truncate  # type: ignore[method-assign]
    assert (await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=0))).size == 0
    assert trims == 2 and fake.chunks[f] == {}
    assert (await s.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=DEFAULT_CHUNK_SIZE))).size == (
        DEFAULT_CHUNK_SIZE
    )
    assert fake.chunks[f] == {}


@pytest.mark.parametrize("queued_reads", [False, True], ids=["reads-written", "reads-queued"])
async def test_random_workload_leaves_no_chunk_behind(
    chunked: MetaStore, fake: FakeChunks, queued_reads: bool
) -> None:
    """reads-queued: read sessions are queued (fs3.meta.read_sessions) while the collector takes
    unlinked files at once, so only its wait for the queue keeps an open file's chunks."""
    s = chunked
    if queued_reads:
        s.grace_s = lambda: 1.0
    rng = random.Random(1234)
    dirs = [ROOT_ID]
    names: dict[tuple[int, bytes], int] = {}  # live entries -> inode (files only)
    opened: list[tuple[int, int]] = []
    for step in range(400):
        op = rng.choice(
            ["create", "create", "write", "open", "close", "unlink", "rename", "mkdir", "rmrf", "gc"]
        )
        parent = rng.choice(dirs)
        name = f"n{rng.randrange(12)}".encode()
        try:
            if op == "create":
                r = await s.create(ROOT, parent, name, 0o644, session=True)
                names[(parent, name)] = r.inode.id
                opened.append((r.inode.id, r.session_id))
            elif op == "write" and opened:
                f, sid = rng.choice(opened)
                off = rng.randrange(4 * DEFAULT_CHUNK_SIZE)
                fake.write(f, off, 1000)
                await s.sync(f, sid, off + 1000, True)
            elif op == "open" and names:
                f = rng.choice(list(names.values()))
                opened.append((f, (await s.open(ROOT, f, rng.choice([0, 2])))[1]))
            elif op == "close" and opened:
                f, sid = opened.pop(rng.randrange(len(opened)))
                await s.close(f, sid)
            elif op == "unlink" and names:
                (p, n), _ = rng.choice(list(names.items()))
                await s.unlink(ROOT, p, n)
                del names[(p, n)]
            elif op == "rename" and names:
                (p, n), f = rng.choice(list(names.items()))
                await s.rename(ROOT, p, n, parent, name)
                del names[(p, n)]
                names[(parent, name)] = f
            elif op == "mkdir":
                dirs.append((await s.mkdir(ROOT, parent, b"d" + name, 0o755)).id)
            elif op == "rmrf" and len(dirs) > 1:
                d = rng.choice(dirs[1:])
                ino = await s.stat(d)
                entries, _, _ = await s.readdir(ROOT, ino.parent)
                name_of = next(e.name for e in entries if e.inode_id == d)
                await s.rmdir(ROOT, ino.parent, name_of, recursive=True)
                await _forget_subtree(s, dirs, names, d)
            elif op == "gc":
                await s.collector.collect_once()
        except Exception as e:
            from fs3.errors import FS3Error

            if not isinstance(e, FS3Error):
                raise
            # rename over a directory, a removed directory as parent, ...: the model stays unchanged
        # names are kept exactly, so every named file must still have its inode
        if step % 50 == 0:
            for f in set(names.values()):
                assert (await s.stat(f)).nlink >= 1
    for f, sid in opened:
        await s.close(f, sid)
    while await s.collector.collect_once():
        pass
    live = set(names.values())
    assert {f for f, chunks in fake.chunks.items() if chunks} <= live
    for f in live:
        assert (await s.stat(f)).nlink >= 1

    async def queued(tr) -> list:
        return await tr.get_range(schema.GCQU, prefix_end(schema.GCQU))

    assert await s.db.run(queued, read_only=True) == []
    assert fake.removals, "the workload removed nothing"
    sessions = await s.db.run(lambda tr: tr.get_range(schema.INOS, prefix_end(schema.INOS)), read_only=True)
    assert sessions == []
    assert s.read_sessions is not None and (s.read_sessions.put > 0) == queued_reads


async def _forget_subtree(s: MetaStore, dirs: list[int], names: dict, top: int) -> None:
    """Drop the model's entries under a recursively removed directory."""
    gone = {top}
    changed = True
    while changed:
        changed = False
        for d in list(dirs):
            if d in gone:
                continue
            try:
                ino = await s.stat(d)
            except Exception:
                gone.add(d)
                changed = True
                continue
            if ino.parent in gone or ino.nlink == 0:
                gone.add(d)
                changed = True
    for key in [k for k in names if k[0] in gone]:
        del names[key]
    dirs[:] = [d for d in dirs if d not in gone]


async def _gc_entries(s: MetaStore) -> dict[int, m.GcEntry]:
    rows = await s.db.run(
        lambda tr: tr.snapshot.get_range(schema.GCQU, prefix_end(schema.GCQU), 100), read_only=True
    )
    return {e.inode_id: e for e in (m.GcEntry.FromString(v) for _k, v in rows)}


async def _home(s: MetaStore) -> int:
    return (await s.mkdir(ROOT, ROOT_ID, b"home", 0o777)).id


async def _written_through_a_capability(s: MetaStore, home: int, name: bytes, until_ns: int) -> int:
    """A file of alice's that a write capability (good until ``until_ns``) was issued for, unlinked."""
    ino = (await s.create(ALICE, home, name, 0o644, os.O_RDWR)).inode
    await s.check_file_access(ALICE, ino.id, W_OK, write_until_ns=until_ns)
    await s.unlink(ALICE, home, name)
    return ino.id


async def test_a_second_collector_leaves_the_second_pass_to_come(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """Two meta processes collect at once: one scanned the queue before the other collected a file
    whose chunks need a second removal (a write capability of it may still be used); its finish
    must leave that entry (it once cleared it, and the second removal never came)."""
    home = await _home(chunked)
    x = await _written_through_a_capability(chunked, home, b"x", time.time_ns() + 600 * 10**9)
    other = Collector(chunked, 5.0)
    scanned, go = asyncio.Event(), asyncio.Event()
    collect_files = other._collect_files

    async def paused(ids: list[int]) -> int:
        scanned.set()
        await go.wait()
        return await collect_files(ids)

    other._collect_files = paused  # type: ignore[method-assign]
    late = asyncio.create_task(other.collect_once())
    await scanned.wait()
    assert await chunked.collector.collect_once() == 1
    assert (await _gc_entries(chunked))[x].sweep_after_ns
    go.set()
    assert await late == 0
    assert (await _gc_entries(chunked))[x].sweep_after_ns
    assert fake.removals == [x]


async def test_the_second_pass_is_judged_from_when_the_first_removal_began(
    chunked: MetaStore, fake: FakeChunks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capability usable after a file's chunks began to be removed needs the second pass, even
    when it lapses before the collector's transaction ends (another file's removal took a while)."""
    home = await _home(chunked)
    clock = [time.time_ns()]
    monkeypatch.setattr("fs3.meta.inode.now_ns", lambda: clock[0])
    skew = int(CLOCK_SKEW_S * 1e9)
    # recorded as usable until 1 s from now (check_file_access records twice as far ahead)
    until = clock[0] + 10**9 - skew
    x = await _written_through_a_capability(chunked, home, b"x", (until + clock[0]) // 2)
    y = (await chunked.create(ALICE, home, b"y", 0o644, os.O_RDWR)).inode.id
    await chunked.unlink(ALICE, home, b"y")
    remove = fake.remove

    async def slow(layout: m.Layout, inode_id: int) -> None:
        await remove(layout, inode_id)
        if inode_id == y:
            clock[0] += 2 * 10**9  # a slow removal after x's began

    fake.remove = slow  # type: ignore[method-assign]
    await chunked.collector.collect_once()
    assert fake.removals == [x, y]
    assert list(await _gc_entries(chunked)) == [x]


async def test_a_wake_spent_within_the_grace_collects_once_the_grace_is_over(
    chunked: MetaStore, fake: FakeChunks
) -> None:
    """The last close of an unlinked file wakes the collector, which finds the file within its grace
    and leaves it: it comes back when the grace is over, not at its next periodic round."""
    s = chunked
    s.collector.grace_s = 0.3
    s.collector._loop.interval_s = 3600.0  # no periodic round during the test
    s.collector.start()
    r = await s.create(ROOT, ROOT_ID, b"short-lived", 0o644, session=True, client_id=3)
    fake.write(r.inode.id, 0, 4096)
    await s.unlink(ROOT, ROOT_ID, b"short-lived")
    await s.close(r.inode.id, r.session_id, 4096, wrote=True)
    s.collector.wake()  # as meta's Close does for a file it finds unlinked
    deadline = time.monotonic() + 10
    while r.inode.id not in fake.removals:
        assert time.monotonic() < deadline, "not collected once its grace was over"
        await asyncio.sleep(0.05)
    # the inode goes in the transaction after the chunks' removal (its commit may still be under way)
    while True:
        try:
            await s.stat(r.inode.id)
        except FS3Error as e:
            assert e.code == StatusCode.NOT_FOUND
            break
        assert time.monotonic() < deadline, "the inode stayed after its chunks were removed"
        await asyncio.sleep(0.05)


def test_the_wake_at_the_end_of_a_grace_works_on_uvloop_too() -> None:
    """On uvloop (as the daemon runs) a timer due already comes back as a plain handle, which has no
    ``when()``: a second wake asked for before it ran failed the collector's round."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> int:
        c = Collector(None, 3600.0, grace_s=0.5)  # type: ignore[arg-type]
        woken = 0

        def wake() -> None:
            nonlocal woken
            woken += 1

        c._loop.wake = wake  # type: ignore[method-assign]
        past, soon = time.time_ns() - 1, time.time_ns() + 50_000_000
        c._wake_at(past)
        c._wake_at(past)  # one already asked for at least as early: nothing more
        c._wake_at(soon)
        await asyncio.sleep(0.15)  # the first runs (RIPE_MARGIN_S late)
        c._wake_at(time.time_ns() + 50_000_000)  # the first has run: this one waits 50 ms
        await asyncio.sleep(0.3)
        await c.stop()
        return woken

    assert uvloop.run(main()) == 2
