"""The meta service over fs3 RPC: decodes requests, authenticates the caller, calls the
:class:`fs3.meta.store.MetaStore` and encodes the reply. Errors travel as the FS3Error's status code.

A call on a *user connection* (a client that authenticated with its user token instead of the
cluster secret: ``CallContext.user``) acts only as that token's user: its header's identity is
replaced before any handler reads it (:func:`_bind`), and its opens and creates of regular files
come with a capability (:mod:`fs3.capability`) for the rights the open checked, which storage asks of
such a client's reads and writes; ``Capability`` issues a new one after checking again. A non-root
user's requests name inodes by id only with the handles (:mod:`fs3.meta.handles`) meta returned
with them, so that ids do not bypass the search permission of the directories above.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from fs3 import capability, metrics
from fs3.capability import CapabilityIssuer
from fs3.client.meta_client import MAX_BATCH_STAT, MAX_END_READ_SESSIONS, META_SERVICE
from fs3.errors import FS3Error, StatusCode
from fs3.kv.txn import COMMIT_CALLER
from fs3.meta.auth import Authenticator
from fs3.meta.handles import HandleSealer
from fs3.meta.namespace import CALL_DEADLINE, FILE
from fs3.meta.permissions import R_OK, W_OK, Credentials, access_of_flags
from fs3.meta.store import MetaStore
from fs3.net import CallContext, RpcServer
from fs3.net.auth import user_scoped_id
from fs3.net.service import inline
from fs3.proto import common_pb2
from fs3.proto import meta_pb2 as m

log = logging.getLogger(__name__)


class MetaService:
    """Handlers of every method of ``META_SERVICE``."""

    def __init__(
        self,
        store: MetaStore,
        auth: Authenticator,
        *,
        statfs: Callable[[], Awaitable[tuple[int, int, int]]] | None = None,
        capabilities: CapabilityIssuer | None = None,
        handles: HandleSealer | None = None,
    ) -> None:
        """``statfs`` returns storage's (capacity, used, available) bytes; ``capabilities`` seals
        the capabilities user connections get (none without it); ``handles`` the inode handles
        non-root user connections need (without it they can name no inode by id but the root)."""
        self.store = store
        self.auth = auth
        self._statfs = statfs
        self.capabilities = capabilities
        self.handles = handles or _NO_HANDLES
        # The caller's credentials without a coroutine when the authenticator has them at hand (the
        # usual case: a known header identity or a cached token); None sends us to _credentials.
        self._known: Callable[[Any], Credentials | None] = getattr(auth, "known", _unknown)

    def register(self, server: RpcServer, registry: CollectorRegistry | None = None) -> None:
        """Serve every method on ``server``, counting requests and latencies into ``registry``."""
        handlers = {m.name: getattr(self, m.name) for m in META_SERVICE}
        handles = self.handles
        if registry is None:
            server.add_service(META_SERVICE, {n: _plain(h, n, handles) for n, h in handlers.items()})
            return
        stats = RequestMetrics(list(handlers), registry)
        server.add_service(META_SERVICE, {n: _measured(h, n, stats, handles) for n, h in handlers.items()})

    async def _credentials(self, user: Any) -> Credentials:
        return await self.auth.credentials(user)

    @staticmethod
    def _idem(req: Any) -> tuple[int, int, str] | None:
        hdr = req.hdr
        return (hdr.client_id, hdr.request_id, req.DESCRIPTOR.name) if hdr.request_id else None

    # ---- reads ---------------------------------------------------------------------------------

    async def StatFs(self, req: m.StatFsReq, _p: Any, _c: CallContext) -> m.StatFsRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        capacity, used, available = await self._statfs() if self._statfs is not None else (0, 0, 0)
        return await self.store.statfs(capacity, used, available)

    async def Stat(self, req: m.StatReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        rsp = m.InodeRsp()
        if req.settled:
            await self.store.settled_stat(req.inode_id, into=rsp.inode)
        else:
            await self.store.stat(req.inode_id, into=rsp.inode)
        return rsp

    async def BatchStat(self, req: m.BatchStatReq, _p: Any, _c: CallContext) -> m.BatchStatRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        if len(req.inode_ids) > MAX_BATCH_STAT:  # also refused before a user's handles are checked
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"at most {MAX_BATCH_STAT} inodes per batch")
        rsp = m.BatchStatRsp()
        for r in await self.store.batch_stat(list(req.inode_ids)):
            if isinstance(r, FS3Error):
                rsp.inodes.add()
                rsp.errors.add(code=int(r.code), message=r.message)
            else:
                rsp.inodes.append(r)
                rsp.errors.add(code=0)
        return rsp

    async def Lookup(self, req: m.LookupReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        return m.InodeRsp(inode=await self.store.lookup(cred, req.parent, req.name))

    async def LookupPath(self, req: m.LookupPathReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino = await self.store.lookup_path(cred, req.path, req.follow)
        return m.InodeRsp(inode=ino)

    async def Readlink(self, req: m.ReadlinkReq, _p: Any, _c: CallContext) -> m.ReadlinkRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        return m.ReadlinkRsp(target=await self.store.readlink(req.inode_id))

    async def Readdir(self, req: m.ReaddirReq, _p: Any, ctx: CallContext) -> m.ReaddirRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        page = await self.store.readdir_page(cred, req.inode_id, req.after, req.limit, req.with_inodes)
        user = ctx.user
        if not page.inodes or user is None or user.root:
            return m.ReaddirRsp(entries=page.entries, inodes=page.inodes, more=page.more)
        # A non-root user connection: listing takes read permission, reaching the entries' inodes
        # search permission too (as a stat of one by name would). Only a caller who may search
        # the directory gets their handles, and attributes; others get each one's id and type, as
        # a local directory's listing gives them. (A mount's kernel checks search permission
        # itself, and shares the attributes between its users: cluster members get them all.)
        if not page.searchable:
            found = [m.Inode(id=ino.id, type=ino.type) for ino in page.inodes]
            return m.ReaddirRsp(entries=page.entries, inodes=found, more=page.more)
        rsp = m.ReaddirRsp(entries=page.entries, inodes=page.inodes, more=page.more)
        self.handles.seal_inodes(user.uid, rsp.inodes)
        return rsp

    async def Getxattr(self, req: m.GetxattrReq, _p: Any, _c: CallContext) -> m.GetxattrRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        return m.GetxattrRsp(value=await self.store.getxattr(cred, req.inode_id, req.name))

    async def Listxattr(self, req: m.ListxattrReq, _p: Any, _c: CallContext) -> m.ListxattrRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        return m.ListxattrRsp(names=await self.store.listxattr(cred, req.inode_id))

    # ---- namespace changes ---------------------------------------------------------------------

    async def Create(self, req: m.CreateReq, _p: Any, ctx: CallContext) -> m.CreateRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        rsp = await self.store.create(
            cred,
            req.parent,
            req.name,
            req.mode,
            req.flags,
            req.umask,
            session=req.open_session,
            client_id=req.hdr.client_id,
            idem=self._idem(req),
        )
        if ctx.user is not None:
            # not part of the recorded reply (see _grant): a replay gets a fresh one, checked again
            rsp.capability = await self._grant(cred, rsp.inode, req.flags, rsp.created)
        return rsp

    async def Mkdir(self, req: m.MkdirReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino = await self.store.mkdir(cred, req.parent, req.name, req.mode, req.umask, self._idem(req))
        return m.InodeRsp(inode=ino)

    async def Mknod(self, req: m.MknodReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino = await self.store.mknod(
            cred, req.parent, req.name, req.mode, req.rdev, req.umask, self._idem(req)
        )
        return m.InodeRsp(inode=ino)

    async def Symlink(self, req: m.SymlinkReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino = await self.store.symlink(cred, req.parent, req.name, req.target, self._idem(req))
        return m.InodeRsp(inode=ino)

    async def Link(self, req: m.LinkReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino = await self.store.link(cred, req.inode_id, req.new_parent, req.new_name, self._idem(req))
        return m.InodeRsp(inode=ino)

    async def Unlink(self, req: m.UnlinkReq, _p: Any, _c: CallContext) -> m.EmptyRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        await self.store.unlink(
            cred,
            req.parent,
            req.name,
            self._idem(req),
        )
        return m.EmptyRsp()

    async def Rmdir(self, req: m.RmdirReq, _p: Any, _c: CallContext) -> m.EmptyRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        await self.store.rmdir(
            cred,
            req.parent,
            req.name,
            req.recursive,
            self._idem(req),
        )
        if req.recursive:
            self.store.collector.wake()
        return m.EmptyRsp()

    async def Rename(self, req: m.RenameReq, _p: Any, _c: CallContext) -> m.EmptyRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        await self.store.rename(
            cred,
            req.old_parent,
            req.old_name,
            req.new_parent,
            req.new_name,
            req.flags,
            self._idem(req),
            replaces=req.replaces,
        )
        return m.EmptyRsp()

    async def Setattr(self, req: m.SetattrReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        return m.InodeRsp(inode=await self.store.setattr(cred, req.inode_id, req, self._idem(req)))

    async def Setxattr(self, req: m.SetxattrReq, _p: Any, _c: CallContext) -> m.EmptyRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        await self.store.setxattr(cred, req.inode_id, req.name, req.value, req.flags, self._idem(req))
        return m.EmptyRsp()

    async def Removexattr(self, req: m.RemovexattrReq, _p: Any, _c: CallContext) -> m.EmptyRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        await self.store.removexattr(cred, req.inode_id, req.name, self._idem(req))
        return m.EmptyRsp()

    async def SetLayout(self, req: m.SetLayoutReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino = await self.store.set_layout(
            cred,
            req.inode_id,
            req.chain_table_id,
            req.chunk_size,
            req.stripe_count,
            self._idem(req),
        )
        return m.InodeRsp(inode=ino)

    # ---- open files ----------------------------------------------------------------------------

    async def Open(self, req: m.OpenReq, _p: Any, ctx: CallContext) -> m.OpenRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        ino, sid, queued = await self.store.open_session(
            cred, req.inode_id, req.flags, req.hdr.client_id, self._idem(req)
        )
        if ctx.user is None:
            return m.OpenRsp(inode=ino, session_id=sid, session_queued=queued)
        return m.OpenRsp(
            inode=ino,
            session_id=sid,
            session_queued=queued,
            capability=await self._grant(cred, ino, req.flags, False),
        )

    async def SettleRequest(self, req: m.SettleRequestReq, _p: Any, _c: CallContext) -> m.SettleRequestRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        if not req.hdr.client_id or not req.request_id:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "SettleRequest needs a client id and a request id")
        return await self.store.settle_request(req.hdr.client_id, req.request_id)

    async def Capability(self, req: m.CapabilityReq, _p: Any, _c: CallContext) -> m.CapabilityRsp:
        """A new capability for a file the caller may access with ``rights`` now, checked as an
        open would (for a user connection whose capability expired or was refused), except that
        the file's owner gets one whatever its mode: the owner could chmod it anyway, and an open
        POSIX allowed whatever the mode (its creator's of a 0444 file for writing) must keep
        working once its first capability lapses."""
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        rights = req.rights
        if not rights or rights & ~capability.RIGHTS:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad capability rights {rights}")
        if self.capabilities is None:
            raise FS3Error(StatusCode.FAILED_PRECONDITION, "this meta server issues no capabilities")
        cap = await self._issue(self.capabilities, cred, req.inode_id, rights, owner_override=True)
        return m.CapabilityRsp(capability=cap)

    async def _issue(
        self,
        issuer: CapabilityIssuer,
        cred: Credentials,
        inode_id: int,
        rights: int,
        owner_override: bool = False,
    ) -> bytes:
        """A capability of ``rights`` on the regular file ``inode_id``, after checking as an open
        would that ``cred`` may access it so now (``owner_override``: see check_file_access). A write
        capability is recorded in the file first (until it lapses: a whole second after now +
        ttl at most), for the collector's second pass."""
        want = (R_OK if rights & capability.READ else 0) | (W_OK if rights & capability.WRITE else 0)
        write_until_ns = int((time.time() + issuer.ttl_s + 1) * 1e9) if rights & capability.WRITE else 0
        ino = await self.store.check_file_access(
            cred, inode_id, want, owner_override=owner_override, write_until_ns=write_until_ns
        )
        return issuer.issue(ino.id, rights, ino.layout)

    async def _grant(self, cred: Credentials, opened: m.Inode, flags: int, created: bool) -> bytes:
        """The capability a user connection's open (``flags``) of ``opened`` brings: the rights
        the open checked, for a regular file; none otherwise.

        The reply may be a recorded one (a retried request id, up to ``idem_ttl_s`` old), so the
        file is loaded again and the permission checked on it as it is now, for this caller
        (gone: NOT_FOUND); a file the caller created, and still owns, may be opened as asked
        whatever its mode (POSIX lets its creator; an owner could chmod it anyway)."""
        if opened.type != FILE or self.capabilities is None:
            return b""
        want = access_of_flags(flags)
        rights = (capability.READ if want & R_OK else 0) | (capability.WRITE if want & W_OK else 0)
        return await self._issue(self.capabilities, cred, opened.id, rights, owner_override=created)

    async def Sync(self, req: m.SyncReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        if req.touch or req.confirm:
            ino = await self.store.touch(req.inode_id, req.session_id, write=not req.confirm)
            return m.InodeRsp(inode=ino, session_timeout_s=self.store.collector.session_timeout_s)
        mtime = req.mtime.sec * 1_000_000_000 + req.mtime.nsec if req.HasField("mtime") else 0
        ino = await self.store.sync(req.inode_id, req.session_id, req.written_length, req.wrote, mtime)
        return m.InodeRsp(inode=ino)

    async def Close(self, req: m.CloseReq, _p: Any, _c: CallContext) -> m.InodeRsp:
        if self._known(req.hdr.user) is None:
            await self._credentials(req.hdr.user)
        mtime = req.mtime.sec * 1_000_000_000 + req.mtime.nsec if req.HasField("mtime") else 0
        ino, queued = await self.store.end_session(
            req.inode_id, req.session_id, req.written_length, req.wrote, mtime, self._idem(req)
        )
        if ino.nlink == 0:
            self.store.collector.wake()
        return m.InodeRsp(inode=ino, end_queued=queued)

    async def EndReadSessions(
        self, req: m.EndReadSessionsReq, _p: Any, _c: CallContext
    ) -> m.EndReadSessionsRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        _check_session_refs(req.hdr, len(req.sessions))
        # as for PruneSession: anyone but root ends only what its uid opened
        ended = await self.store.end_read_sessions(
            req.hdr.client_id,
            [(s.inode, s.session_id) for s in req.sessions],
            uid=None if cred.is_root else cred.uid,
        )
        return m.EndReadSessionsRsp(ended=ended)

    async def RestoreReadSessions(
        self, req: m.RestoreReadSessionsReq, _p: Any, _c: CallContext
    ) -> m.RestoreReadSessionsRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        _check_session_refs(req.hdr, len(req.inode_ids))
        if len(req.session_ids) != len(req.inode_ids):
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT,
                f"{len(req.inode_ids)} inode ids but {len(req.session_ids)} session ids",
            )
        if not all(req.session_ids):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "session id 0")
        restored, present = await self.store.restore_read_sessions(
            cred, req.hdr.client_id, list(zip(req.inode_ids, req.session_ids, strict=True))
        )
        return m.RestoreReadSessionsRsp(restored=restored, present=present)

    async def PruneSession(self, req: m.PruneSessionReq, _p: Any, _c: CallContext) -> m.PruneSessionRsp:
        cred = self._known(req.hdr.user) or await self._credentials(req.hdr.user)
        if req.client_id != req.hdr.client_id and not cred.is_root:
            raise FS3Error(StatusCode.META_NOT_PERMITTED, "only root may prune another client's sessions")
        if not req.client_id:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "client id 0")
        # A client id is only the caller's word: anyone but root prunes only what its uid opened.
        uid = None if cred.is_root else cred.uid
        return m.PruneSessionRsp(pruned=await self.store.prune_sessions(client_id=req.client_id, uid=uid))


def _check_session_refs(hdr: m.MetaRequestHeader, count: int) -> None:
    """INVALID_ARGUMENT for an EndReadSessions or RestoreReadSessions naming too many sessions, or
    sent without a client id (the sessions it names are that client's)."""
    if count > MAX_END_READ_SESSIONS:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"at most {MAX_END_READ_SESSIONS} sessions per request")
    if not hdr.client_id:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, "client id 0")


# Started inline in the receive path (see fs3.net.service.inline): reads that usually finish
# without suspending cost no task per call, and namespace changes run their transaction right away,
# up to the commit they wait for (a task then takes over), instead of one loop iteration later; a
# change that fails before its commit (EEXIST, ENOENT...) or replays a recorded reply costs no task.
# Nothing on their path uses asyncio.timeout, current_task or context variables before its first
# suspension. Not here: calls that may reach storage before that (Open, Sync, Close and Setattr
# query or truncate chunks; the RPC client's connect uses asyncio.timeout), and StatFs.
INLINE = frozenset(
    {
        "Stat",
        "BatchStat",
        "Lookup",
        "LookupPath",
        "Readdir",
        "Readlink",
        "Getxattr",
        "Listxattr",
        "Create",
        "Mkdir",
        "Mknod",
        "Symlink",
        "Link",
        "Unlink",
        "Rmdir",
        "Rename",
        "Setxattr",
        "Removexattr",
        "Capability",
    }
)


class _MethodStats:
    """One method's request count and latency histogram, as plain numbers."""

    __slots__ = ("ok", "counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.ok = 0  # requests that succeeded
        self.counts = [0] * (buckets + 1)  # latencies by bucket (not cumulative); the last is +Inf
        self.sum = 0.0


class RequestMetrics:
    """``fs3_meta_requests_total{method,code}`` and ``fs3_meta_request_seconds{method}``, kept as
    plain counters on the event loop thread and turned into samples only when scraped.

    A prometheus_client Counter.inc and Histogram.observe take a lock each (and labels() for an
    error code builds a key): about 1.3 us a request, against about 0.2 us here. Scrapes run on
    another thread and may read a count one request old, as with any scrape.
    """

    def __init__(self, methods: list[str], registry: CollectorRegistry) -> None:
        self.bounds = metrics.LATENCY_BUCKETS
        self.methods = {name: _MethodStats(len(self.bounds)) for name in methods}
        self.errors: dict[tuple[str, str], int] = {}  # (method, status code name) -> failed requests
        registry.register(self)

    def error(self, method: str, code: str) -> None:
        key = (method, code)
        self.errors[key] = self.errors.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "fs3_meta_requests", "meta requests by method and status", labels=("method", "code")
        )
        latency = HistogramMetricFamily(
            "fs3_meta_request_seconds", "meta request latency by method", labels=("method",)
        )
        for name, st in self.methods.items():
            requests.add_metric((name, "OK"), st.ok)
            latency.add_metric((name,), metrics.latency_buckets(st.counts), st.sum)
        for (name, code), n in list(self.errors.items()):
            requests.add_metric((name, code), n)
        yield requests
        yield latency


def _measured(handler: Any, name: str, stats: RequestMetrics, handles: HandleSealer) -> Any:
    st = stats.methods[name]
    counts = st.counts
    bounds = stats.bounds
    error = stats.error
    clock = time.perf_counter

    async def measured(req: Any, payload: Any, ctx: CallContext) -> Any:
        # every request is counted once, by its outcome, in the requests and in the histogram
        start = clock()
        user = ctx.user
        try:
            if user is not None:
                _bind(req, ctx)
                if not user.root:
                    handles.check(user.uid, name, req)
            CALL_DEADLINE.set(ctx.deadline)
            COMMIT_CALLER.set(_caller(req, ctx))
            rsp = await handler(req, payload, ctx)
            if user is not None and not user.root:
                handles.seal_reply(user.uid, name, req, rsp)
        except FS3Error as e:
            error(name, e.code.name)
            raise
        except asyncio.CancelledError:  # the caller went away, or the server stops
            error(name, StatusCode.CANCELLED.name)
            raise
        except Exception:  # answered INTERNAL by the RPC server
            error(name, StatusCode.INTERNAL.name)
            raise
        finally:
            elapsed = clock() - start
            counts[bisect_left(bounds, elapsed)] += 1
            st.sum += elapsed
        st.ok += 1
        return rsp

    return inline(measured) if name in INLINE else measured


def _unknown(_user: Any) -> None:
    return None


def _caller(req: Any, ctx: CallContext) -> object:
    """Who a call's commits are for, as the group commit tells callers apart (COMMIT_CALLER): the
    client its header names, else its connection. Not the connection alone: one client spreads its
    calls over several (a mount over two), and each would be a caller the batch waits for."""
    hdr = getattr(req, "hdr", None)
    client_id = hdr.client_id if hdr is not None else 0
    return client_id or ctx.peer


def _plain(handler: Any, name: str, handles: HandleSealer) -> Any:
    """``handler`` as the server calls it without metrics (inline if ``name`` is in INLINE)."""

    async def call(req: Any, payload: Any, ctx: CallContext) -> Any:
        user = ctx.user
        if user is not None:
            _bind(req, ctx)
            if not user.root:
                handles.check(user.uid, name, req)
        CALL_DEADLINE.set(ctx.deadline)
        COMMIT_CALLER.set(_caller(req, ctx))
        rsp = await handler(req, payload, ctx)
        if user is not None and not user.root:
            handles.seal_reply(user.uid, name, req, rsp)
        return rsp

    return inline(call) if name in INLINE else call


# What a MetaService without a HandleSealer checks handles with: a key nobody has, so no inode but
# the root may be named by id on a non-root user connection.
_NO_HANDLES = HandleSealer(secrets.token_bytes(32))


def _bind(req: Any, ctx: CallContext) -> None:
    """Make a user connection's request act as its token's user, whatever its header says: every
    handler goes through this (see :meth:`MetaService.register`) before it reads ``req.hdr.user``.
    A non-root user's request must also bring its handles (:mod:`fs3.meta.handles`) for the inodes
    it names by id, and gets them with the inodes it is answered.
    A non-root user's own uid, gid and groups replace the header's; a root user's token (a mount
    acting for the users of its host) may name any, as a header token of it may. Either way the
    header carries the connection's token, which the authenticator checks as for any request (so
    a token revoked since the connection opened stops working here too). A non-root user's request
    id is made its own (:func:`fs3.net.auth.user_scoped_id`), and so is the one a SettleRequest
    asks about: a retry is answered with the result recorded under its client and request id,
    which another user must not be able to name (nor read, nor settle)."""
    user = ctx.user
    hdr = req.hdr
    hdr_user = hdr.user
    if not user.root:
        if hdr.request_id:
            hdr.request_id = user_scoped_id(user.uid, hdr.request_id)
        if isinstance(req, m.SettleRequestReq) and req.request_id:
            # the request id it asks about, made its own as that request's was: its own request
            # is found, and another user's record (whose scoped id anyone can compute) is not
            req.request_id = user_scoped_id(user.uid, req.request_id)
        hdr_user.uid = user.uid
        hdr_user.gid = user.gid
        del hdr_user.groups[:]
        hdr_user.groups.extend(user.groups)
    hdr_user.token = ctx.token


def user_info(uid: int, gid: int, groups: tuple[int, ...] = (), token: str = "") -> common_pb2.UserInfo:
    """A request header's identity."""
    return common_pb2.UserInfo(uid=uid, gid=gid, groups=groups, token=token)
