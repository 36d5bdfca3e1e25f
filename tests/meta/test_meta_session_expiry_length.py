"""A write session pruned because its client died (expired by the collector, or by PruneSession)
settles the file's length from storage first, as a close reporting no length would: the bytes the
client wrote before it died are on storage (acknowledged), so other clients must see them, and a
later truncate-up must show zeros past them, not whatever lay beyond a length that was never set.

The first two tests run real daemons and a real client; the others pin the rules of the
settlement (a truncate racing the storage query wins, an unlinked file still goes to the collector,
a session whose length storage cannot give now stays for the next round) against a fake storage.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

_CLIENT_TESTS = str(Path(__file__).resolve().parents[1] / "client")
if _CLIENT_TESTS not in sys.path:
    sys.path.insert(0, _CLIENT_TESTS)

from fs_cluster import FsCluster  # noqa: E402

from fs3.errors import FS3Error, StatusCode  # noqa: E402
from fs3.meta.permissions import ROOT  # noqa: E402
from fs3.meta.schema import ROOT_ID, inode_key  # noqa: E402
from fs3.meta.store import MetaStore  # noqa: E402
from fs3.proto import meta_pb2 as m  # noqa: E402

pytestmark = pytest.mark.timeout(150)

# A client that writes a file, flushes it (every byte acknowledged by storage), says so, and then
# waits to be killed: no close, no fsync, no goodbye to mgmtd.
_DYING_CLIENT = """
import asyncio, sys
from pathlib import Path
from fs3.client.filesystem import FileSystem

async def main(config, path, data, done):
    fs = await FileSystem.connect(config)
    f = await fs.open(path, "w")
    await f.write(Path(data).read_bytes())
    await f.flush()
    Path(done).write_text(str(fs.meta.client_id))
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


async def until(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout_s} s")
        await asyncio.sleep(0.1)


async def read_all(fs, path: str) -> bytes:
    f = await fs.open(path)
    try:
        return await f.read()
    finally:
        await f.close()


async def test_a_killed_writers_expired_session_settles_the_length(tmp_path: Path) -> None:
    # meta expires sessions untouched for 1 s whose client has no live mgmtd session
    async with FsCluster(tmp_path, meta_extra={"session_timeout_s": 1.0}) as c:
        fs = await c.connect()
        data = os.urandom(300_000)
        (tmp_path / "data.bin").write_bytes(data)
        done = tmp_path / "written"
        config = c.client_config("dying")
        argv = [sys.executable, "-c", _DYING_CLIENT, str(config), "/abandoned", str(tmp_path / "data.bin")]
        proc = c.cluster.spawn("dying-client", [*argv, str(done)])

        async def written() -> bool:
            assert proc.alive(), proc.log()[-3000:]
            return done.exists()

        await until(written, 60, "the client's bytes on storage")
        os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        proc.popen.wait(timeout=10)  # type: ignore[union-attr]

        async def settled() -> bool:
            return (await fs.stat("/abandoned")).st_size == len(data)

        # mgmtd drops the client's session after its timeout, then meta's collector prunes it
        await until(settled, 60, "the abandoned file's length")
        assert await read_all(fs, "/abandoned") == data
        # growing it shows zeros past the old end
        await fs.truncate("/abandoned", len(data) + 100_000)
        assert (await fs.stat("/abandoned")).st_size == len(data) + 100_000
        assert await read_all(fs, "/abandoned") == data + bytes(100_000)


async def test_prune_session_settles_the_length(tmp_path: Path) -> None:
    # no expiry here (meta's default timeout is minutes): only PruneSession ends the session
    async with FsCluster(tmp_path) as c:
        fs = await c.connect()
        gone = await c.connect()
        data = os.urandom(300_000)
        g = await gone.open("/abandoned", "w")
        await g.write(data)
        await g.flush()  # on storage; the length would be reported at close
        await gone._session.stop()  # the client dies: no close, no fsync
        assert (await fs.stat("/abandoned")).st_size == 0
        assert await fs.meta.prune_sessions(gone.meta.client_id) == 1  # root prunes another's
        with pytest.raises(FS3Error) as e:
            await gone.meta.sync(g.handle.inode_id, g.handle.session_id, 0, wrote=False)
        assert e.value.code == StatusCode.META_BAD_HANDLE
        assert (await fs.stat("/abandoned")).st_size == len(data)
        assert await read_all(fs, "/abandoned") == data
        await fs.truncate("/abandoned", len(data) + 100_000)
        assert await read_all(fs, "/abandoned") == data + bytes(100_000)


class FakeStorage:
    """One file's length on storage; ``on_query`` runs inside a query, before it answers with the
    length storage had when it was asked; ``down`` makes it unreachable."""

    def __init__(self) -> None:
        self.length = 0
        self.down = False
        self.queries = 0
        self.on_query = None

    async def file_length(self, layout: m.Layout, inode_id: int) -> int | None:
        if self.down:
            raise FS3Error(StatusCode.UNAVAILABLE, "storage unreachable")
        self.queries += 1
        length = self.length
        if self.on_query is not None:
            hook, self.on_query = self.on_query, None
            await hook()
        return length

    async def truncate(self, layout: m.Layout, inode_id: int, length: int) -> None:
        if self.down:
            raise FS3Error(StatusCode.UNAVAILABLE, "storage unreachable")
        self.length = min(self.length, length)

    async def remove(self, layout: m.Layout, inode_id: int) -> None:
        self.length = 0

    async def space(self) -> tuple[int, int, int]:
        return 0, 0, 0


async def _abandoned(store: MetaStore, storage: FakeStorage, length: int, synced: int = 0) -> tuple[int, int]:
    """A file opened for writing by client 7, which wrote ``length`` bytes to storage (fsyncing
    after the first ``synced``) and died."""
    store.chunks = storage
    r = await store.create(ROOT, ROOT_ID, b"f", 0o644, flags=2, session=True, client_id=7)
    if synced:
        storage.length = synced
        await store.sync(r.inode.id, r.session_id, synced, wrote=True)
    storage.length = length
    return r.inode.id, r.session_id


async def test_a_truncate_during_the_storage_query_wins(store: MetaStore) -> None:
    storage = FakeStorage()
    f, _ = await _abandoned(store, storage, 300_000, synced=100_000)

    async def truncate() -> None:  # lands after storage answered 300,000
        await store.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=10))

    storage.on_query = truncate
    assert await store.prune_sessions(client_id=7) == 1
    assert storage.queries == 2  # asked again once the truncate was seen
    assert (await store.stat(f)).size == 10
    assert await store.sessions_of(f) == []


async def test_a_truncate_whose_trim_fails_commits_nothing(store: MetaStore) -> None:
    storage = FakeStorage()
    f, _ = await _abandoned(store, storage, 300_000, synced=100_000)
    storage.down = True
    with pytest.raises(FS3Error):  # the trim comes first, and fails: nothing is recorded
        await store.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=10))
    assert (await store.stat(f)).size == 100_000
    storage.down = False
    assert await store.prune_sessions(client_id=7) == 1
    assert (await store.stat(f)).size == storage.length == 300_000


async def test_a_trim_an_older_build_left_owed_goes_before_the_storage_query(store: MetaStore) -> None:
    storage = FakeStorage()
    f, _ = await _abandoned(store, storage, 300_000, synced=100_000)

    async def older_builds_truncate(tr) -> None:  # committed the length, trim still owed
        ino = m.Inode.FromString(await tr.get(inode_key(f)))
        ino.truncate_version += 1
        ino.size, ino.trim_version, ino.trim_length = 10, ino.truncate_version, 10
        tr.set(inode_key(f), ino.SerializeToString())

    await store.db.run(older_builds_truncate)
    assert await store.prune_sessions(client_id=7) == 1
    assert storage.length == 10
    assert (await store.stat(f)).size == 10
    raw = await store.db.run(lambda tr: tr.get(inode_key(f)), read_only=True)
    assert m.Inode.FromString(raw).trim_version == 0


async def test_an_unlinked_files_session_goes_without_asking_storage(store: MetaStore) -> None:
    storage = FakeStorage()
    f, _ = await _abandoned(store, storage, 300_000)
    await store.unlink(ROOT, ROOT_ID, b"f")
    storage.down = True
    assert await store.prune_sessions(client_id=7) == 1
    assert await store.sessions_of(f) == []
    storage.down = False
    while await store.collector.collect_once():
        pass
    with pytest.raises(FS3Error) as e:
        await store.stat(f)
    assert e.value.code == StatusCode.NOT_FOUND


async def test_a_session_whose_length_storage_cannot_give_waits(store: MetaStore) -> None:
    storage = FakeStorage()
    f, _ = await _abandoned(store, storage, 300_000)
    await store.open(ROOT, f, 0, client_id=7)  # a read session of the same client goes at once
    storage.down = True
    assert await store.prune_sessions(client_id=7) == 1
    assert [s.write for s in await store.sessions_of(f)] == [True]
    assert (await store.stat(f)).size == 0
    storage.down = False
    assert await store.prune_sessions(client_id=7) == 1
    assert await store.sessions_of(f) == []
    assert (await store.stat(f)).size == 300_000


async def test_a_pruned_session_never_shrinks_the_length(store: MetaStore) -> None:
    storage = FakeStorage()
    f, sid = await _abandoned(store, storage, 300_000)
    await store.sync(f, sid, 400_000, wrote=True)  # reported, but storage lost the tail: no shrink
    assert await store.prune_sessions(client_id=7) == 1
    assert (await store.stat(f)).size == 400_000


async def test_a_touch_leaves_the_settlement_alone(store: MetaStore) -> None:
    """A client unsure whether meta kept its session touches it (its guard); that must not count
    as a report: a write of 200 bytes landed, another client truncated to 50, the touch, then a
    write of [100, 110): the writer's fsync reporting 200 must be checked against storage (110)."""
    storage = FakeStorage()
    store.chunks = storage
    r = await store.create(ROOT, ROOT_ID, b"f", 0o644, flags=2, session=True, client_id=7)
    f, sid = r.inode.id, r.session_id
    storage.length = 200
    await store.setattr(ROOT, f, m.SetattrReq(fields=m.SETATTR_SIZE, size=50))
    before = {s.session_id: s.touched_ns for s in await store.sessions_of(f)}[sid]
    assert (await store.touch(f, sid)).size == 50
    assert {s.session_id: s.touched_ns for s in await store.sessions_of(f)}[sid] > before
    storage.length = 110
    assert (await store.sync(f, sid, 200, wrote=True)).size == 110
    with pytest.raises(FS3Error) as e:
        await store.touch(f, sid + 1)
    assert e.value.code == StatusCode.META_BAD_HANDLE
