"""Open files: sessions, and settling a file's length on close and fsync (DESIGN §7).

Every open (read or write) records a session ``INOS + inode + session``, so a file unlinked while
open keeps its chunks until the last handle closes: the collector skips files with sessions. The
sessions of read-only opens are written (and ended) just after the answer, see
:mod:`fs3.meta.read_sessions`. A write
session's close or fsync reports the highest offset the client wrote; the length becomes the larger
of the stored length and that report (length only shrinks through truncate). A report of 0 with
``wrote`` set asks storage instead (query last chunk on each of the file's chains). Sessions of clients
that vanish are pruned: by client id (PruneSession), or by the collector once a session has not been
touched for ``session_timeout_s`` and its client holds no live session with mgmtd (the client's
mgmtd ``ClientSession.client_id`` is the decimal form of its meta client id). Pruning a write
session settles the file's length from storage first, as a close reporting no length would: the
client is gone, and its acknowledged bytes are on storage.

The kernel leaves clearing setuid/setgid on a write to the file system (libfuse's
FUSE_CAP_HANDLE_KILLPRIV). Meta sees a write only when its session settles, so that is when the
bits go, unless root opened the session (``FileSession.fsetid``, Linux's CAP_FSETID): until then
another client may see the written bytes with the bits still set.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from fs3.errors import FS3Error, StatusCode
from fs3.kv import ReadView, Transaction, prefix_end
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.meta.namespace import DIRECTORY, FILE, O_TRUNC, Idem, M, Namespace, Trims, _time_left, replayed
from fs3.meta.permissions import R_OK, Credentials, access_of_flags, check, kill_suid_sgid
from fs3.meta.read_sessions import MIN_GRACE_S, ReadSessions
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

#: storage queries one settlement makes before giving up on a file truncated again and again
_SETTLE_ATTEMPTS = 8
#: write sessions one prune settles at once (each asks storage for its file's length)
_PRUNE_CONCURRENCY = 16


class _AskStorage(Exception):
    """Raised in a settlement's transaction (which then writes nothing) when the length must come
    from storage, as of ``truncate_version``."""

    def __init__(self, layout: meta_pb2.Layout, truncate_version: int) -> None:
        super().__init__(truncate_version)
        self.layout = layout
        self.truncate_version = truncate_version


# Ids that must not repeat across processes or runs: an application (or a test framework) seeding
# the random module must not make two clients share request or session ids.
_ids = random.SystemRandom()


class _WriteNow(Exception):
    """A read-only open whose transaction has more to write than its session."""


class SessionOps(Namespace):
    # The collector's grace now (a pushed config may change it); see read_sessions.MIN_GRACE_S.
    grace_s: Callable[[], float] = staticmethod(lambda: 0.0)

    def _queue_read_sessions(self) -> ReadSessions | None:
        grace_s = self.grace_s()
        if self.read_sessions is None or grace_s < MIN_GRACE_S or not self.read_sessions.accepting(grace_s):
            return None
        return self.read_sessions

    async def open(
        self, cred: Credentials, inode_id: int, flags: int, client_id: int = 0, idem: Idem = None
    ) -> tuple[meta_pb2.Inode, int]:
        """:meth:`open_session`'s (inode, session id)."""
        ino, session_id, _ = await self.open_session(cred, inode_id, flags, client_id, idem)
        return ino, session_id

    async def open_session(
        self, cred: Credentials, inode_id: int, flags: int, client_id: int = 0, idem: Idem = None
    ) -> tuple[meta_pb2.Inode, int, bool]:
        """Check access for ``flags`` and open a session; returns (inode, session id, whether the
        session was queued: written after the answer, so a client whose connection to this process
        is lost soon after puts it again, as the process may have died before writing it). Directories
        and special files are checked but get no session (0). With a request id a retried open
        returns the first one's session instead of opening a second one, which nobody would close
        (and which would keep an unlinked file's chunks for the client's lifetime). A read-only
        open is answered from a snapshot and its session queued (see fs3.meta.read_sessions)."""
        want = access_of_flags(flags)
        trims = Trims()
        queue = None if flags & (3 | O_TRUNC) else self._queue_read_sessions()
        if queue is not None and idem is not None and idem[1]:
            # a retry queues the same session again, not a second one
            session_id = queue.session_id(idem[0], idem[1])
        else:
            session_id = _ids.getrandbits(63) + 1
        queued: list[meta_pb2.FileSession] = []

        async def fn(tr: Transaction) -> meta_pb2.OpenRsp:
            ino = await inodes.load(tr, inode_id)
            if ino.type == DIRECTORY:
                if flags & 3:
                    raise FS3Error(StatusCode.META_IS_DIRECTORY, f"inode {inode_id} is a directory")
                check(ino, cred, want)
                return meta_pb2.OpenRsp(inode=inodes.public(await inodes.complete(tr.snapshot, ino)))
            check(ino, cred, want)
            if ino.type != FILE:
                return meta_pb2.OpenRsp(inode=inodes.public(ino))
            if ino.nlink == 0 and ino.collecting:
                # No new sessions on a file the collector has claimed: it is removing its chunks.
                # Before that an unlinked file opens: the caller looked its name up before the
                # unlink or the rename over it, and opening what it found is a valid order of the
                # two (a local file system's dentry would hold the inode the same way).
                raise FS3Error(StatusCode.NOT_FOUND, f"inode {inode_id} has been removed")
            if queue is not None:
                if ino.trim_version or ino.truncating_until_ns or ino.nlink == 0:
                    # An owed trim (or an abandoned truncate) is settled in the transaction. An unlinked file's session must
                    # be in the store before the answer: the collector may be about to claim it
                    # (its grace is counted from the unlink), and the transaction conflicts
                    # with the claim where a queued session would come too late.
                    raise _WriteNow
                queued[:] = [self._session(cred, ino, session_id, client_id, write=False)]
                return meta_pb2.OpenRsp(inode=inodes.public(ino), session_id=session_id)
            if flags & O_TRUNC:
                self._truncate_in_txn(tr, cred, ino, 0, trims)
            else:
                self._settle_owed_trim(tr, ino, trims)
            if not flags & (3 | O_TRUNC):
                # a reader's session goes in however full the store is: a full store refuses
                # only what adds data (a reader's open failed with ENOSPC)
                tr.use_reserve()
            self._open_session(tr, cred, ino, session_id, client_id, write=bool(flags & 3))
            return meta_pb2.OpenRsp(inode=inodes.public(ino), session_id=session_id)

        if queue is not None:
            try:
                rsp = await self._answered(idem, meta_pb2.OpenRsp, fn)
            except _WriteNow:
                queue = None
            else:
                if not queued or rsp.session_id != session_id:
                    return rsp.inode, rsp.session_id, False  # no session, or a retry's first answer
                # not for a caller that gave up meanwhile (it may have retried elsewhere and
                # closed that session already): nobody would close this one
                _time_left("its session was queued")
                if self._queue_read_sessions() is queue:
                    queue.open(inode_id, session_id, queued[0])
                    return rsp.inode, rsp.session_id, True
                # The queue stopped or failed, or the grace was shortened, since this open began:
                # its session goes in its own transaction below, as before.
                queue = None
        rsp = await self._trimming_first(trims, lambda: self._mutate(idem, meta_pb2.OpenRsp, trims.txn(fn)))
        return rsp.inode, rsp.session_id, False

    async def _answered(self, idem: Idem, rsp_cls: type[M], fn: Callable[[Transaction], Awaitable[M]]) -> M:
        """``fn`` in a snapshot that commits nothing; with a request id, the first answer if one
        was stored (by an attempt that did not queue its session)."""
        _time_left("its transaction")

        async def once(tr: Transaction) -> M:
            if idem is not None and idem[1]:
                raw = await tr.get(schema.idem_key(idem[0], idem[1]))
                if raw is not None:
                    return replayed(idem, raw, rsp_cls)
            return await fn(tr)

        return await self.db.run(once, read_only=True)

    async def sync(
        self, inode_id: int, session_id: int, written_length: int = 0, wrote: bool = False, mtime_ns: int = 0
    ) -> meta_pb2.Inode:
        """fsync: settle the length from this session's report; the session stays open. ``mtime_ns``
        as :meth:`end_session` takes it."""
        return await self._settle(inode_id, session_id, written_length, wrote, close=False, mtime_ns=mtime_ns)

    async def touch(self, inode_id: int, session_id: int, write: bool = True) -> meta_pb2.Inode:
        """Check that session ``session_id`` of ``inode_id`` is still open (META_BAD_HANDLE if not)
        and touch it, so that it stays another ``session_timeout_s`` even for a client without a
        mgmtd session: a client that cannot tell whether meta ended it (see the client's guard).
        Nothing of the settlement changes. Without ``write`` only the check, in a snapshot: a
        client whose mgmtd session vouches for it asking whether a queued session was written."""

        await self._settle_queued(inode_id, session_id)

        async def fn(tr: Transaction) -> meta_pb2.Inode:
            rv: ReadView = tr if write else tr.snapshot
            skey, session = await _load_session(rv, inode_id, session_id)
            if write:
                session.touched_ns = inodes.now_ns()
                tr.set(skey, session.SerializeToString())
            return inodes.public(await inodes.load(rv, inode_id))

        return await self.db.run(fn, read_only=not write)

    async def close(
        self,
        inode_id: int,
        session_id: int,
        written_length: int = 0,
        wrote: bool = False,
        mtime_ns: int = 0,
        idem: Idem = None,
    ) -> meta_pb2.Inode:
        """Settle the length as :meth:`sync` does and end the session. With a request id a retried
        close returns the first one's result instead of failing for want of the session. A read
        session's end is queued (see fs3.meta.read_sessions); the answer comes from a snapshot."""
        return (await self.end_session(inode_id, session_id, written_length, wrote, mtime_ns, idem))[0]

    async def end_session(
        self,
        inode_id: int,
        session_id: int,
        written_length: int = 0,
        wrote: bool = False,
        mtime_ns: int = 0,
        idem: Idem = None,
    ) -> tuple[meta_pb2.Inode, bool]:
        """:meth:`close`, and whether the session's end was queued (written after the answer: a
        client whose connection to this process is lost soon after closes it again, as the process
        may have died before writing it)."""
        if not wrote and (queue := self._queue_read_sessions()) is not None:
            ino = await self._close_read_session(queue, inode_id, session_id)
            if ino is not None:
                return ino, True
        ino = await self._settle(
            inode_id, session_id, written_length, wrote, close=True, mtime_ns=mtime_ns, idem=idem
        )
        return ino, False

    async def _close_read_session(
        self, queue: ReadSessions, inode_id: int, session_id: int
    ) -> meta_pb2.Inode | None:
        """Queue the end of read session ``session_id``; the file's inode. None, queueing nothing,
        when it is not a read session this process or the store knows of (the caller then closes
        it in a transaction, which answers a retry or META_BAD_HANDLE)."""
        skey = schema.session_key(inode_id, session_id)
        known, raw = queue.lookup(skey)

        async def fn(tr: Transaction) -> meta_pb2.Inode | None:
            stored = raw if known else await tr.get(skey)
            if stored is None or meta_pb2.FileSession.FromString(stored).write:
                return None
            return inodes.public(await inodes.load(tr, inode_id))

        ino = await self.db.run(fn, read_only=True)
        if ino is None:
            return None
        known_now, raw_now = queue.lookup(skey)
        if known_now and raw_now is None:
            return None  # ended by another close meanwhile
        if self._queue_read_sessions() is not queue:
            return None  # the queue stopped or failed meanwhile: closed in a transaction
        queue.close(inode_id, session_id)
        return ino

    async def _settle_queued(self, inode_id: int, session_id: int) -> None:
        """Wait until a queued change of the session, if any, is in the store (within the
        caller's deadline: a store refusing the queue's batch keeps it queued)."""
        await self._settle_keys(
            [schema.session_key(inode_id, session_id)], f"session {session_id} of inode {inode_id}"
        )

    async def _settle_keys(self, keys: Sequence[bytes], what: str) -> None:
        """:meth:`_settle_queued` for the sessions of ``keys`` (``what`` names them in the error)."""
        rs = self.read_sessions
        if rs is None or not any(rs.lookup(key)[0] for key in keys):
            return
        try:
            await asyncio.wait_for(rs.settled(), _time_left("its session was written"))
        except TimeoutError:
            raise FS3Error(StatusCode.DEADLINE_EXCEEDED, f"{what} is not written yet") from None

    async def _settle(
        self,
        inode_id: int,
        session_id: int,
        written: int,
        wrote: bool,
        *,
        close: bool,
        mtime_ns: int,
        idem: Idem = None,
    ) -> meta_pb2.Inode:
        """The written length a session reports is a hint: it is taken as it is only when no
        truncate happened since the session last settled (``FileSession.truncate_version``) and it
        is above any report found stale before (``stale_below``). Otherwise (or for a report of 0)
        the length is what storage holds, asked outside the transaction and used only if no
        truncate came in between (the transaction checks ``truncate_version``, else asks again).
        So a writer's report never brings back the length of bytes a truncate removed (`logrotate
        copytruncate` under a writer that goes on appending)."""
        queried: tuple[int | None, int] | None = None  # (length on storage, truncate_version then)
        await self._settle_queued(inode_id, session_id)

        async def fn(tr: Transaction) -> meta_pb2.InodeRsp:
            skey, session = await _load_session(tr, inode_id, session_id)
            ino = await inodes.load(tr, inode_id)
            now = inodes.now_ns()
            across = session.truncate_version != ino.truncate_version
            if across:  # whatever this client counted up to now may include removed bytes
                session.stale_below = max(session.stale_below, written)
            if wrote and session.write:
                if written == 0 or across or written <= session.stale_below:
                    if queried is None or queried[1] != ino.truncate_version:
                        raise _AskStorage(ino.layout, ino.truncate_version)
                    # without storage to ask (a meta-only deployment), the report is all there is
                    length = queried[0] if queried[0] is not None else written
                else:
                    length = written
                # a time of the client's choosing only for the owner or root, as utimensat has it
                # (a writer may set only "now"); sessions opened by anyone else take meta's clock.
                # The client gives when it wrote the bytes (their report comes at close, fsync or
                # a flush, later), by its clock, kept between two times of meta's: not after now
                # (a client clock ahead would put the file's mtime in everyone's future: make's
                # "Clock skew detected"), and not before the session opened nor before the mtime
                # a write recorded already (another client's, later than this one's last: mtime
                # must not go back; a clock behind would make a new file look older than its
                # sources). An mtime in the future set by utime does not hold a write back.
                given = 0
                if mtime_ns and (session.fsetid or session.uid == ino.uid):
                    given = min(max(mtime_ns, session.opened_ns, min(ino.mtime_ns, now)), now)
                _record_write(ino, session, length, given or now, now)
                inodes.store(tr, ino)
            session.truncate_version = ino.truncate_version
            if close:
                tr.clear(skey)
            else:
                session.touched_ns = now
                tr.set(skey, session.SerializeToString())
            return meta_pb2.InodeRsp(inode=inodes.public(ino))

        for _ in range(_SETTLE_ATTEMPTS):
            try:
                return (await self._mutate(idem, meta_pb2.InodeRsp, fn)).inode
            except _AskStorage as ask:
                queried = (await self.chunks.file_length(ask.layout, inode_id), ask.truncate_version)
        raise FS3Error(
            StatusCode.ABORTED, f"inode {inode_id} kept being truncated while its length was settled"
        )

    async def sessions_of(self, inode_id: int) -> list[meta_pb2.FileSession]:
        """The open sessions of a file."""
        if self.read_sessions is not None:
            await self.read_sessions.settled()
        prefix = schema.session_prefix(inode_id)

        async def fn(tr: Transaction) -> list[meta_pb2.FileSession]:
            rows = await tr.snapshot.get_range(prefix, prefix_end(prefix))
            return [meta_pb2.FileSession.FromString(v) for _, v in rows]

        return await self.db.run(fn, read_only=True)

    async def end_read_sessions(
        self, client_id: int, sessions: Sequence[tuple[int, int]], uid: int | None = None
    ) -> int:
        """End the read sessions ``(inode id, session id)`` of ``client_id`` (and of ``uid``, unless
        None) that are still there; returns how many. A client's second close of sessions whose end
        a meta process answered before writing it, and may have died with (see
        fs3.meta.read_sessions): usually none is left, and then nothing is written. Write
        sessions are left alone (their end settles a length), as are other clients'."""
        keys = [schema.session_key(inode_id, session_id) for inode_id, session_id in sessions]
        await self._settle_keys(keys, f"a session of {len(keys)}")

        def ours(raw: bytes | None) -> bool:
            if raw is None:
                return False
            s = meta_pb2.FileSession.FromString(raw)
            return not s.write and s.client_id == client_id and (uid is None or s.uid == uid)

        async def present(tr: Transaction) -> list[bytes]:
            return [key for key in keys if ours(await tr.snapshot.get(key))]

        if not await self.db.run(present, read_only=True):
            return 0

        async def end(tr: Transaction) -> int:
            ended = 0
            for key in keys:
                if ours(await tr.get(key)):
                    tr.clear(key)
                    ended += 1
            return ended

        return await self.db.run(end)

    async def restore_read_sessions(
        self, cred: Credentials, client_id: int, sessions: Sequence[tuple[int, int]]
    ) -> tuple[int, int]:
        """Put the read sessions ``(inode id, session id)`` of ``client_id`` that are not there, as
        ``cred``'s, where the file is still there, not being collected, and readable by ``cred``;
        returns (how many were put, how many were there already). A client's second put of sessions
        whose open a meta process answered before writing them, and may have died with (see
        fs3.meta.read_sessions), for files it still holds open: usually all are there, and then
        nothing is written. A session id there already, whoever's, is left alone."""
        keys = [schema.session_key(inode_id, session_id) for inode_id, session_id in sessions]
        await self._settle_keys(keys, f"a session of {len(keys)}")

        async def missing(tr: Transaction) -> int:
            return sum([await tr.snapshot.get(key) is None for key in keys])

        if not await self.db.run(missing, read_only=True):
            return 0, len(keys)

        async def put(tr: Transaction) -> tuple[int, int]:
            # not for a caller that gave up meanwhile: it may have put the sessions through another
            # server and closed them since, and this put would bring them back for good
            _time_left("its sessions were put")
            restored = present = 0
            for (inode_id, session_id), key in zip(sessions, keys, strict=True):
                if await tr.get(key) is not None:
                    present += 1
                    continue
                raw = await tr.get(schema.inode_key(inode_id))  # conflicts with the collector's claim
                if raw is None:
                    continue
                ino = meta_pb2.Inode.FromString(raw)
                if ino.type != FILE or (ino.nlink == 0 and ino.collecting):
                    continue  # gone, or its chunks are being removed: as an open now would be refused
                try:
                    check(ino, cred, R_OK)
                except FS3Error:
                    continue
                tr.set(key, self._session(cred, ino, session_id, client_id, write=False).SerializeToString())
                restored += 1
            return restored, present

        return await self.db.run(put)

    async def prune_sessions(
        self,
        client_id: int = 0,
        older_than_ns: int = 0,
        keep_clients: frozenset[int] = frozenset(),
        batch: int = 256,
        uid: int | None = None,
    ) -> int:
        """Remove the sessions of ``client_id`` (0: any client) not touched since ``older_than_ns``
        (0: whatever their age), except those of ``keep_clients`` (and, with ``uid``, those
        another uid opened); returns how many. A write
        session's file gets its length settled first; one whose length storage cannot give now
        stays for a later prune (see :meth:`_prune_write_session`)."""

        def doomed(s: meta_pb2.FileSession) -> bool:
            return (
                (not client_id or s.client_id == client_id)
                and (not older_than_ns or s.touched_ns < older_than_ns)
                and s.client_id not in keep_clients
                and (uid is None or s.uid == uid)
            )

        if self.read_sessions is not None:
            await self.read_sessions.settled()
        pruned = kept = 0
        begin = schema.INOS
        end = prefix_end(schema.INOS)
        while True:

            async def scan(tr: Transaction, begin: bytes = begin) -> list[tuple[bytes, bytes]]:
                return [tuple(kv) for kv in await tr.snapshot.get_range(begin, end, batch)]

            rows = await self.db.run(scan, read_only=True)
            sessions = [meta_pb2.FileSession.FromString(v) for _, v in rows]
            reads = [k for (k, _), s in zip(rows, sessions, strict=True) if not s.write and doomed(s)]
            writes = [s for s in sessions if s.write and doomed(s)]
            if reads:

                async def drop(tr: Transaction, keys: list[bytes] = reads) -> int:
                    n = 0
                    for key in keys:
                        raw = await tr.get(key)  # a sync may have touched it since the scan
                        if raw is not None and doomed(meta_pb2.FileSession.FromString(raw)):
                            tr.clear(key)
                            n += 1
                    return n

                pruned += await self.db.run(drop)
            for at in range(0, len(writes), _PRUNE_CONCURRENCY):
                group = writes[at : at + _PRUNE_CONCURRENCY]
                for s, outcome in zip(
                    group,
                    await asyncio.gather(
                        *(self._prune_write_session(s.inode_id, s.session_id, doomed) for s in group),
                        return_exceptions=True,
                    ),
                    strict=True,
                ):
                    if isinstance(outcome, FS3Error):
                        # Kept for the next round (see _prune_write_session).
                        kept += 1
                        log.warning(
                            "write session kept: its file's length cannot be settled now "
                            "inode=%d session=%d client_id=%d error=%s",
                            s.inode_id,
                            s.session_id,
                            s.client_id,
                            outcome,
                        )
                    elif isinstance(outcome, BaseException):
                        raise outcome
                    elif outcome:
                        pruned += 1
            if len(rows) < batch:
                break
            begin = rows[-1][0] + b"\0"
        if pruned or kept:
            log.info("pruned sessions count=%d kept=%d client_id=%d", pruned, kept, client_id)
        return pruned

    async def _prune_write_session(
        self, inode_id: int, session_id: int, doomed: Callable[[meta_pb2.FileSession], bool]
    ) -> bool:
        """End write session ``session_id`` of ``inode_id`` if it is still ``doomed``, settling the
        file's length first as a close that reports no length does (the client that held it is
        gone, and with it the length it would have reported): from storage, asked outside the
        transaction and used only if no truncate came in between. Returns whether it was ended.

        Its bytes are on storage (acknowledged) whether or not the client lived to close, so the
        length must cover them: else they stay unreadable, and a later truncate-up shows them where
        zeros belong. We cannot know whether the client wrote at all, so, as that close, the
        settlement counts as a write (mtime and ctime now, setuid/setgid cleared unless root
        opened it): an mtime bumped for nothing is better than an overwrite that leaves none, and
        a client must not keep a file's setuid bit by dying after writing to it.

        When storage cannot be asked (an FS3Error, raised), the session stays for the next round
        rather than going with a length that may be short: once gone, nothing would settle the
        length again (a later close or fsync settles only from what its own session reports).
        A session kept so does no harm meanwhile: it keeps no one out, and the length it guards
        is wrong only until storage answers. It cannot live for ever over a file that goes
        away: once the file is unlinked (nlink 0) its length no longer matters, the session goes
        without asking storage, and the collector removes the file as before."""
        queried: tuple[int | None, int] | None = None  # (length on storage, truncate_version then)

        async def fn(tr: Transaction) -> bool:
            skey = schema.session_key(inode_id, session_id)
            raw = await tr.get(skey)  # a sync may have touched it since the scan, or a close ended it
            if raw is None:
                return False
            session = meta_pb2.FileSession.FromString(raw)
            if not doomed(session):
                return False
            raw_ino = await tr.get(schema.inode_key(inode_id))
            if raw_ino is not None:
                ino = meta_pb2.Inode.FromString(raw_ino)
                if ino.nlink > 0:
                    # A trim still owed would cut what storage reports past the truncate: the
                    # query must come after it (see the retry loop below).
                    if ino.trim_version or queried is None or queried[1] != ino.truncate_version:
                        raise _AskStorage(ino.layout, ino.truncate_version)
                    if queried[0] is not None:  # None: no storage (a meta-only deployment)
                        now = inodes.now_ns()
                        _record_write(ino, session, queried[0], now, now)
                        inodes.store(tr, ino)
            tr.clear(skey)
            return True

        for _ in range(_SETTLE_ATTEMPTS):
            try:
                return await self.db.run(fn)
            except _AskStorage as ask:
                await self.finish_owed_trim(inode_id)
                queried = (await self.chunks.file_length(ask.layout, inode_id), ask.truncate_version)
        raise FS3Error(
            StatusCode.ABORTED, f"inode {inode_id} kept being truncated while its length was settled"
        )


async def _load_session(tr: ReadView, inode_id: int, session_id: int) -> tuple[bytes, meta_pb2.FileSession]:
    """Session ``session_id`` of ``inode_id`` and its key; META_BAD_HANDLE when it is not there
    (closed, or ended by a prune)."""
    skey = schema.session_key(inode_id, session_id)
    raw = await tr.get(skey)
    if raw is None:
        raise FS3Error(StatusCode.META_BAD_HANDLE, f"no session {session_id} on inode {inode_id}")
    return skey, meta_pb2.FileSession.FromString(raw)


def _record_write(
    ino: meta_pb2.Inode, session: meta_pb2.FileSession, length: int, mtime_ns: int, now: int
) -> None:
    """Record in ``ino`` what ``session`` wrote, up to ``length``: the length only grows (it
    shrinks only through truncate), and the write clears setuid/setgid unless root opened it."""
    if length > ino.size:
        ino.size = length
    if not session.fsetid:
        ino.mode = kill_suid_sgid(ino.mode, session.in_group)
    if mtime_ns >= ino.times_set_ns:  # (else made before a time set since, which stands)
        ino.mtime_ns = mtime_ns
    ino.ctime_ns = now
