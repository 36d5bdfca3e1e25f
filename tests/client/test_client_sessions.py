"""A client keeps a mgmtd client session, so meta does not expire its open files (it expires only
those of clients without one, after its ``session_timeout_s``)."""

from __future__ import annotations

import asyncio
import errno
import os
import signal

import pytest
from fs_cluster import FsCluster

from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(120)


async def test_files_held_open_past_the_meta_session_timeout_stay_open(tmp_path) -> None:
    # meta expires sessions untouched for 1 s whose client has no mgmtd session (every 0.5 s);
    # mgmtd's list counts as complete once it has been primary for its 5 s session timeout
    async with FsCluster(tmp_path, meta_extra={"session_timeout_s": 1.0}) as c:
        fs = await c.connect()
        sessions = await fs.mgmtd.list_client_sessions()
        assert [(s.client_id, s.type) for s in sessions] == [(str(fs.meta.client_id), common_pb2.NODE_CLIENT)]
        data = os.urandom(300_000)
        f = await fs.open("/held-open", "w")
        await f.write(data)
        await f.flush()  # on storage; the length is reported at close
        reader = await fs.open("/held-open")
        await asyncio.sleep(8)  # no fsync, no meta call on these files
        await f.write(b"tail")
        await f.close()  # the write session is still there
        assert (await fs.stat("/held-open")).st_size == len(data) + 4
        assert await reader.read() == data + b"tail"
        await reader.close()

        # a client that vanishes without closing: its session goes
        gone = await c.connect()
        g = await gone.open("/abandoned", "w")
        await g.write(b"x" * 1000)
        await gone._session.stop()  # stops extending its mgmtd session, as a dead client would
        await asyncio.sleep(8)  # past mgmtd's session timeout and meta's
        with pytest.raises(FS3Error) as e:
            await gone.meta.sync(g.handle.inode_id, g.handle.session_id, 1000, wrote=True)
        assert e.value.code == StatusCode.META_BAD_HANDLE


def _cluster_ending_paused_clients(tmp_path, **extra: object) -> FsCluster:  # type: ignore[no-untyped-def]
    """One chain; mgmtd expires a silent client's session after 3 s, and meta then ends its file
    sessions untouched for 1 s (a client paused for 3 + 1 + a prune round loses them)."""
    return FsCluster(
        tmp_path,
        chains=1,
        stripe=1,
        mgmtd_extra={"client_session_timeout_s": 3.0},
        meta_extra={"session_timeout_s": 1.0},
        **extra,  # type: ignore[arg-type]
    )


async def _chunks_of(fs, inode_id: int) -> int:  # type: ignore[no-untyped-def]
    """How many chunks of ``inode_id`` the cluster's targets hold."""
    targets = list(fs.storage.routing.routing.targets)
    return sum([len(await fs.storage.dump_chunk_meta(tid, inode_id)) for tid in targets])


async def _until(pred, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await pred():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_handles_whose_session_meta_ended_do_no_more_io(tmp_path) -> None:
    """A client paused longer than its session timeout (its keeper stopped, as SIGSTOP would):
    mgmtd expires its session, meta ends its open files' sessions (settling their lengths) and
    collects a file another client unlinked. On resuming, its old handles write nothing (the
    fsync is EIO and no chunk of the collected file comes back), a read of the collected file
    is EIO rather than zeros, clean handles close without an error, and new opens work."""
    async with _cluster_ending_paused_clients(tmp_path) as c:
        fs = await c.connect()
        other = await c.connect()
        kept = await fs.open("/kept", "w")
        await kept.write(b"1" * 4096)
        await kept.fsync()
        doomed = await fs.open("/doomed", "w")
        await doomed.write(b"d" * 4096)
        await doomed.fsync()
        ino = (await other.stat("/doomed")).st_ino
        reader = await fs.open("/doomed")
        clean = await fs.open("/kept")
        assert fs._session is not None  # noqa: SLF001
        await fs._session.stop()  # noqa: SLF001  # as a stopped process: no extensions
        await other.unlink("/doomed")

        async def collected() -> bool:
            return await _chunks_of(other, ino) == 0

        # mgmtd expires the session after 3 s; meta ends its file sessions, then collects /doomed
        await _until(collected, 60, "the unlinked file's chunks to be collected")
        await kept.write(b"2" * 4096)
        with pytest.raises(FS3Error) as e:
            await kept.fsync()
        assert (e.value.code, e.value.errno) == (StatusCode.SESSION_LOST, errno.EIO), e.value
        await doomed.write(b"x" * 4096)
        with pytest.raises(FS3Error) as e:
            await doomed.flush()
        assert e.value.code == StatusCode.SESSION_LOST
        with pytest.raises(FS3Error) as e:
            await reader.pread(4096, 0)  # the chunks are gone: not a hole of zeros
        assert e.value.code == StatusCode.SESSION_LOST
        with pytest.raises(FS3Error) as e:
            await reader.read()  # asks meta for the length first: the file is gone
        assert e.value.code == StatusCode.SESSION_LOST
        assert await clean.read() == b"1" * 4096  # bytes storage has are still served
        for h in (clean, reader, kept):
            await h.close()  # nothing unreported: meta already ended the session
        with pytest.raises(FS3Error) as e:
            await doomed.close()  # its refused write is reported once more
        assert e.value.code == StatusCode.SESSION_LOST
        assert await _chunks_of(other, ino) == 0
        assert await other.read_file("/kept") == b"1" * 4096
        await other.truncate("/kept", 8192)  # growing it shows zeros, not the refused bytes
        assert await other.read_file("/kept") == b"1" * 4096 + bytes(4096)
        g = await fs.open("/new", "w")
        await g.write(b"ok")
        await g.close()
        assert await other.read_file("/new") == b"ok"


async def test_a_read_only_handle_whose_session_meta_ended_opens_its_file_again(tmp_path) -> None:
    """The same pause, with a read-only handle of a sparse file that is still there: reading its
    hole asks meta, which has ended the session, and the handle opens the file again instead of
    failing (EIO before). The new session protects the file like the first: unlinked by another
    client, it is collected only after this handle's close."""
    chunk = 1 << 20
    async with _cluster_ending_paused_clients(tmp_path, chunk_size=chunk) as c:
        fs = await c.connect()
        other = await c.connect()
        w = await other.open("/sparse", "w")
        await w.pwrite(b"s" * 4096, chunk)  # chunk 0 is a hole
        await w.close()
        ino = (await other.stat("/sparse")).st_ino
        reader = await fs.open("/sparse")
        assert fs._session is not None  # noqa: SLF001
        await fs._session.stop()  # noqa: SLF001  # as a stopped process: no extensions
        first = reader.handle.session_id
        await asyncio.sleep(3.0 + 1.0 + 6.0)  # mgmtd expires the session; meta's prune ends it
        await fs._session.start()  # noqa: SLF001  # the process resumes
        assert await reader.pread(4096, 0) == bytes(4096)  # the hole, through a new session
        assert reader.handle.session_id != first and not reader.handle.session_lost
        assert await reader.pread(4096, chunk) == b"s" * 4096
        await other.unlink("/sparse")
        await asyncio.sleep(4.0)  # past meta's collector grace and a round: the session holds it
        assert await _chunks_of(other, ino) > 0
        assert await reader.pread(4096, chunk) == b"s" * 4096
        await reader.close()

        async def collected() -> bool:
            return await _chunks_of(other, ino) == 0

        await _until(collected, 60, "the unlinked file's chunks to be collected after the close")


async def test_a_hole_read_of_a_handle_whose_queued_session_was_lost_fails_not_zeros(tmp_path) -> None:
    """Meta answers a read-only open before writing its session; a meta process killed in that
    instant loses it. If the file is then unlinked and collected, the handle's reads find no
    chunks: holes. Its first hole read asks meta, whatever mgmtd says of the client (which is
    alive): the session is not there and the file is gone, so the read fails (EIO), where it
    returned zeros for the file's data before."""
    chunk = 1 << 20
    async with FsCluster(tmp_path, chains=1, stripe=1, chunk_size=chunk) as c:
        fs = await c.connect()
        other = await c.connect()
        data = os.urandom(4096)
        w = await other.open("/f", "w")
        await w.write(data)
        await w.close()
        ino = (await other.stat("/f")).st_ino
        reader = await fs.open("/f")
        assert reader.handle.unconfirmed
        # the session as lost with its meta process: what meta wrote of it is taken away
        await asyncio.sleep(0.5)
        ref = m.SessionRef(inode=ino, session_id=reader.handle.session_id)
        assert (await fs.meta.call("EndReadSessions", m.EndReadSessionsReq(sessions=[ref]))).ended == 1
        await other.unlink("/f")

        async def collected() -> bool:
            return await _chunks_of(other, ino) == 0

        await _until(collected, 60, "the unlinked file without a session to be collected")
        assert fs._session is not None and fs._session.vouches_for(reader.handle.checked_at)  # noqa: SLF001
        with pytest.raises(FS3Error) as e:
            await reader.pread(4096, 0)
        assert e.value.code == StatusCode.SESSION_LOST and reader.handle.session_lost
        await reader.close()

        # a handle whose first hole read found its session there reads holes without asking again
        w = await other.open("/sparse", "w")
        await w.pwrite(b"s", chunk)
        await w.close()
        sparse = await fs.open("/sparse")
        assert await sparse.pread(4096, 0) == bytes(4096)
        assert not sparse.handle.unconfirmed and not sparse.handle.session_lost
        await sparse.close()


async def test_a_queued_sessions_check_with_meta_out_of_reach_leaves_it_to_mgmtd(tmp_path) -> None:
    """A handle's first hole read asks meta whether its queued session was written; with meta out
    of reach (stopped) that check gives up, and the read goes on by mgmtd's word, as every read
    did before the check (an EIO here would make meta's downtime fail reads of sparse files)."""
    chunk = 1 << 20
    async with FsCluster(tmp_path, chains=1, stripe=1, chunk_size=chunk) as c:
        fs = await c.connect(rpc_timeout_s=2.0)
        other = await c.connect()
        w = await other.open("/sparse", "w")
        await w.pwrite(b"s", chunk)  # chunk 0 is a hole
        await w.close()
        reader = await fs.open("/sparse")
        assert reader.handle.unconfirmed
        meta = c.meta_procs[0].popen.pid  # type: ignore[union-attr]
        stats: list[int] = []
        real = fs.meta.stat

        async def counted(inode_id: int, **kw: bool) -> object:
            stats.append(inode_id)
            return await real(inode_id, **kw)

        fs.meta.stat = counted  # type: ignore[method-assign]
        os.kill(meta, signal.SIGSTOP)
        try:
            assert await reader.pread(4096, 0) == bytes(4096)
            assert reader.handle.unconfirmed and not reader.handle.session_lost
            # the hole's length recheck went unanswered: the next hole read does not wait again
            assert await reader.pread(4096, 8192) == bytes(4096)
            assert len(stats) == 1
        finally:
            os.kill(meta, signal.SIGCONT)
            del fs.meta.stat
        assert await reader.pread(4096, 0) == bytes(4096)  # asked again, and confirmed
        assert not reader.handle.unconfirmed
        await reader.close()


async def test_a_paused_client_whose_file_sessions_meta_kept_writes_on(tmp_path) -> None:
    """Paused past mgmtd's session timeout but not long enough for meta to end its file sessions
    (meta's timeout is minutes): its handles check with meta and go on, with no error."""
    async with FsCluster(tmp_path, chains=1, stripe=1, mgmtd_extra={"client_session_timeout_s": 3.0}) as c:
        fs = await c.connect()
        f = await fs.open("/a", "w")
        await f.write(b"1" * 4096)
        await f.fsync()
        assert fs._session is not None  # noqa: SLF001
        await fs._session.stop()  # noqa: SLF001
        await asyncio.sleep(4)  # past mgmtd's timeout
        assert not fs._session.vouches_for(f.handle.checked_at)  # noqa: SLF001
        await f.write(b"2" * 4096)
        await f.fsync()
        await f.close()
        assert await (await c.connect()).read_file("/a") == b"1" * 4096 + b"2" * 4096


async def test_a_close_meta_did_not_answer_is_sent_again_so_an_unlinked_file_is_collected(tmp_path) -> None:
    """The close of a written file failed (meta down past the client's retry budget): the client
    forgot the session, meta kept it for as long as the client lived, and the file, unlinked
    later, kept every chunk on storage. The close still fails, and is sent again in the background
    once meta is back."""
    async with FsCluster(tmp_path, chains=1, stripe=1) as c:
        fs = await c.connect()
        other = await c.connect()
        fs.meta.timeout_s = 2.0  # the close's retry budget
        f = await fs.open("/victim", "w")
        await f.write(b"x" * 300_000)
        await f.fsync()
        inode_id = f.handle.inode_id
        assert await _chunks_of(other, inode_id) > 0
        c.kill_meta(0)
        with pytest.raises(FS3Error) as e:
            await f.close()
        assert e.value.retryable or e.value.code == StatusCode.DEADLINE_EXCEEDED, e.value
        c.start_meta(0)
        await c.cluster._read_port(c.tmp / "meta-0.port", c.meta_procs[0], 30)
        assert (await other.stat("/victim")).st_size == 300_000
        await other.unlink("/victim")

        async def collected() -> bool:
            return await _chunks_of(other, inode_id) == 0

        await _until(collected, 30, "the unlinked file's chunks to be collected")  # fs still open


async def test_an_open_given_up_on_is_settled_and_its_session_closed(tmp_path) -> None:
    """An open meta did (a session) whose answer never reached the client: nobody closed that
    session, which kept the file's chunks after an unlink for as long as the client lived. The
    client asks meta what became of a request it gave up on (SettleRequest): a session it opened
    is closed; a request not done yet never will be (a late attempt of it opens nothing)."""
    async with FsCluster(tmp_path, chains=1, stripe=1) as c:
        fs = await c.connect()
        other = await c.connect()
        await fs.write_file("/f", b"y" * 200_000)
        inode_id = (await fs.stat("/f")).st_ino
        queued = fs.meta._queued_ends

        # done, the answer lost: its session is found and closed
        req = m.OpenReq(inode_id=inode_id, flags=os.O_WRONLY)
        lost, _ = await fs.meta._call("Open", req, request_id=True)
        assert lost.session_id
        queued.settle(fs.meta, req.hdr.request_id, m.OpenRsp)
        await _until(lambda: _settled(queued, 1), 30, "the open to be settled")
        await other.unlink("/f")

        async def collected() -> bool:
            return await _chunks_of(other, inode_id) == 0

        await _until(collected, 30, "the unlinked file's chunks to be collected")

        # not done: settling it makes a late attempt of it do nothing
        await fs.write_file("/g", b"z")
        g = (await fs.stat("/g")).st_ino
        late = m.OpenReq(inode_id=g, flags=os.O_WRONLY | os.O_TRUNC)
        late.hdr.request_id = fs.meta._next_request_id()
        rsp = await fs.meta.call("SettleRequest", m.SettleRequestReq(request_id=late.hdr.request_id))
        assert not rsp.done
        answered = await fs.meta.call("Open", late)  # (the same request id: not drawn again)
        assert answered.session_id == 0
        assert await fs.read_file("/g") == b"z"  # not truncated

        # meta out of reach: the open fails, and is settled once meta is back
        c.kill_meta(0)
        fs.meta.timeout_s = 1.0
        with pytest.raises(FS3Error) as e:
            await fs.meta.open(g, os.O_WRONLY)
        assert e.value.retryable or e.value.code == StatusCode.DEADLINE_EXCEEDED, e.value
        assert len(_settling(queued)) == 1
        c.start_meta(0)
        await c.cluster._read_port(c.tmp / "meta-0.port", c.meta_procs[0], 30)
        await _until(lambda: _no_tasks(queued), 40, "the failed open to be settled")
        assert queued.settled == 1  # (it had not been done)


async def _settled(queued, n: int) -> bool:  # type: ignore[no-untyped-def]
    return queued.settled >= n


def _settling(queued) -> list:  # type: ignore[no-untyped-def]
    return [t for t in queued._tasks if t.get_coro().__name__ == "_settle"]


async def _no_tasks(queued) -> bool:  # type: ignore[no-untyped-def]
    return not _settling(queued)


async def test_a_closed_client_leaves_mgmtds_list_of_live_clients_at_once(tmp_path) -> None:
    """A client that closed its file system (an unmount, a script's end) stayed in `fs3 admin
    list-clients` for a whole session timeout (5 minutes by default): it tells mgmtd now."""
    async with FsCluster(tmp_path, chains=1, stripe=1, mgmtd_extra={"client_session_timeout_s": 300.0}) as c:
        watcher = await c.connect()
        fs = await c.connect()
        live = {s.client_id for s in await watcher.mgmtd.list_client_sessions()}
        assert {str(fs.meta.client_id), str(watcher.meta.client_id)} <= live
        await fs.close()
        live = {s.client_id for s in await watcher.mgmtd.list_client_sessions()}
        assert str(fs.meta.client_id) not in live and str(watcher.meta.client_id) in live
