"""The client of fs3-meta: every namespace operation over fs3 RPC, with failover across meta servers.

::

    client = MetaClient(["10.0.0.5:8100", "10.0.0.6:8100"], secret,
                        user=UserInfo(uid=1000, gid=1000, token=token))
    f = await client.create(ROOT_ID, b"a.txt", 0o644, session=True)
    await client.close_file(f.inode.id, f.session_id, written_length=4096, wrote=True)
    async for entry in client.listdir(ROOT_ID): ...
    await client.close()

Meta servers are stateless, so any of them can serve any call. A call that fails for want of a
server (connection refused or lost, a deadline, an overloaded or stopping server) is re-sent to the
next one until ``timeout_s`` runs out. Non-idempotent calls (create, mkdir, mknod, symlink, link, unlink,
rmdir, rename, close) carry a request id that stays the same across those re-sends, and the server returns
the first result for it, so a create whose reply was lost does not fail with EEXIST on retry.
Errors raise :class:`fs3.errors.FS3Error` with the server's status code (``.errno`` for POSIX).

Open files hold sessions on meta. A client that keeps a mgmtd client session alive
(:class:`fs3.client.mgmtd_client.ClientSessionKeeper`) with ``client_id = str(meta_client.client_id)``
keeps its meta sessions from expiring however long its files stay open; sessions of a client that
vanishes expire after the meta's ``session_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from google.protobuf.message import Message

from fs3.capability import CapabilityCache
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, ServiceDef
from fs3.net.transport import Address, parse_address
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

# Ids that must not repeat across processes or runs: an application (or a test framework) seeding
# the random module must not make two clients share request or session ids.
_ids = random.SystemRandom()
# The last request id drawn for each client id in this process. MetaClients that share a client id
# (a mount makes one per calling user, all with the mount's id) must share this too: each on its
# own could hand out an id another already used once the wall clock steps back, and meta would
# answer the new request with the old one's recorded result.
_last_request_ids: dict[int, int] = {}
_last_request_ids_lock = threading.Lock()

ROOT_ID = 1

# "host:port" -> (host, port), parsed once per address rather than on every call (the address list
# is public and may be replaced, so this is keyed by the string, not kept beside the list).
_parsed: dict[str, Address] = {}


def _parsed_address(address: str) -> Address:
    parsed = _parsed.get(address)
    if parsed is None:
        parsed = _parsed[address] = parse_address(address)
    return parsed


log = logging.getLogger(__name__)

#: How long after meta answered a close before writing the session's end (``InodeRsp.end_queued``),
#: or an open before writing its session (``OpenRsp.session_queued``), this client ends (puts) the
#: session again if it then loses that meta server (its connection ends, or a call to it fails
#: over): meta writes what it queued within milliseconds, but a host that dies leaves the
#: connection to time out (TCP keepalive, about a minute) ...
RECLOSE_S = 120.0
#: ... for at most this many closes (and as many opens) per server (the oldest are let go)
RECLOSE_MAX = 65536
#: sessions per EndReadSessions or RestoreReadSessions request
MAX_END_READ_SESSIONS = 4096
#: an open or create given up on (its outcome unknown) is settled after this long, then at doubling
#: intervals up to SETTLE_MAX_S while meta cannot be reached (see QueuedSessions.settle)
SETTLE_FIRST_S = 1.0
SETTLE_MAX_S = 30.0
#: how long a request given up on waits for meta to say what became of it (MetaClient._call)
SETTLE_NOW_S = 5.0


class QueuedSessions:
    """Read sessions whose open or end meta queued when it answered (``OpenRsp.session_queued``,
    ``InodeRsp.end_queued``), per meta server, for :data:`RECLOSE_S`; opens only while this client
    holds the file open. When this client loses that server, it puts those it holds open again
    (RestoreReadSessions) and ends the closed ones again (EndReadSessions), through any server, in
    batches: the process may have died before writing them. A lost end would leave its session
    until this client goes, and with it the chunks of its file if unlinked; a lost open would let
    the collector remove the chunks of a file unlinked while this client reads it. Usually nothing
    is left (a clean stop writes them all), and then a batch costs meta a snapshot read. Shared by
    a :class:`MetaClient` and the clients acting as other users through it; a session is put again
    through the client (the user) that opened it."""

    def __init__(self, client: MetaClient) -> None:
        self._client = client
        self._recent: dict[Address, deque[tuple[float, int, int]]] = {}
        # server -> (inode id, session id) -> (when answered, the client that opened it), oldest first
        self._opens: dict[Address, dict[tuple[int, int], tuple[float, MetaClient]]] = {}
        self._open_at: dict[tuple[int, int], Address] = {}  # the server of each of _opens' sessions
        self._restoring: dict[tuple[int, int], asyncio.Task[None]] = {}  # puts being sent again
        self._put_again: set[tuple[int, int]] = set()  # sent again, and maybe put, until forgotten
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.ended = 0  # sessions ended again (for tests and logs)
        self.settled = 0  # sessions of opens given up on, found and closed (see settle)
        self.restored = 0  # sessions put again
        client.rpc.on_connection_lost(self.lost)

    def add(self, address: Address, inode_id: int, session_id: int) -> None:
        """A close of this read session was answered by ``address`` with its end queued."""
        now = time.monotonic()
        recent = self._recent.get(address)
        if recent is None:
            recent = self._recent[address] = deque(maxlen=RECLOSE_MAX)
        recent.append((now, inode_id, session_id))
        while recent[0][0] < now - RECLOSE_S:
            recent.popleft()

    def opened(self, address: Address, client: MetaClient, inode_id: int, session_id: int) -> None:
        """An open was answered by ``address`` with its session queued (through ``client``)."""
        key = (inode_id, session_id)
        self.forget(inode_id, session_id)
        now = time.monotonic()
        opens = self._opens.get(address)
        if opens is None:
            opens = self._opens[address] = {}
        opens[key] = (now, client)
        self._open_at[key] = address
        while opens:
            (oldest, (at, _)) = next(iter(opens.items()))
            if at >= now - RECLOSE_S and len(opens) <= RECLOSE_MAX:
                break
            del opens[oldest]
            self._open_at.pop(oldest, None)

    def forget(self, inode_id: int, session_id: int) -> None:
        """The session is being closed (or was ended by meta): it is not put again from now on."""
        key = (inode_id, session_id)
        self._put_again.discard(key)
        address = self._open_at.pop(key, None)
        if address is not None:
            opens = self._opens.get(address)
            if opens is not None:
                opens.pop(key, None)
                if not opens:
                    del self._opens[address]

    async def closing(self, inode_id: int, session_id: int) -> None:
        """:meth:`forget`, and wait for a put of the session being sent again: the close must come
        after it, or the put would bring back the session the close ended."""
        self.forget(inode_id, session_id)
        task = self._restoring.get((inode_id, session_id))
        if task is not None:
            await asyncio.wait({task})

    def server_of(self, inode_id: int, session_id: int) -> Address | None:
        """The server that answered the session's open before writing it, while that is recorded."""
        return self._open_at.get((inode_id, session_id))

    async def restoring(self, inode_id: int, session_id: int) -> bool:
        """Whether the session was sent to be put again (waiting for that to be done): meta may
        have it after all, though an answer before said it had not."""
        key = (inode_id, session_id)
        task = self._restoring.get(key)
        if task is not None:
            await asyncio.wait({task})
        return key in self._put_again

    def lost(self, address: Address) -> None:
        """This client lost ``address``: put and end again its recent queued sessions. Deferred a
        turn of the loop, so that an open or close whose answer came with the connection's end is
        counted first (an RDMA connection delivers both in one callback)."""
        if not self._closed:
            asyncio.get_running_loop().call_soon(self._again, address)

    def _again(self, address: Address) -> None:
        if self._closed:
            return
        cutoff = time.monotonic() - RECLOSE_S
        loop = asyncio.get_running_loop()
        opens = self._opens.pop(address, None)
        if opens:
            by_client: dict[int, tuple[MetaClient, list[tuple[int, int]]]] = {}
            for key, (at, client) in opens.items():
                self._open_at.pop(key, None)
                if at >= cutoff:
                    by_client.setdefault(id(client), (client, []))[1].append(key)
            for client, keys in by_client.values():
                for i in range(0, len(keys), MAX_END_READ_SESSIONS):
                    batch = keys[i : i + MAX_END_READ_SESSIONS]
                    task = loop.create_task(self._restore(address, client, batch))
                    self._track(task)
                    for key in batch:
                        self._restoring[key] = task
                        self._put_again.add(key)
        recent = self._recent.pop(address, None)
        if recent:
            ends = [m.SessionRef(inode=i, session_id=s) for at, i, s in recent if at >= cutoff]
            if ends:
                self._track(loop.create_task(self._send(address, ends)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restore(self, address: Address, client: MetaClient, keys: list[tuple[int, int]]) -> None:
        req = m.RestoreReadSessionsReq(inode_ids=[i for i, _ in keys], session_ids=[s for _, s in keys])
        client.avoid(address)  # not first to the server lost: a dead host's connect would time out
        try:
            rsp = await client.call("RestoreReadSessions", req)
        except Exception as e:  # nobody to raise it to: a reader's check then finds the session gone
            log.warning(
                "meta %s:%d lost: could not put again %d read sessions of files held open whose "
                "open it answered before writing them error=%s",
                *address,
                len(keys),
                e,
            )
            return
        finally:
            for key in keys:
                if self._restoring.get(key) is asyncio.current_task():
                    del self._restoring[key]
        self.restored += rsp.restored
        log.log(
            logging.WARNING if rsp.restored + rsp.present < len(keys) else logging.INFO,
            "meta %s:%d lost: put again %d read sessions of files held open that it had answered "
            "the open of (%d there already, %d could not be put: the file is gone or being "
            "collected, or no longer readable by the user; their next hole read asks meta) uid=%d",
            *address,
            rsp.restored,
            rsp.present,
            len(keys) - rsp.restored - rsp.present,
            client.user.uid,
        )

    async def _send(self, address: Address, ends: list[m.SessionRef]) -> None:
        ended = 0
        self._client.avoid(address)
        try:
            for i in range(0, len(ends), MAX_END_READ_SESSIONS):
                req = m.EndReadSessionsReq(sessions=ends[i : i + MAX_END_READ_SESSIONS])
                ended += (await self._client.call("EndReadSessions", req)).ended
        except Exception as e:  # nobody to raise it to: the sessions stay until this client goes
            log.warning(
                "meta %s:%d lost: could not end again read sessions it answered the close of "
                "(%d ended of %d) error=%s",
                *address,
                ended,
                len(ends),
                e,
            )
            return
        finally:
            self.ended += ended
        log.log(
            logging.INFO if ended else logging.DEBUG,
            "meta %s:%d lost: ended %d read sessions it had answered the close of but not written "
            "(of %d closed through it in the last %.0f s)",
            *address,
            ended,
            len(ends),
            RECLOSE_S,
        )

    def settle(
        self, client: MetaClient, request_id: int, rsp_cls: type[m.OpenRsp] | type[m.CreateRsp]
    ) -> None:
        """An open, or a create with a session, that ``client`` gave up on (meta unreachable past
        its retry budget, or the answer lost) may have opened a session on meta all the same:
        nobody would close it, and it would keep the file's chunks, once unlinked, for as long as
        this client lives. Meta is asked what became of the request (SettleRequest) until it
        answers; a session it opened is closed, and a request not done yet never will be."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._settle(client, request_id, rsp_cls))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, client: MetaClient, request_id: int, rsp_cls: type[Message]) -> None:
        delay = SETTLE_FIRST_S
        while True:
            await asyncio.sleep(delay)
            try:
                done = await client.call("SettleRequest", m.SettleRequestReq(request_id=request_id))
                if not done.done or not done.response:
                    return  # not done, and now never will be
                rsp = rsp_cls.FromString(done.response)
                if rsp.session_id:  # type: ignore[attr-defined]
                    await client.close_file(rsp.inode.id, rsp.session_id)  # type: ignore[attr-defined]
                    self.settled += 1
                    log.info(
                        "closed the session of an open given up on inode=%#x session=%d",
                        rsp.inode.id,  # type: ignore[attr-defined]
                        rsp.session_id,  # type: ignore[attr-defined]
                    )
                return
            except FS3Error as e:
                if e.retryable or e.code == StatusCode.DEADLINE_EXCEEDED:
                    delay = min(2 * delay, SETTLE_MAX_S)
                    continue
                if e.code != StatusCode.META_BAD_HANDLE:  # (its session ended already)
                    log.warning("settling an open given up on failed request_id=%d error=%s", request_id, e)
                return

    async def close(self) -> None:
        self._closed = True
        self._client.rpc.remove_connection_lost(self.lost)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# Failures of a call that say the server may be gone: sessions whose open or end it queued are put or
# ended again.
_SERVER_LOST = frozenset(
    {
        StatusCode.RPC_CONNECT_FAILED,
        StatusCode.RPC_CONNECTION_CLOSED,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.UNAVAILABLE,
    }
)

# A cluster without a configured secret (tests, a single-user local cluster) still needs one for the
# fs3 RPC handshake; this one is public, so such a cluster is only as private as its network.
DEV_SECRET = b"fs3-development-cluster-secret!!"

META_SERVICE = ServiceDef(
    1,
    "meta",
    {
        m.METHOD_META_STAT_FS: ("StatFs", m.StatFsReq, m.StatFsRsp),
        m.METHOD_META_STAT: ("Stat", m.StatReq, m.InodeRsp),
        m.METHOD_META_CREATE: ("Create", m.CreateReq, m.CreateRsp),
        m.METHOD_META_MKDIR: ("Mkdir", m.MkdirReq, m.InodeRsp),
        m.METHOD_META_SYMLINK: ("Symlink", m.SymlinkReq, m.InodeRsp),
        m.METHOD_META_LINK: ("Link", m.LinkReq, m.InodeRsp),
        m.METHOD_META_UNLINK: ("Unlink", m.UnlinkReq, m.EmptyRsp),
        m.METHOD_META_OPEN: ("Open", m.OpenReq, m.OpenRsp),
        m.METHOD_META_SYNC: ("Sync", m.SyncReq, m.InodeRsp),
        m.METHOD_META_CLOSE: ("Close", m.CloseReq, m.InodeRsp),
        m.METHOD_META_RENAME: ("Rename", m.RenameReq, m.EmptyRsp),
        m.METHOD_META_READDIR: ("Readdir", m.ReaddirReq, m.ReaddirRsp),
        m.METHOD_META_LOOKUP: ("Lookup", m.LookupReq, m.InodeRsp),
        m.METHOD_META_READLINK: ("Readlink", m.ReadlinkReq, m.ReadlinkRsp),
        m.METHOD_META_SETATTR: ("Setattr", m.SetattrReq, m.InodeRsp),
        m.METHOD_META_PRUNE_SESSION: ("PruneSession", m.PruneSessionReq, m.PruneSessionRsp),
        m.METHOD_META_RMDIR: ("Rmdir", m.RmdirReq, m.EmptyRsp),
        m.METHOD_META_MKNOD: ("Mknod", m.MknodReq, m.InodeRsp),
        m.METHOD_META_BATCH_STAT: ("BatchStat", m.BatchStatReq, m.BatchStatRsp),
        m.METHOD_META_GETXATTR: ("Getxattr", m.GetxattrReq, m.GetxattrRsp),
        m.METHOD_META_SETXATTR: ("Setxattr", m.SetxattrReq, m.EmptyRsp),
        m.METHOD_META_LISTXATTR: ("Listxattr", m.ListxattrReq, m.ListxattrRsp),
        m.METHOD_META_REMOVEXATTR: ("Removexattr", m.RemovexattrReq, m.EmptyRsp),
        m.METHOD_META_LOOKUP_PATH: ("LookupPath", m.LookupPathReq, m.InodeRsp),
        m.METHOD_META_SET_LAYOUT: ("SetLayout", m.SetLayoutReq, m.InodeRsp),
        m.METHOD_META_CAPABILITY: ("Capability", m.CapabilityReq, m.CapabilityRsp),
        m.METHOD_META_END_READ_SESSIONS: ("EndReadSessions", m.EndReadSessionsReq, m.EndReadSessionsRsp),
        m.METHOD_META_RESTORE_READ_SESSIONS: (
            "RestoreReadSessions",
            m.RestoreReadSessionsReq,
            m.RestoreReadSessionsRsp,
        ),
        m.METHOD_META_SETTLE_REQUEST: ("SettleRequest", m.SettleRequestReq, m.SettleRequestRsp),
    },
)

# The most inodes one BatchStat may ask for.
MAX_BATCH_STAT = 4096
# Symlinks one path resolution follows before ELOOP, as Linux: meta's lookups and the native
# client's opens of a link alike.
MAX_SYMLINK_FOLLOWS = 40
_TIME_MIN_NS, _TIME_MAX_NS = -(1 << 63), (1 << 63) - 1  # an inode's times (int64 ns)

# The fields of each method's request that name inodes by id: a non-root user connection's request
# carries a handle for each (fs3.meta.handles).
INODE_ID_FIELDS: dict[str, tuple[str, ...]] = {
    meth.name: tuple(
        f.name
        for f in meth.request.DESCRIPTOR.fields
        if f.name in ("inode_id", "inode_ids", "parent", "old_parent", "new_parent")
    )
    for meth in META_SERVICE
}

# The fields of each method's reply that hold inodes (one or a list), which bring their handles.
RETURNED_INODES: dict[str, tuple[str, ...]] = {
    meth.name: tuple(f.name for f in meth.response.DESCRIPTOR.fields if f.message_type is m.Inode.DESCRIPTOR)
    for meth in META_SERVICE
}


class InodeHandles:
    """The handles meta gave a non-root user connection (``Inode.handle``, see
    :mod:`fs3.meta.handles`), by inode id: what its requests that name inodes by id must carry.

    Handles of inodes in use are *pinned* (:meth:`pin`: a file open here, an inode the kernel
    holds for a mount) and kept until unpinned as often; of the others at most ``limit`` are
    kept, and the one used longest ago goes first. A request naming an inode whose handle went
    (or never came) is refused by meta with EACCES, and the inode must be looked up by name
    again."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.limit = limit
        self._handles: dict[int, bytes] = {}  # not pinned, the least recently used first
        self._pinned: dict[int, list[Any]] = {}  # inode id -> [handle, pins]

    def __len__(self) -> int:
        return len(self._handles) + len(self._pinned)

    def get(self, inode_id: int) -> bytes | None:
        pinned = self._pinned.get(inode_id)
        if pinned is not None:
            return pinned[0]  # type: ignore[no-any-return]
        handles = self._handles
        handle = handles.pop(inode_id, None)
        if handle is not None:
            handles[inode_id] = handle  # now the most recently used
        return handle

    def learn(self, inodes: Sequence[m.Inode] | Any) -> None:
        handles = self._handles
        for ino in inodes:
            if ino.handle and ino.id not in self._pinned:
                handles.pop(ino.id, None)
                handles[ino.id] = ino.handle
        self._evict()

    def pin(self, inode_id: int, n: int = 1) -> None:
        """Keep ``inode_id``'s handle (if one is known) until :meth:`unpin` took as many pins."""
        pinned = self._pinned.get(inode_id)
        if pinned is not None:
            pinned[1] += n
            return
        handle = self._handles.pop(inode_id, None)
        if handle is not None:
            self._pinned[inode_id] = [handle, n]

    def unpin(self, inode_id: int, n: int = 1) -> None:
        pinned = self._pinned.get(inode_id)
        if pinned is None:
            return
        pinned[1] -= n
        if pinned[1] <= 0:
            del self._pinned[inode_id]
            self._handles[inode_id] = pinned[0]
            self._evict()

    def _evict(self) -> None:
        handles = self._handles
        while len(handles) > self.limit:
            del handles[next(iter(handles))]

    def attach(self, method: str, request: Message) -> None:
        """Put the handles of the inodes ``request`` names by id into its header."""
        into = request.hdr.handles  # type: ignore[attr-defined]
        for name in INODE_ID_FIELDS[method]:
            value = getattr(request, name)
            for inode_id in (value,) if isinstance(value, int) else value:
                if inode_id != ROOT_ID:
                    handle = self.get(inode_id)
                    if handle is not None:
                        into[inode_id] = handle


# Calls that are safe to send to another server after a failure without a request id. (UNAVAILABLE
# includes a meta server's graceful stop cutting a call short; CANCELLED is our RpcClient closed.)
_FAILOVER = frozenset(
    {
        StatusCode.RPC_CONNECT_FAILED,
        StatusCode.RPC_CONNECTION_CLOSED,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.UNAVAILABLE,
        StatusCode.KV_RETRY_LIMIT,
        StatusCode.KV_CONFLICT,
    }
)


def _may_trim(method: str, request: Message) -> bool:
    """Whether meta may have cut the file on storage for ``request`` before its commit (a cut it
    then finishes whether or not the request commits)."""
    if method in ("Open", "Create"):
        return bool(request.flags & os.O_TRUNC)  # type: ignore[attr-defined]
    return method == "Setattr" and bool(request.fields & m.SETATTR_SIZE)  # type: ignore[attr-defined]


class MetaClient:
    """A client of the meta service, acting as ``user`` (see the module docstring).

    ``rpc`` may be shared with other clients (storage) of the same process; otherwise one is made
    from ``secret`` and closed by :meth:`close`. Over a user connection (an ``rpc`` opened with a
    user token), opens and creates bring capabilities (:mod:`fs3.capability`): they go into
    ``capabilities``, the cache the process's storage client takes them from, when one is given.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        secret: bytes | None = None,
        *,
        user: common_pb2.UserInfo | None = None,
        client_id: int | None = None,
        rpc: RpcClient | None = None,
        timeout_s: float = 30.0,
        rpc_timeout_s: float = 10.0,
        capabilities: CapabilityCache | None = None,
        handles: InodeHandles | None = None,
        queued_ends: QueuedSessions | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("at least one meta address is needed")
        self.capabilities = capabilities
        self.handles = handles
        self.addresses = list(dict.fromkeys(addresses))
        self._own_rpc = rpc is None
        self.rpc = rpc or RpcClient(secret or DEV_SECRET, identity="meta-client")
        self.user = user or common_pb2.UserInfo()
        self.client_id = client_id if client_id is not None else _ids.getrandbits(63) + 1
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._current = _ids.randrange(len(self.addresses))
        self._methods = {meth.name: meth for meth in META_SERVICE}
        self._owns_queued_ends = queued_ends is None
        self._queued_ends = queued_ends or QueuedSessions(self)

    def _next_request_id(self) -> int:
        """A request id never used before with this client id: the wall clock in nanoseconds, or
        one past the previous id when the clock has not moved on (or stepped back). Ids that grow
        with time keep meta's records of recent requests together in its store (see
        ``fs3.meta.schema``); uniqueness needs only the ids of one client id to differ, as the
        client id is part of the key."""
        now = time.time_ns()
        with _last_request_ids_lock:
            rid = max(now, _last_request_ids.get(self.client_id, 0) + 1)
            _last_request_ids[self.client_id] = rid
        return rid

    def acting_as(self, user: common_pb2.UserInfo) -> MetaClient:
        """A client of the same meta servers, connection, client id, capabilities and handles,
        whose requests are ``user``'s (a mount's, for each caller). The servers' list is this one's,
        so that meta servers found later count for both. Nothing of it needs closing."""
        client = MetaClient(
            self.addresses,
            rpc=self.rpc,
            user=user,
            client_id=self.client_id,
            timeout_s=self.timeout_s,
            rpc_timeout_s=self.rpc_timeout_s,
            capabilities=self.capabilities,
            handles=self.handles,
            queued_ends=self._queued_ends,
        )
        client.addresses = self.addresses
        return client

    async def close(self) -> None:
        if self._owns_queued_ends:
            await self._queued_ends.close()
        if self._own_rpc:
            await self.rpc.close()

    async def __aenter__(self) -> MetaClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, method: str, request: Message, *, request_id: bool = False) -> Any:
        """Send ``request`` (its ``hdr`` is filled in) to a meta server, failing over as needed."""
        return (await self._call(method, request, request_id=request_id))[0]

    async def _call(
        self, method: str, request: Message, *, request_id: bool = False, prefer: Address | None = None
    ) -> tuple[Any, Address]:
        """:meth:`call`, and the server that answered; first to ``prefer`` if it is one of the
        servers (then, on failures, to the others as usual)."""
        hdr = request.hdr  # type: ignore[attr-defined]
        hdr.user.CopyFrom(self.user)
        hdr.client_id = self.client_id
        if request_id:
            hdr.request_id = self._next_request_id()
        handles = self.handles
        if handles is not None:
            handles.attach(method, request)
        meth = self._methods[method]
        deadline = time.monotonic() + self.timeout_s
        timeout = min(self.rpc_timeout_s, self.timeout_s)  # the first try has the whole budget
        backoff = 0.01
        tried = 0
        if prefer is not None and not any(_parsed_address(a) == prefer for a in self.addresses):
            prefer = None
        while True:
            if prefer is not None:
                parsed, prefer = prefer, None
            else:
                parsed = _parsed_address(self._address())
            try:
                rsp, _ = await self.rpc.call(parsed, meth, request, timeout=max(timeout, 0.001))
                if handles is not None:
                    for name in RETURNED_INODES[method]:
                        value = getattr(rsp, name)
                        handles.learn((value,) if isinstance(value, m.Inode) else value)
                return rsp, parsed
            except FS3Error as e:
                if e.code not in _FAILOVER:
                    raise
                if e.code in _SERVER_LOST:
                    self._queued_ends.lost(parsed)
                # wrapped by _address, against the list as it is then; also when this call gives
                # up, so that the next one does not start with a server that just failed it
                self._current += 1
                if time.monotonic() >= deadline:
                    # (Not on user connections: a recorded response lacks the handles and the
                    # capability meta adds to each answer, replayed ones included, not to this.)
                    if (
                        request_id
                        and method != "SettleRequest"
                        and handles is None
                        and self.capabilities is None
                    ):
                        settled = await self._settled(hdr.request_id, meth)
                        if settled is not None:
                            return settled
                    if _may_trim(method, request):
                        # "not done" is no answer for the file's length: meta finishes a trim it
                        # began, commit or no commit (an O_TRUNC open that timed out, settled as
                        # not done, left the file empty seconds later; helper review)
                        raise FS3Error(
                            e.code,
                            f"{e.message} (the truncate it asked for may have been made all the same: "
                            "meta cuts the file on storage before it commits)",
                        ) from None
                    raise
                tried += 1
                if tried % max(len(self.addresses), 1) == 0:
                    await asyncio.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
                    backoff = min(backoff * 2, 0.5)
                timeout = min(self.rpc_timeout_s, deadline - time.monotonic())

    async def _settled(self, request_id: int, meth: Any) -> tuple[Any, Address] | None:
        """A request given up on, after failures that leave its outcome unknown (no answer in
        time: meta may have done it, the answer lost or late, as when the network returns near the
        end of the budget): one try, at most SETTLE_NOW_S, to ask meta what became of it. Done:
        its response, which the caller gets instead of an error for something that happened. Not
        done: None, and it never will be (the question leaves a record that stops any attempt
        still on its way), so the error the caller gets is the truth; None too when meta cannot
        be asked."""
        req = m.SettleRequestReq(request_id=request_id)
        req.hdr.user.CopyFrom(self.user)
        req.hdr.client_id = self.client_id
        parsed = _parsed_address(self._address())
        try:
            rsp, _ = await self.rpc.call(
                parsed, self._methods["SettleRequest"], req, timeout=min(SETTLE_NOW_S, self.rpc_timeout_s)
            )
        except FS3Error:
            return None
        if not rsp.done:
            return None
        done = meth.response.FromString(rsp.response)
        if getattr(done, "session_queued", False):
            # a session the meta process that made it has yet to write, and that the open's
            # caller must follow to that process (QueuedSessions.opened): not this way; the
            # caller's error has the open settled and its session closed, as before
            return None
        log.info("a request given up on had been done request_id=%d method=%s", request_id, meth.name)
        return done, parsed

    def _address(self) -> str:
        """The meta server to call now. ``addresses`` may be shared with other clients (a mount's
        per-user clients share its list) and change under us, shrinking included: the index is
        taken modulo its length now, and kept in range."""
        addresses = self.addresses
        if not addresses:
            raise FS3Error(StatusCode.UNAVAILABLE, "no meta server address known")
        self._current %= len(addresses)
        return addresses[self._current]

    def avoid(self, address: Address) -> None:
        """Call another server than ``address`` (one this client lost) next, if there is one."""
        if len(self.addresses) > 1 and _parsed_address(self._address()) == address:
            self._current += 1

    # ---- reads ---------------------------------------------------------------------------------

    async def stat(self, inode_id: int, *, settled: bool = False) -> m.Inode:
        """The inode; ``settled``: once the truncates of the file meta is making have ended."""
        return (await self.call("Stat", m.StatReq(inode_id=inode_id, settled=settled))).inode

    async def batch_stat(self, inode_ids: Sequence[int]) -> list[m.Inode | FS3Error]:
        """Each inode, or the FS3Error its stat raised; any number of them, asked MAX_BATCH_STAT
        at a time (meta refuses more in one request)."""
        out: list[m.Inode | FS3Error] = []
        for start in range(0, len(inode_ids), MAX_BATCH_STAT):
            req = m.BatchStatReq(inode_ids=inode_ids[start : start + MAX_BATCH_STAT])
            rsp = await self.call("BatchStat", req)
            out += [
                ino if st.code == 0 else FS3Error(st.code, st.message)
                for ino, st in zip(rsp.inodes, rsp.errors, strict=True)
            ]
        return out

    async def lookup(self, parent: int, name: bytes) -> m.Inode:
        return (await self.call("Lookup", m.LookupReq(parent=parent, name=name))).inode

    async def lookup_path(self, path: bytes, follow: bool = True) -> m.Inode:
        return (await self.call("LookupPath", m.LookupPathReq(path=path, follow=follow))).inode

    async def readlink(self, inode_id: int) -> bytes:
        return (await self.call("Readlink", m.ReadlinkReq(inode_id=inode_id))).target

    async def readdir(
        self, inode_id: int, after: bytes = b"", limit: int = 0, with_inodes: bool = False
    ) -> m.ReaddirRsp:
        req = m.ReaddirReq(inode_id=inode_id, after=after, limit=limit, with_inodes=with_inodes)
        return await self.call("Readdir", req)

    async def listdir(self, inode_id: int, page: int = 0) -> AsyncIterator[m.DirEntry]:
        """Every entry of a directory, fetched page by page."""
        after = b""
        while True:
            rsp = await self.readdir(inode_id, after, page)
            for e in rsp.entries:
                yield e
            if not rsp.more or not rsp.entries:
                return
            after = rsp.entries[-1].name

    async def statfs(self) -> m.StatFsRsp:
        return await self.call("StatFs", m.StatFsReq())

    async def getxattr(self, inode_id: int, name: bytes) -> bytes:
        return (await self.call("Getxattr", m.GetxattrReq(inode_id=inode_id, name=name))).value

    async def listxattr(self, inode_id: int) -> list[bytes]:
        return list((await self.call("Listxattr", m.ListxattrReq(inode_id=inode_id))).names)

    # ---- namespace changes ---------------------------------------------------------------------

    async def create(
        self,
        parent: int,
        name: bytes,
        mode: int = 0o644,
        flags: int = 0,
        umask: int = 0,
        session: bool = False,
    ) -> m.CreateRsp:
        req = m.CreateReq(parent=parent, name=name, mode=mode, flags=flags, umask=umask, open_session=session)
        try:
            rsp = await self.call("Create", req, request_id=True)
        except (FS3Error, asyncio.CancelledError) as e:
            if session:
                self._settle_if_unknown(e, req.hdr.request_id, m.CreateRsp, flags)
            raise
        if rsp.capability and self.capabilities is not None:
            self.capabilities.put(rsp.inode.id, rsp.capability)
        return rsp

    async def mkdir(self, parent: int, name: bytes, mode: int = 0o755, umask: int = 0) -> m.Inode:
        req = m.MkdirReq(parent=parent, name=name, mode=mode, umask=umask)
        return (await self.call("Mkdir", req, request_id=True)).inode

    async def mknod(self, parent: int, name: bytes, mode: int, rdev: int = 0, umask: int = 0) -> m.Inode:
        req = m.MknodReq(parent=parent, name=name, mode=mode, rdev=rdev, umask=umask)
        return (await self.call("Mknod", req, request_id=True)).inode

    async def symlink(self, parent: int, name: bytes, target: bytes) -> m.Inode:
        req = m.SymlinkReq(parent=parent, name=name, target=target)
        return (await self.call("Symlink", req, request_id=True)).inode

    async def link(self, inode_id: int, new_parent: int, new_name: bytes) -> m.Inode:
        req = m.LinkReq(inode_id=inode_id, new_parent=new_parent, new_name=new_name)
        return (await self.call("Link", req, request_id=True)).inode

    async def unlink(self, parent: int, name: bytes) -> None:
        await self.call("Unlink", m.UnlinkReq(parent=parent, name=name), request_id=True)

    async def rmdir(self, parent: int, name: bytes, recursive: bool = False) -> None:
        await self.call("Rmdir", m.RmdirReq(parent=parent, name=name, recursive=recursive), request_id=True)

    async def rename(
        self,
        old_parent: int,
        old_name: bytes,
        new_parent: int,
        new_name: bytes,
        flags: int = 0,
        *,
        replaces: int = 0,
    ) -> None:
        """``replaces``: see RenameReq."""
        req = m.RenameReq(
            old_parent=old_parent,
            old_name=old_name,
            new_parent=new_parent,
            new_name=new_name,
            flags=flags,
            replaces=replaces,
        )
        await self.call("Rename", req, request_id=True)

    async def setattr(self, inode_id: int, **fields: Any) -> m.Inode:
        """setattr with keyword fields: mode, uid, gid, size, atime_ns, mtime_ns (None = UTIME_NOW),
        session_id; leaving a field out is UTIME_OMIT / unchanged."""
        req = m.SetattrReq(inode_id=inode_id, session_id=fields.pop("session_id", 0))
        bits = {"mode": m.SETATTR_MODE, "uid": m.SETATTR_UID, "gid": m.SETATTR_GID, "size": m.SETATTR_SIZE}
        for name, bit in bits.items():
            if name in fields:
                setattr(req, name, fields.pop(name))
                req.fields |= bit
        for name, bit, now_bit in (
            ("atime_ns", m.SETATTR_ATIME, m.SETATTR_ATIME_NOW),
            ("mtime_ns", m.SETATTR_MTIME, m.SETATTR_MTIME_NOW),
        ):
            if name in fields:
                value = fields.pop(name)
                if value is None:
                    req.fields |= now_bit
                else:
                    # clamped to what the inode holds (int64 ns: 1677..2262), as Linux clamps a
                    # time to its file system's range (touch -d 2300-01-01 was EIO)
                    setattr(req, name, min(max(value, _TIME_MIN_NS), _TIME_MAX_NS))
                    req.fields |= bit
        if fields:
            raise TypeError(f"unknown setattr fields {sorted(fields)}")
        # with a request id: a first attempt that timed out here and is applied late by its server
        # (after this retry and newer changes) finds the retry's record and changes nothing
        return (await self.call("Setattr", req, request_id=True)).inode

    async def setxattr(self, inode_id: int, name: bytes, value: bytes, flags: int = 0) -> None:
        req = m.SetxattrReq(inode_id=inode_id, name=name, value=value, flags=flags)
        await self.call("Setxattr", req, request_id=True)

    async def removexattr(self, inode_id: int, name: bytes) -> None:
        await self.call("Removexattr", m.RemovexattrReq(inode_id=inode_id, name=name), request_id=True)

    async def set_layout(
        self, inode_id: int, chain_table_id: int = 0, chunk_size: int = 0, stripe_count: int = 0
    ) -> m.Inode:
        req = m.SetLayoutReq(
            inode_id=inode_id, chain_table_id=chain_table_id, chunk_size=chunk_size, stripe_count=stripe_count
        )
        return (await self.call("SetLayout", req, request_id=True)).inode

    # ---- open files ----------------------------------------------------------------------------

    async def open(self, inode_id: int, flags: int = 0) -> m.OpenRsp:
        """Open ``inode_id``. A handle of a session this returns is closed by :meth:`close_file`, or
        given up with :meth:`forget_session` (a session meta ended)."""
        req = m.OpenReq(inode_id=inode_id, flags=flags)
        try:
            rsp, address = await self._call("Open", req, request_id=True)
        except (FS3Error, asyncio.CancelledError) as e:
            self._settle_if_unknown(e, req.hdr.request_id, m.OpenRsp, flags)
            raise
        if rsp.session_queued:
            self._queued_ends.opened(address, self, inode_id, rsp.session_id)
        if rsp.capability and self.capabilities is not None:
            self.capabilities.put(rsp.inode.id, rsp.capability)
        return rsp

    def _settle_if_unknown(
        self,
        e: FS3Error | asyncio.CancelledError,
        request_id: int,
        rsp_cls: type[m.OpenRsp] | type[m.CreateRsp],
        flags: int,
    ) -> None:
        """After an open or create failed: if its outcome is unknown (meta not reached, its answer
        lost, or its caller cancelled while it was on its way: the request may have been made all
        the same), have it settled (:meth:`QueuedSessions.settle`). Not a cancelled O_TRUNC one:
        meta may be trimming the file on storage for it, and settled as not done once that trim
        is made, the file would keep its length over the zeros the trim left."""
        if isinstance(e, asyncio.CancelledError):
            unknown = not flags & os.O_TRUNC
        else:
            unknown = e.retryable or e.code == StatusCode.DEADLINE_EXCEEDED
        if request_id and unknown:
            self._queued_ends.settle(self, request_id, rsp_cls)

    async def capability(self, inode_id: int, rights: int) -> bytes:
        """A new capability for file ``inode_id`` with ``rights`` (``fs3.capability.READ``,
        ``WRITE``), which meta grants after checking, as an open would, that this client's user
        may access it so now (EACCES otherwise). For clients on a user connection; the renewal
        function of a :class:`fs3.capability.CapabilityCache`."""
        req = m.CapabilityReq(inode_id=inode_id, rights=rights)
        return (await self.call("Capability", req)).capability

    async def sync(
        self, inode_id: int, session_id: int, written_length: int = 0, wrote: bool = False, mtime_ns: int = 0
    ) -> m.Inode:
        """Report a handle's written length (fsync); ``mtime_ns``: when it wrote (0: meta's now)."""
        req = m.SyncReq(
            inode_id=inode_id,
            session_id=session_id,
            written_length=written_length,
            wrote=wrote,
            mtime=_timespec(mtime_ns),
        )
        return (await self.call("Sync", req)).inode

    async def touch_session(self, inode_id: int, session_id: int, confirm: bool = False) -> float:
        """Check that meta still has session ``session_id`` of ``inode_id`` (META_BAD_HANDLE if
        not) and touch it (``confirm``: only check, writing nothing); returns how long meta keeps a
        session untouched (0: for ever). Asked first of the server that answered its open before
        writing it, if it did: that one waits for its write, where another would not find it yet."""
        req = m.SyncReq(inode_id=inode_id, session_id=session_id, touch=not confirm, confirm=confirm)
        prefer = self._queued_ends.server_of(inode_id, session_id)
        return (await self._call("Sync", req, prefer=prefer))[0].session_timeout_s

    async def close_file(
        self, inode_id: int, session_id: int, written_length: int = 0, wrote: bool = False, mtime_ns: int = 0
    ) -> m.Inode:
        """End a session, reporting its written length; ``mtime_ns``: when it wrote (0: meta's now)."""
        req = m.CloseReq(
            inode_id=inode_id,
            session_id=session_id,
            written_length=written_length,
            wrote=wrote,
            mtime=_timespec(mtime_ns),
        )
        # First to the server that queued the session's open, while that is recorded (dropped
        # when the server is lost): another one, before the open's session is written, finds none
        # (META_BAD_HANDLE, taken for an end by meta) and the session, written after, stays for
        # good. (A mount's open goes through its caller's client, its close through its own.)
        prefer = self._queued_ends.server_of(inode_id, session_id)
        await self._queued_ends.closing(inode_id, session_id)
        rsp, address = await self._call("Close", req, request_id=True, prefer=prefer)
        if rsp.end_queued:
            self._queued_ends.add(address, inode_id, session_id)
        return rsp.inode

    async def restoring(self, inode_id: int, session_id: int) -> bool:
        """Whether the session was sent to meta to be put again since its server was lost (see
        :class:`QueuedSessions`), waiting for that to be done: meta may have it after all, though
        an answer before said it had not."""
        return await self._queued_ends.restoring(inode_id, session_id)

    def forget_session(self, inode_id: int, session_id: int) -> None:
        """This client no longer holds session ``session_id`` of ``inode_id`` open (meta ended it,
        or its close is not sent): it is not put again if the server that opened it is lost."""
        self._queued_ends.forget(inode_id, session_id)

    async def prune_sessions(self, client_id: int) -> int:
        return (await self.call("PruneSession", m.PruneSessionReq(client_id=client_id))).pruned


def _timespec(ns: int) -> m.Timespec | None:
    """A time for a request's optional Timespec field (None, the field unset, for 0)."""
    return m.Timespec(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000) if ns > 0 else None
