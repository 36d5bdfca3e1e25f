"""The POSIX namespace over fs3.kv: lookups, creation of every inode type, links, removal, readdir.

Every operation is one serializable transaction. Reads that decide an outcome are conflict-tracked
(the parent directory's inode, the entry, the child's inode), so concurrent operations of any number
of meta processes sharing the store serialize. Non-idempotent operations take ``idem`` = (client id,
request id); the response is stored under IDEM in the same transaction and a retry returns it.

Rename, removal and recursive removal live in :mod:`fs3.meta.rename` and :mod:`fs3.meta.remove`;
attributes in :mod:`fs3.meta.attrs`; open files in :mod:`fs3.meta.sessions`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple, TypeVar

from google.protobuf.message import Message

from fs3.client.meta_client import MAX_SYMLINK_FOLLOWS
from fs3.errors import FS3Error, StatusCode, quote_name
from fs3.kv import Database, ReadView, Transaction, prefix_end
from fs3.kv.txn import COMMIT_DEADLINE
from fs3.meta import inode as inodes
from fs3.meta import schema
from fs3.meta.idalloc import InodeIdAllocator
from fs3.meta.layout import ChainAllocator, max_file_size
from fs3.meta.permissions import (
    PATH_MAX,
    R_OK,
    S_ISGID,
    S_IXGRP,
    W_OK,
    X_OK,
    Credentials,
    access_of_flags,
    allowed,
    check,
    check_name,
    kill_suid_sgid,
)
from fs3.meta.read_sessions import ReadSessions
from fs3.meta.storage_io import ChunkStore, NoStorage
from fs3.proto import meta_pb2

log = logging.getLogger(__name__)

# Ids that must not repeat across processes or runs: an application (or a test framework) seeding
# the random module must not make two clients share request or session ids.
_ids = random.SystemRandom()

M = TypeVar("M", bound=Message)
# (client id, request id[, the request's message name]); request id 0 = not retried
Idem = tuple[int, int] | tuple[int, int, str] | None


def _request_of(idem: tuple[int, int] | tuple[int, int, str]) -> str:
    return idem[2] if len(idem) > 2 else ""  # type: ignore[misc]


def replayed(idem: tuple[int, int] | tuple[int, int, str], raw: bytes, rsp_cls: type[M]) -> M:
    """The response recorded (``raw``, an IdemRecord) for the first request with ``idem``'s ids,
    for its retry; INVALID_ARGUMENT if another kind of request had them (a client that reused
    request ids: its second request would be answered as done, with the first's response, and
    never made)."""
    rec = meta_pb2.IdemRecord.FromString(raw)
    asked = _request_of(idem)
    if rec.request and asked and rec.request != asked:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"request id {idem[1]} of client {idem[0]} was used by a {rec.request} already, not by this"
            f" {asked}: a client must not reuse request ids",
        )
    return rsp_cls.FromString(rec.response)


# transactions of one call that may ask for a trim first (each trims one more file, or again)
_TRIM_ATTEMPTS = 8
# how long a settled stat waits for this process's truncates of the file (Namespace.settled_stat)
TRUNCATE_WAIT_S = 5.0
# A truncate's record that it is trimming storage (Inode.truncating_until_ns) lasts until its
# call's deadline and this margin (a storage request sent before the deadline may be applied a
# little after); a call without a deadline (in-process use) gets TRUNCATING_NO_DEADLINE_S, as does
# meta's own finishing of one that was abandoned.
TRUNCATING_MARGIN_S = 5.0
TRUNCATING_NO_DEADLINE_S = 120.0

DIRECTORY = meta_pb2.INODE_DIRECTORY
FILE = meta_pb2.INODE_FILE
SYMLINK = meta_pb2.INODE_SYMLINK

O_EXCL = 0o200
O_TRUNC = 0o1000
READDIR_DEFAULT = 256
READDIR_MAX = 4096
YIELD_EVERY = 256  # entries handled between returns to the event loop (about a millisecond)


# The deadline (event loop time) of the RPC call this task serves, set by the meta service: work
# its caller has given up on is not started (see _time_left). The client retries a timed-out call,
# on another meta server too; a first attempt that went on here, late, would commit or trim storage
# after its retry and after what the client did next.
# It bounds the call's commits too (fs3.kv.retry.COMMIT_DEADLINE, the same variable).
CALL_DEADLINE = COMMIT_DEADLINE


def _time_left(what: str) -> float | None:
    """Seconds left before the served call's deadline (None: no deadline); DEADLINE_EXCEEDED if
    none are, naming ``what`` is not done."""
    deadline = CALL_DEADLINE.get()
    if deadline is None:
        return None
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise FS3Error(StatusCode.DEADLINE_EXCEEDED, f"the caller gave up before {what}: not done")
    return left


async def _no_dir(rv: ReadView, inode_id: int) -> bool:
    """Whether directory ``inode_id`` is gone (or being removed)."""
    try:
        await inodes.load_dir(rv, inode_id)
    except FS3Error as e:
        return e.code == StatusCode.NOT_FOUND
    return False


class ReaddirPage(NamedTuple):
    """A page of a directory listing (:meth:`Namespace.readdir_page`)."""

    entries: list[meta_pb2.DirEntry]
    inodes: list[meta_pb2.Inode]  # parallel to entries, when asked for
    more: bool
    searchable: bool  # whether the caller may search the directory


class _TrimFirst(Exception):
    """Raised at the end of a transaction (which then commits nothing) whose truncates need
    files trimmed on storage first (:attr:`Trims.missing`)."""


def _trim_state(ino: meta_pb2.Inode) -> tuple[int, ...]:
    """What of an inode a trim found needed counts on (see :class:`Trims`)."""
    return (ino.size, ino.mtime_ns, ino.ctime_ns, ino.truncate_version)


class Trims:
    """The storage trims one call's truncates need before its transaction may commit (see
    :meth:`Namespace._truncate_in_txn`): those the call made (inode id -> the length trimmed to,
    and the inode's state when the trim was found needed) and those the last run of its
    transaction found missing.

    A trim counts for a later run only while the inode is as it was: a writer's length report
    that committed between the trim and this transaction (it changes the inode's ctime) was made
    before the truncate, so the bytes it reported, written after the trim, must be cut too."""

    def __init__(self) -> None:
        self.done: dict[int, tuple[int, tuple[int, ...]]] = {}
        self.missing: list[tuple[int, meta_pb2.Layout, int, tuple[int, ...]]] = []

    def need(self, ino: meta_pb2.Inode, length: int) -> None:
        state = _trim_state(ino)
        done = self.done.get(ino.id)
        if done is None or done[0] > length or done[1] != state:
            layout = meta_pb2.Layout()
            layout.CopyFrom(ino.layout)
            self.missing.append((ino.id, layout, length, state))

    def txn(self, fn: Callable[[Transaction], Awaitable[M]]) -> Callable[[Transaction], Awaitable[M]]:
        """``fn`` as a transaction that commits only if it needs no trim still to be made: the
        whole of ``fn`` runs first, so a trim is made only for a call that would succeed (a
        setattr refused for its mode after its size was checked trims nothing)."""

        async def run(tr: Transaction) -> M:
            self.missing.clear()
            rsp = await fn(tr)
            if self.missing:
                raise _TrimFirst
            return rsp

        return run


def _shown(names: list[bytes]) -> str:
    """A path from the root, as an error message names it (see quote_name)."""
    return quote_name(b"/" + b"/".join(names), limit=256)


class Namespace:
    """The metadata of one file system in a KV store, usable in-process (see :class:`MetaStore`)."""

    # Queues the sessions of read-only opens (see fs3.meta.read_sessions); None: written at once.
    read_sessions: ReadSessions | None = None

    def __init__(
        self,
        db: Database,
        *,
        layouts: ChainAllocator | None = None,
        chunks: ChunkStore | None = None,
        ids: InodeIdAllocator | None = None,
    ) -> None:
        self.db = db
        self.layouts = layouts or ChainAllocator(lambda _id: None)
        self.chunks: ChunkStore = chunks or NoStorage()
        self.ids = ids or InodeIdAllocator(db)
        # trims of storage under way in this process, by inode id
        self._trimming: dict[int, asyncio.Future[None]] = {}
        # truncates under way in this process that have begun trimming storage, by inode id: how
        # many, and an event set when the last of them ends (committed or failed)
        self._truncating: dict[int, tuple[int, asyncio.Event]] = {}

    # ---- plumbing ------------------------------------------------------------------------------

    def _mutate(
        self, idem: Idem, rsp_cls: type[M], fn: Callable[[Transaction], Awaitable[M]]
    ) -> Coroutine[Any, Any, M]:
        """Run ``fn`` in a transaction; with a request id, once only (see the module docstring).
        (Not a coroutine itself: it hands over db.run's, a frame fewer.)"""
        _time_left("its transaction")
        if idem is None or not idem[1]:
            return self.db.run(fn)
        key = schema.idem_key(idem[0], idem[1])

        async def once(tr: Transaction) -> M:
            raw = await tr.get(key)
            if raw is not None:
                return replayed(idem, raw, rsp_cls)
            rsp = await fn(tr)
            rec = meta_pb2.IdemRecord(
                created_ns=inodes.now_ns(), response=rsp.SerializeToString(), request=_request_of(idem)
            )
            tr.set(key, rec.SerializeToString())
            return rsp

        return self.db.run(once)

    async def settle_request(self, client_id: int, request_id: int) -> meta_pb2.SettleRequestRsp:
        """What became of request ``request_id`` of ``client_id``, which its client gave up
        waiting for: its recorded response if it was done; else a record that makes any attempt
        of it still under way, or sent again, answer an empty response and do nothing."""
        key = schema.idem_key(client_id, request_id)

        async def fn(tr: Transaction) -> meta_pb2.SettleRequestRsp:
            raw = await tr.get(key)
            if raw is not None:
                return meta_pb2.SettleRequestRsp(
                    done=True, response=meta_pb2.IdemRecord.FromString(raw).response
                )
            tr.set(key, meta_pb2.IdemRecord(created_ns=inodes.now_ns()).SerializeToString())
            return meta_pb2.SettleRequestRsp(done=False)

        return await self.db.run(fn)

    async def file_system_id(self) -> str:
        """The id of the file system this store holds, made now if it has none yet (a new store,
        or one made before stores had ids)."""
        made: list[str] = []

        async def fn(tr: Transaction) -> str:
            if (raw := await tr.get(schema.FILE_SYSTEM_ID_KEY)) is not None:
                return raw.decode("ascii")
            made[:] = [uuid.uuid4().hex]
            tr.set(schema.FILE_SYSTEM_ID_KEY, made[0].encode("ascii"))
            return made[0]

        fs_id = await self.db.run(fn)
        if made and made[0] == fs_id:
            log.info("this store's file system is given the id %s", fs_id)
        return fs_id

    async def ensure_root(self, mode: int = 0o755) -> None:
        """Create the root directory (owned by root) unless it exists."""

        async def fn(tr: Transaction) -> None:
            if await tr.get(schema.inode_key(schema.ROOT_ID)) is not None:
                return
            now = inodes.now_ns()
            root = inodes.new_inode(schema.ROOT_ID, DIRECTORY, mode, 0, 0, now, parent=schema.ROOT_ID)
            root.layout.CopyFrom(self.layouts.default)
            inodes.store(tr, root)
            await inodes.touch_dir(tr, root.id, now)
            tr.add_int(schema.INODE_COUNT_KEY, 1)
            log.info("created the root directory")

        await self.db.run(fn)

    async def _child(self, rv: ReadView, cred: Credentials, parent: int, name: bytes) -> meta_pb2.Inode:
        """The inode named ``name`` in ``parent``, after the search permission check."""
        p = await inodes.load_dir(rv, parent)
        check(p, cred, X_OK)
        if name == b".":
            return p
        if name == b"..":
            return await inodes.load(rv, p.parent or schema.ROOT_ID)
        check_name(name)
        raw = await rv.get(schema.dentry_key(parent, name))
        if raw is None:
            raise FS3Error(StatusCode.NOT_FOUND, f"no entry {quote_name(name)} in directory {parent}")
        return await inodes.load(rv, meta_pb2.DirEntry.FromString(raw).inode_id)

    # ---- reads ---------------------------------------------------------------------------------

    async def stat(self, inode_id: int, into: meta_pb2.Inode | None = None) -> meta_pb2.Inode:
        """The inode with ``inode_id`` (no permission needed, as for fstat); parsed into ``into``
        when given (a reply's field, sparing a copy)."""
        # One snapshot read needs no retry loop: this is db.run(..., read_only=True) inlined, as
        # stat is the most frequent request.
        tr = self.db.create_transaction()
        try:
            rv = tr.snapshot
            if into is None:
                ino = await inodes.load(rv, inode_id)
            else:
                ino = await inodes.load_into(rv, inode_id, into)
            return inodes.public(await inodes.complete(rv, ino))
        finally:
            tr.cancel()

    async def batch_stat(self, inode_ids: list[int]) -> list[meta_pb2.Inode | FS3Error]:
        """Each inode, or the error its stat would raise, from one snapshot."""

        async def fn(tr: Transaction) -> list[meta_pb2.Inode | FS3Error]:
            out: list[meta_pb2.Inode | FS3Error] = []
            for n, i in enumerate(inode_ids):
                if n and n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # a big batch must not hold the event loop
                try:
                    out.append(inodes.public(await inodes.load_full(tr.snapshot, i)))
                except FS3Error as e:
                    out.append(e.with_traceback(None))  # kept in ``out``, held by this frame
            return out

        return await self.db.run(fn, read_only=True)

    async def lookup(self, cred: Credentials, parent: int, name: bytes) -> meta_pb2.Inode:
        """The inode ``name`` in directory ``parent`` names ("." and ".." included)."""

        async def fn(tr: Transaction) -> meta_pb2.Inode:
            rv = tr.snapshot
            try:
                child = await self._child(rv, cred, parent, name)
            except FS3Error as e:
                # the directory itself is gone, not the name: a mount's cached name of it (replaced
                # by a rename, say) is looked up again on ESTALE
                if e.code == StatusCode.NOT_FOUND and await _no_dir(rv, parent):
                    raise FS3Error(StatusCode.META_STALE, f"directory {parent} is gone") from None
                raise
            return inodes.public(await inodes.complete(rv, child))

        return await self.db.run(fn, read_only=True)

    async def lookup_path(self, cred: Credentials, path: bytes, follow: bool = True) -> meta_pb2.Inode:
        """Resolve ``path`` from the root, following symlinks (at most 40: ELOOP). A trailing
        slash names a directory, as in Linux: a symlink there is followed even without ``follow``,
        and anything but a directory is ENOTDIR."""
        if len(path) >= PATH_MAX:
            raise FS3Error(StatusCode.META_NAME_TOO_LONG, f"path of {len(path)} bytes is too long")
        must_dir = path.endswith(b"/")
        follow = follow or must_dir

        async def fn(tr: Transaction) -> meta_pb2.Inode:
            rv = tr.snapshot
            follows = 0
            todo = [c for c in path.split(b"/") if c][::-1]
            # the path resolved so far (symlinks replaced by their targets), for errors to name
            walked: list[bytes] = []
            cur = await inodes.load(rv, schema.ROOT_ID)
            while todo:
                name = todo.pop()
                if cur.type != DIRECTORY:
                    raise FS3Error(StatusCode.META_NOT_DIRECTORY, f"{_shown(walked)} is not a directory")
                parent = cur
                try:
                    cur = await self._child(rv, cred, cur.id, name)
                except FS3Error as e:
                    shown = _shown([*walked, name])
                    if e.code == StatusCode.NOT_FOUND:
                        raise FS3Error(e.code, f"{shown} does not exist") from None
                    raise FS3Error(e.code, f"{shown}: {e.message}") from None
                walked.append(name)
                if cur.type == SYMLINK and (todo or follow):
                    follows += 1
                    if follows > MAX_SYMLINK_FOLLOWS:
                        raise FS3Error(
                            StatusCode.META_TOO_MANY_SYMLINKS,
                            f"{_shown(walked)}: too many levels of symlinks",
                        )
                    target = cur.symlink_target
                    todo.extend([c for c in target.split(b"/") if c][::-1])
                    walked = [] if target.startswith(b"/") else walked[:-1]
                    cur = await inodes.load(rv, schema.ROOT_ID) if target.startswith(b"/") else parent
            if must_dir and cur.type != DIRECTORY:
                raise FS3Error(StatusCode.META_NOT_DIRECTORY, f"{_shown(walked)} is not a directory")
            return inodes.public(await inodes.complete(rv, cur))

        return await self.db.run(fn, read_only=True)

    async def readlink(self, inode_id: int) -> bytes:
        ino = await self.stat(inode_id)
        if ino.type != SYMLINK:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"inode {inode_id} is not a symlink")
        return ino.symlink_target

    async def readdir(
        self,
        cred: Credentials,
        inode_id: int,
        after: bytes = b"",
        limit: int = 0,
        with_inodes: bool = False,
    ) -> tuple[list[meta_pb2.DirEntry], list[meta_pb2.Inode], bool]:
        """A page of entries in name order after ``after``; returns (entries, inodes, more)."""
        page = await self.readdir_page(cred, inode_id, after, limit, with_inodes)
        return page.entries, page.inodes, page.more

    async def readdir_page(
        self,
        cred: Credentials,
        inode_id: int,
        after: bytes = b"",
        limit: int = 0,
        with_inodes: bool = False,
    ) -> ReaddirPage:
        """:meth:`readdir`, and whether ``cred`` may search the directory (as the same snapshot
        has it): without that, a caller could not reach the entries' inodes by name."""
        limit = min(limit or READDIR_DEFAULT, READDIR_MAX)

        async def fn(tr: Transaction) -> ReaddirPage:
            rv = tr.snapshot
            d = await inodes.load_dir(rv, inode_id)
            check(d, cred, R_OK)
            prefix = schema.dentry_prefix(inode_id)
            begin = prefix + after + b"\0" if after else prefix
            rows = await rv.get_range(begin, prefix_end(prefix), limit + 1)
            more = len(rows) > limit
            entries = []
            found = []
            for n, (key, value) in enumerate(rows[:limit]):
                if n and n % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # a big page must not hold the event loop
                e = meta_pb2.DirEntry.FromString(value)
                e.parent = inode_id
                e.name = schema.name_of_dentry_key(key)
                entries.append(e)
                if with_inodes:
                    found.append(inodes.public(await inodes.load_full(rv, e.inode_id)))
            return ReaddirPage(entries, found, more, allowed(d, cred, X_OK))

        return await self.db.run(fn, read_only=True)

    # ---- creation ------------------------------------------------------------------------------

    async def _new_entry(
        self,
        tr: Transaction,
        cred: Credentials,
        parent: int,
        name: bytes,
        itype: int,
        mode: int,
        inode_id: int,
        **fields: object,
    ) -> tuple[meta_pb2.Inode, meta_pb2.Inode]:
        """Insert a new inode named ``name`` into ``parent``; returns (parent, new inode)."""
        p = await inodes.load_dir(tr, parent)
        check(p, cred, X_OK)
        key = schema.dentry_key(parent, name)
        if await tr.get(key) is not None:
            raise FS3Error(StatusCode.ALREADY_EXISTS, f"{quote_name(name)} exists in directory {parent}")
        return p, await self._insert(tr, cred, p, key, itype, mode, inode_id, **fields)

    async def _insert(
        self,
        tr: Transaction,
        cred: Credentials,
        p: meta_pb2.Inode,
        key: bytes,
        itype: int,
        mode: int,
        inode_id: int,
        into: meta_pb2.Inode | None = None,
        **fields: object,
    ) -> meta_pb2.Inode:
        """Insert a new inode under the (checked absent) entry ``key`` of directory ``p``; made in
        ``into`` (an empty Inode, such as a reply's) when given."""
        parent = p.id
        check(p, cred, W_OK | X_OK)
        now = inodes.now_ns()
        gid = p.gid if p.mode & S_ISGID else cred.gid
        if p.mode & S_ISGID:
            if itype == DIRECTORY:
                mode |= S_ISGID
            elif mode & S_IXGRP and not cred.is_root and not cred.in_group(gid):
                # Linux's mode_strip_sgid: the inherited group is not the caller's, and an
                # executable setgid file would run with a group the caller was never given.
                mode &= ~S_ISGID
        ino = inodes.new_inode(inode_id, itype, mode, cred.uid, gid, now, into=into, **fields)
        if itype == FILE:
            self.layouts.file_layout(p.layout, into=ino.layout)
        elif itype == DIRECTORY:
            ino.parent = parent
            ino.layout.CopyFrom(p.layout)
            del ino.layout.chains[:]
            await inodes.touch_dir(tr, inode_id, now)
            tr.add_int(schema.dir_links_key(parent), 1)
        inodes.store(tr, ino)
        tr.set(key, meta_pb2.DirEntry(inode_id=inode_id, type=itype).SerializeToString())
        await inodes.touch_dir(tr, parent, now)
        tr.add_int(schema.INODE_COUNT_KEY, 1)
        return ino

    async def mkdir(
        self, cred: Credentials, parent: int, name: bytes, mode: int, umask: int = 0, idem: Idem = None
    ) -> meta_pb2.Inode:
        """Make a directory; it inherits the parent's default layout (and setgid bit)."""
        check_name(name)
        inode_id = self.ids.take() or await self.ids.allocate()

        async def fn(tr: Transaction) -> meta_pb2.InodeRsp:
            # As Linux's vfs_mkdir: of the special bits only the sticky bit is the caller's to
            # ask for; setgid comes from the parent alone, and setuid means nothing on a directory.
            _, ino = await self._new_entry(
                tr, cred, parent, name, DIRECTORY, mode & 0o1777 & ~umask, inode_id
            )
            return meta_pb2.InodeRsp(inode=inodes.public(ino))

        return (await self._mutate(idem, meta_pb2.InodeRsp, fn)).inode

    async def symlink(
        self, cred: Credentials, parent: int, name: bytes, target: bytes, idem: Idem = None
    ) -> meta_pb2.Inode:
        check_name(name)
        if not target:
            raise FS3Error(StatusCode.NOT_FOUND, "empty symlink target")
        if len(target) >= PATH_MAX:
            raise FS3Error(StatusCode.META_NAME_TOO_LONG, f"symlink target of {len(target)} bytes")
        if b"\0" in target:
            raise FS3Error(StatusCode.META_INVALID_NAME, "symlink target contains NUL")
        inode_id = self.ids.take() or await self.ids.allocate()

        async def fn(tr: Transaction) -> meta_pb2.InodeRsp:
            _, ino = await self._new_entry(
                tr, cred, parent, name, SYMLINK, 0o777, inode_id, symlink_target=target, size=len(target)
            )
            return meta_pb2.InodeRsp(inode=ino)

        return (await self._mutate(idem, meta_pb2.InodeRsp, fn)).inode

    async def mknod(
        self,
        cred: Credentials,
        parent: int,
        name: bytes,
        mode: int,
        rdev: int = 0,
        umask: int = 0,
        idem: Idem = None,
    ) -> meta_pb2.Inode:
        """Make a regular file, FIFO, socket or device node (``mode`` carries the S_IF* type bits)."""
        check_name(name)
        itype = inodes.type_of_mode(mode) if mode & inodes.S_IFMT else FILE
        if itype in (0, DIRECTORY, SYMLINK):
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT, f"mknod cannot make type bits {mode & inodes.S_IFMT:o}"
            )
        if itype in (meta_pb2.INODE_CHAR_DEVICE, meta_pb2.INODE_BLOCK_DEVICE) and not cred.is_root:
            raise FS3Error(StatusCode.META_NOT_PERMITTED, "only root may make device nodes")
        inode_id = self.ids.take() or await self.ids.allocate()
        extra = {"rdev": rdev} if itype in (meta_pb2.INODE_CHAR_DEVICE, meta_pb2.INODE_BLOCK_DEVICE) else {}

        async def fn(tr: Transaction) -> meta_pb2.InodeRsp:
            _, ino = await self._new_entry(
                tr, cred, parent, name, itype, mode & 0o7777 & ~umask, inode_id, **extra
            )
            return meta_pb2.InodeRsp(inode=ino)

        return (await self._mutate(idem, meta_pb2.InodeRsp, fn)).inode

    async def create(
        self,
        cred: Credentials,
        parent: int,
        name: bytes,
        mode: int,
        flags: int = 0,
        umask: int = 0,
        *,
        session: bool = False,
        client_id: int = 0,
        idem: Idem = None,
    ) -> meta_pb2.CreateRsp:
        """open(O_CREAT): make a regular file, or open the existing one (EEXIST with O_EXCL; O_TRUNC
        empties it). With ``session`` the reply carries a new session id (see
        :mod:`fs3.meta.sessions`)."""
        check_name(name)
        inode_id = self.ids.take() or await self.ids.allocate()
        session_id = _ids.getrandbits(63) + 1 if session else 0
        # (an O_EXCL create trims nothing: an existing file is refused first)
        trims = None if flags & O_EXCL else Trims()

        async def fn(tr: Transaction) -> meta_pb2.CreateRsp:
            p = await inodes.load_dir(tr, parent)
            check(p, cred, X_OK)
            key = schema.dentry_key(parent, name)
            raw = await tr.get(key)
            rsp = None
            if raw is None:
                # made in the reply itself rather than copied into it (a new inode has none of
                # the fields public() clears)
                rsp = meta_pb2.CreateRsp(created=True)
                ino = await self._insert(
                    tr, cred, p, key, FILE, mode & 0o7777 & ~umask, inode_id, into=rsp.inode
                )
            else:
                if flags & O_EXCL:
                    raise FS3Error(
                        StatusCode.ALREADY_EXISTS, f"{quote_name(name)} exists in directory {parent}"
                    )
                ino = await inodes.load(tr, meta_pb2.DirEntry.FromString(raw).inode_id)
                if ino.type == DIRECTORY:
                    raise FS3Error(StatusCode.META_IS_DIRECTORY, f"{quote_name(name)} is a directory")
                check(ino, cred, access_of_flags(flags))
                assert trims is not None  # (not O_EXCL)
                if flags & O_TRUNC and ino.type == FILE:
                    self._truncate_in_txn(tr, cred, ino, 0, trims)
                else:
                    self._settle_owed_trim(tr, ino, trims)
            if session_id and ino.type == FILE:
                write = bool(flags & 3) or rsp is not None
                self._open_session(tr, cred, ino, session_id, client_id, write=write)
                sid = session_id
            else:
                sid = 0
            if rsp is None:
                rsp = meta_pb2.CreateRsp(inode=inodes.public(ino), created=False)
            rsp.session_id = sid
            return rsp

        if flags & O_EXCL:
            # an existing file is refused before anything could need trimming (the usual create:
            # two coroutine levels fewer)
            return await self._mutate(idem, meta_pb2.CreateRsp, fn)
        assert trims is not None
        return await self._trimming_first(
            trims, lambda: self._mutate(idem, meta_pb2.CreateRsp, trims.txn(fn))
        )

    # Shared with sessions and attrs (defined here so create can use them).

    def _open_session(
        self,
        tr: Transaction,
        cred: Credentials,
        ino: meta_pb2.Inode,
        session_id: int,
        client_id: int,
        write: bool,
    ) -> None:
        s = self._session(cred, ino, session_id, client_id, write)
        tr.set(schema.session_key(ino.id, session_id), s.SerializeToString())

    @staticmethod
    def _session(
        cred: Credentials, ino: meta_pb2.Inode, session_id: int, client_id: int, write: bool
    ) -> meta_pb2.FileSession:
        now = inodes.now_ns()
        return meta_pb2.FileSession(
            inode_id=ino.id,
            session_id=session_id,
            client_id=client_id,
            write=write,
            opened_ns=now,
            touched_ns=now,
            truncate_version=ino.truncate_version,
            # Writes go straight to storage; meta learns of them when the session settles and
            # knows the opener, not the writer, so the opener's privilege stands for its writes.
            fsetid=cred.is_root,
            uid=cred.uid,
            in_group=cred.is_root or cred.in_group(ino.gid),
        )

    def _truncate_in_txn(
        self,
        tr: Transaction,
        cred: Credentials,
        ino: meta_pb2.Inode,
        size: int,
        trims: Trims,
        now: int | None = None,
    ) -> None:
        """Set the length of file ``ino`` for ``cred`` (truncate, O_TRUNC) at time ``now`` (its mtime
        and ctime; the clock's when None); as on Linux a caller other than root clears
        setuid/setgid (see :func:`kill_suid_sgid`). The chunks past
        ``size`` must be gone from storage before this commits, whatever the settled size (a
        writer's unreported bytes may lie past it): unless this call has trimmed them, ``trims``
        notes them missing, its transaction (:meth:`Trims.txn`) commits nothing, and
        :meth:`_trimming_first` trims and runs it again.

        Trimming first, not after the commit: a trim left for later (meta killed, storage down)
        would, once made, cut what writers with sessions opened before the truncate wrote after
        it, fsynced bytes included. Trimmed first, a failed trim fails the truncate with nothing
        committed (the chunks it did remove read as zeros up to the old length), and nothing is
        trimmed later. Writes that land between the trim and the commit count as after the
        truncate: their session's next report finds the truncate and asks storage for the length."""
        if size > max_file_size(ino.layout):
            raise FS3Error(StatusCode.META_FILE_TOO_LARGE, f"size {size} exceeds the layout's maximum")
        trim = min(size, ino.trim_length) if ino.trim_version else size
        if ino.truncating_until_ns:  # another truncate's trim, perhaps made in part: this one's first
            trim = min(trim, ino.truncating_length)
        trims.need(ino, trim)
        if now is None:
            now = inodes.now_ns()
        # every truncate, even one to the length meta has: a writer may not have reported what it
        # wrote past it yet, and its report must not bring the removed bytes' length back
        ino.truncate_version += 1
        ino.trim_version = ino.trim_length = 0
        self._truncated(tr, ino)
        ino.size = size
        ino.mtime_ns = ino.ctime_ns = now
        if not cred.is_root:
            ino.mode = kill_suid_sgid(ino.mode, cred.in_group(ino.gid))
        inodes.store(tr, ino)

    def _settle_owed_trim(self, tr: Transaction, ino: meta_pb2.Inode, trims: Trims) -> None:
        """A trim an older build's truncate left owed in the inode (``trim_version``; this build
        never leaves one) is made before the file is opened or resized, and cleared; so is a
        truncate that began trimming and was abandoned (:meth:`_finish_abandoned`)."""
        if ino.trim_version:
            trims.need(ino, ino.trim_length)
            ino.trim_version = ino.trim_length = 0
            inodes.store(tr, ino)
        self._finish_abandoned(tr, ino, trims)

    @staticmethod
    def _truncated(tr: Transaction, ino: meta_pb2.Inode) -> None:
        """Clear the record of truncates trimming storage (a truncate committing has trimmed to
        it, see :meth:`_truncate_in_txn`)."""
        if ino.truncating_until_ns:
            ino.truncating_length = ino.truncating_until_ns = 0
            tr.clear(schema.truncating_key(ino.id))

    def _finish_abandoned(self, tr: Transaction, ino: meta_pb2.Inode, trims: Trims) -> bool:
        """Finish the truncate ``ino`` records as trimming storage once no attempt of its call can
        still trim or commit (``truncating_until_ns`` passed: meta killed, its client gone or out
        of time, storage down): its trim may have been made in part, the chunks past the length
        gone under the old size, which would read as zeros for ever. Finished as asked: trimmed
        (again) and the size set. Whether there was one to finish."""
        if not ino.truncating_until_ns:
            return False
        # (this call's own record, made before its trim, extended the time: see _trimming_first)
        if ino.truncating_until_ns > inodes.now_ns() and ino.id not in trims.done:
            return False
        length = ino.truncating_length
        trims.need(ino, length)
        if not trims.missing:  # (the run that commits it, once trimmed)
            log.warning(
                "finished a truncate abandoned while it trimmed storage inode=%#x length=%d size was %d",
                ino.id,
                length,
                ino.size,
            )
        ino.truncate_version += 1
        self._truncated(tr, ino)
        ino.size = length
        ino.mtime_ns = ino.ctime_ns = inodes.now_ns()
        inodes.store(tr, ino)
        return True

    async def _record_truncating(self, inode_id: int, length: int, state: tuple[int, ...]) -> bool:
        """Record in the inode, before a trim of its chunks to ``length``, that a truncate is
        trimming storage and until when its call may (see ``Inode.truncating_until_ns``); unless
        the inode is no longer in the ``state`` its transaction found the trim needed in (False):
        the trim is not made then (a second finisher of an abandoned truncate, finished meanwhile,
        made a new record and cut what was written since)."""
        left = _time_left("trimming storage")
        until = inodes.now_ns() + int(
            ((TRUNCATING_NO_DEADLINE_S if left is None else left) + TRUNCATING_MARGIN_S) * 1e9
        )

        async def fn(tr: Transaction) -> bool:
            raw = await tr.get(schema.inode_key(inode_id))
            if raw is None:
                return False
            ino = meta_pb2.Inode.FromString(raw)
            if _trim_state(ino) != state:
                return False
            if ino.truncating_until_ns:
                ino.truncating_length = min(ino.truncating_length, length)
                ino.truncating_until_ns = max(ino.truncating_until_ns, until)
            else:
                ino.truncating_length, ino.truncating_until_ns = length, until
            inodes.store(tr, ino)
            tr.set(schema.truncating_key(inode_id), b"")
            return True

        return await self.db.run(fn)

    async def finish_abandoned_truncates(self) -> int:
        """Finish the truncates that began trimming storage and were abandoned (see
        :meth:`_finish_abandoned`); returns how many. Run by the collector's rounds."""
        begin, end = schema.TRNC, prefix_end(schema.TRNC)

        async def scan(tr: Transaction) -> list[int]:
            # those whose time has passed (or whose inode is gone or cleared of it): the others'
            # truncates may still be under way
            now, found = inodes.now_ns(), []
            for key, _ in await tr.snapshot.get_range(begin, end, 256):
                inode_id = schema.id_of_truncating_key(key)
                raw = await tr.snapshot.get(schema.inode_key(inode_id))
                if raw is None or meta_pb2.Inode.FromString(raw).truncating_until_ns <= now:
                    found.append(inode_id)
            return found

        finished = 0
        for inode_id in await self.db.run(scan, read_only=True):
            finished += await self._finish_abandoned_of(inode_id)
        return finished

    async def _finish_abandoned_of(self, inode_id: int) -> bool:
        """:meth:`_finish_abandoned` of ``inode_id`` in a transaction of its own; whether it
        finished one (a failure is logged: the next round, or the file's next use, tries again)."""
        trims = Trims()
        done: list[bool] = []

        async def fn(tr: Transaction) -> None:
            done.clear()
            raw = await tr.get(schema.inode_key(inode_id))
            if raw is None:  # removed since: nothing to finish
                tr.clear(schema.truncating_key(inode_id))
                return
            ino = meta_pb2.Inode.FromString(raw)
            if not ino.truncating_until_ns:
                tr.clear(schema.truncating_key(inode_id))
            elif self._finish_abandoned(tr, ino, trims):
                done.append(True)

        # its trim within a deadline of its own, as a call's (the record lasts until then)
        token = CALL_DEADLINE.set(asyncio.get_running_loop().time() + TRUNCATING_NO_DEADLINE_S)
        try:
            await self._trimming_first(trims, lambda: self.db.run(trims.txn(fn)))
        except FS3Error as e:
            log.warning("finishing an abandoned truncate failed inode=%#x error=%s", inode_id, e)
            return False
        finally:
            CALL_DEADLINE.reset(token)
        return bool(done)

    async def _trimming_first(self, trims: Trims, run: Callable[[], Awaitable[M]]) -> M:
        """``run()`` a transaction (made with ``trims.txn``) whose truncates need their files
        trimmed first (see :meth:`_truncate_in_txn`): each time it finds trims missing, make them
        and run it again. A storage error propagates, and nothing was committed. From the first
        trim of a file to the end, :meth:`settled_stat` of it waits (see there)."""
        held: list[int] = []
        try:
            for _ in range(_TRIM_ATTEMPTS):
                try:
                    return await run()
                except _TrimFirst:
                    for inode_id, layout, length, state in list(trims.missing):
                        if inode_id not in held:
                            held.append(inode_id)
                            count, ended = self._truncating.get(inode_id, (0, asyncio.Event()))
                            self._truncating[inode_id] = (count + 1, ended)
                        # recorded first: a trim made (in part) for a truncate that then never
                        # commits is finished by meta, not left as zeros under the old size
                        if not await self._record_truncating(inode_id, length, state):
                            # changed since (another truncate committed, or finished the one this
                            # finishes; a writer reported): the trim is asked for again, or not
                            break
                        await self._trim(inode_id, layout, length)
                        trims.done[inode_id] = (length, state)
            raise FS3Error(StatusCode.ABORTED, "the files to truncate kept changing")
        finally:
            for inode_id in held:
                count, ended = self._truncating[inode_id]
                if count > 1:
                    self._truncating[inode_id] = (count - 1, ended)
                else:
                    del self._truncating[inode_id]
                    ended.set()

    async def settled_stat(self, inode_id: int, into: meta_pb2.Inode | None = None) -> meta_pb2.Inode:
        """:meth:`stat`, once the truncates of the file that this process has begun trimming have
        ended (at most TRUNCATE_WAIT_S): a client that read a hole asks so whether the file was
        cut. Between a truncate's trim of storage and its commit the chunks are gone while the
        length is still the old one, and the hole would have read as zeros that were never written
        (a reader of a file another process rewrites with O_TRUNC got 4 KiB of zeros in 6% of its
        reads). A truncate run by another meta process is not waited for, nor one that began
        after this call (the hole was found before it). A truncate abandoned while it trimmed,
        whose time has passed, is finished first (not left to the collector's next round)."""
        busy = self._truncating.get(inode_id)
        if busy is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(busy[1].wait(), TRUNCATE_WAIT_S)
        tr = self.db.create_transaction()
        try:
            raw = await tr.snapshot.get(schema.inode_key(inode_id))
        finally:
            tr.cancel()
        if raw is not None:
            until = meta_pb2.Inode.FromString(raw).truncating_until_ns
            if until and until <= inodes.now_ns():
                await self._finish_abandoned_of(inode_id)  # (failed: the stat says what there is)
        return await self.stat(inode_id, into)

    async def _trim(self, inode_id: int, layout: meta_pb2.Layout, length: int) -> None:
        """Cut file ``inode_id``'s chunks on storage to ``length``.

        Trims of one file in this process take turns, and each goes on if its caller is
        cancelled: a request whose client timed out and retried must not commit (and its client
        write again) while its first attempt's trim may still reach storage and cut the new
        bytes; the retry waits for it, then trims itself."""
        while (earlier := self._trimming.get(inode_id)) is not None:
            await asyncio.wait([earlier])
        # within the caller's deadline, storage included (a trim landing after it could cut what
        # the client wrote after retrying elsewhere)
        left = _time_left("trimming storage")
        trim = (
            self.chunks.truncate(layout, inode_id, length)
            if left is None
            else self.chunks.truncate(layout, inode_id, length, timeout_s=left)
        )
        task = asyncio.ensure_future(trim)
        self._trimming[inode_id] = task
        task.add_done_callback(lambda t: self._trim_done(inode_id, t))
        try:
            await asyncio.shield(task)
        finally:
            del task  # a failure's traceback holds this frame: no cycle through the task holding it

    def _trim_done(self, inode_id: int, task: asyncio.Future[None]) -> None:
        if self._trimming.get(inode_id) is task:
            del self._trimming[inode_id]
        if not task.cancelled():
            task.exception()  # retrieved: a caller that was cancelled meanwhile did not

    async def finish_owed_trim(self, inode_id: int) -> None:
        """Make and clear the trim an older build's truncate of ``inode_id`` left owed, if any."""
        trims = Trims()

        async def fn(tr: Transaction) -> None:
            raw = await tr.get(schema.inode_key(inode_id))
            if raw is not None:
                self._settle_owed_trim(tr, meta_pb2.Inode.FromString(raw), trims)

        await self._trimming_first(trims, lambda: self.db.run(trims.txn(fn)))
