"""Asyncio clients of fs3-mgmtd, with failover across several mgmtd addresses.

* :class:`MgmtdClient` -- every RPC of the Mgmtd service (routing info, admin API, ...).
* :class:`NodeAgent` -- registration and heartbeats of a meta or storage daemon.
* :class:`ClientSessionKeeper` -- the session of a FUSE mount or an admin tool.

::

    client = MgmtdClient(["10.0.0.1:8000", "10.0.0.2:8000"], token=admin_token)
    info = await client.get_routing_info(known_version=0)
    await client.create_targets([TargetSpec(target_id=101, node_id=10001, disk_index=0)])
    await client.close()

Every call goes to the mgmtd believed to be primary. A standby answers MGMTD_NOT_PRIMARY naming the
primary, and the call is re-sent there; an unreachable mgmtd makes the client try the next address.
Calls are retried that way until ``timeout_s`` runs out, then the last error is raised. Errors come
back as :class:`fs3.errors.FS3Error` with the exact status code the server raised.

While no mgmtd answers (a call runs out of time on transport errors, or with no primary), the
client logs it once as a warning, again every :data:`UNREACHABLE_REMINDER_S` while it lasts, and
once more (INFO) when a call is answered again; the call raises :class:`MgmtdUnreachable`, which
its caller logs at DEBUG only, so an outage of mgmtd is a few lines in each log, not one per
heartbeat and refresh.

A redirected call was never executed, so resending it is safe. A call lost to the transport
(UNAVAILABLE or a deadline, with no fs3 code) is resent to the next mgmtd too, except that
InitCluster, AddUser and IssueToken are not resent after a deadline expired in flight: they may have
been applied, and a second one would fail or issue a second token.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import grpc

from fs3.background import Periodic
from fs3.clock import boottime as session_clock  # sessions are timed on it (see fs3.clock)
from fs3.errors import GRPC_METADATA_KEY, FS3Error, StatusCode
from fs3.net.auth import mgmtd_credential
from fs3.proto import common_pb2, mgmtd_pb2, mgmtd_pb2_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

TOKEN_METADATA_KEY = "fs3-token"
CREDENTIAL_METADATA_KEY = "fs3-cluster-credential"
PRIMARY_METADATA_KEY = "fs3-primary"

#: while no mgmtd answers, how often a client says so again (see the module docstring)
UNREACHABLE_REMINDER_S = 60.0

# Not resent once the request may have reached the server (see the module docstring).
_NOT_IDEMPOTENT = frozenset({"AddUser", "IssueToken", "InitCluster"})

# gRPC backs off up to two minutes between reconnects by default; a mgmtd that restarts on the same
# address must be found again within seconds.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

_GRPC_TO_FS3 = {
    grpc.StatusCode.INVALID_ARGUMENT: StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.DEADLINE_EXCEEDED: StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.NOT_FOUND: StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED: StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED: StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION: StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED: StatusCode.ABORTED,
    grpc.StatusCode.UNAVAILABLE: StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL: StatusCode.INTERNAL,
    grpc.StatusCode.UNIMPLEMENTED: StatusCode.NOT_IMPLEMENTED,
    grpc.StatusCode.CANCELLED: StatusCode.CANCELLED,
}


def decode_error(e: grpc.aio.AioRpcError) -> tuple[FS3Error, str]:
    """The FS3Error a gRPC error carries, and the primary's address when the server named one."""
    md = {k: v for k, v in (e.trailing_metadata() or ()) if isinstance(v, str)}
    raw = md.get(GRPC_METADATA_KEY)
    if raw is not None and raw.isdigit():
        code: int = int(raw)
    else:
        code = _GRPC_TO_FS3.get(e.code(), StatusCode.UNKNOWN)
    return FS3Error(code, e.details() or ""), md.get(PRIMARY_METADATA_KEY, "")


class MgmtdUnreachable(FS3Error):
    """No mgmtd primary answered a call in time (UNAVAILABLE, or MGMTD_NOT_PRIMARY while there is
    none). The client has logged the outage; callers log this at DEBUG."""


#: what to do instead of using, or making, clients in a child forked while the parent had one open
FORKED_CLIENT_ADVICE = (
    "connect in the child only (a DataLoader's worker_init_fn, say) and close the parent's "
    "clients before it forks, or start workers with the 'spawn' or 'forkserver' method "
    "(multiprocessing_context='spawn' for a torch DataLoader)"
)
# gRPC connections (the mgmtd client's) do not survive fork(): a child of a process with one
# open hangs or crashes in its own first gRPC call (gRPC: "Other threads are currently calling into
# gRPC, skipping fork() handlers"). Counted here, so that such a child is told instead.
_open_channels = 0
_forked_with_channels = False
_channels_lock = threading.Lock()  # clients of several loops (threads) count together


def _after_fork_in_child() -> None:
    global _open_channels, _forked_with_channels
    _forked_with_channels = _forked_with_channels or _open_channels > 0
    _open_channels = 0


os.register_at_fork(after_in_child=_after_fork_in_child)

# Every gRPC call of this process runs on one event loop of its own, in a thread ("fs3-grpc"): gRPC
# keeps every loop that ever used a channel for the life of the process (its completion queue's
# table of loops lets go of none while any channel is open). A SyncFileSystem's private loop,
# closed with it, stayed so, ~0.25 MiB each: a program connecting and closing clients while one
# stayed open grew 50 MiB in 200 cycles. Calls hop to that loop and back (mgmtd calls are few).
_grpc_loop: asyncio.AbstractEventLoop | None = None
_grpc_pid = 0
_grpc_lock = threading.Lock()


def _loop_for_grpc() -> asyncio.AbstractEventLoop:
    global _grpc_loop, _grpc_pid
    with _grpc_lock:
        if _grpc_loop is None or _grpc_pid != os.getpid():  # (a forked child has no such thread)
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="fs3-grpc", daemon=True).start()
            _grpc_loop, _grpc_pid = loop, os.getpid()
        return _grpc_loop


async def _on_grpc_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the process's gRPC loop; cancelling the caller cancels it there."""
    loop = _loop_for_grpc()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


class MgmtdClient:
    """A client of the mgmtd cluster. Create and use it inside one event loop; ``close`` it."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        token: str | None = None,
        cluster_secret: bytes | str | None = None,
        timeout_s: float = 10.0,
        rpc_timeout_s: float = 3.0,
        log_outages: bool = True,
    ) -> None:
        """``log_outages=False``: an outage is logged at DEBUG only (a command-line tool reports
        the error it gets itself)."""
        if not addresses:
            raise ValueError("at least one mgmtd address is needed")
        self.addresses = list(dict.fromkeys(addresses))
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        md: list[tuple[str, str]] = []
        if token:
            md.append((TOKEN_METADATA_KEY, token))
        if cluster_secret:
            raw = cluster_secret.encode() if isinstance(cluster_secret, str) else cluster_secret
            # a key derived from the secret, never the secret itself (see fs3.net.auth)
            md.append((CREDENTIAL_METADATA_KEY, mgmtd_credential(raw)))
        self._metadata = tuple(md)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, mgmtd_pb2_grpc.MgmtdStub] = {}
        self._pid = os.getpid()
        self.primary: str | None = None  # the address the last successful call went to
        # the outage under way: when it began (monotonic), calls failed, when last logged
        self._unreachable_since: float | None = None
        self._unreachable_calls = 0
        self._unreachable_logged = 0.0
        self._outage_level = logging.WARNING if log_outages else logging.DEBUG

    async def close(self) -> None:
        global _open_channels
        channels, self._channels, self._stubs = self._channels, {}, {}
        if os.getpid() != self._pid:  # the parent's channels: not this process's to close
            return
        with _channels_lock:
            _open_channels -= len(channels)

        async def close_all() -> None:
            for ch in channels.values():
                await ch.close()

        if channels:
            await _on_grpc_loop(close_all())

    async def __aenter__(self) -> MgmtdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _stub(self, address: str) -> mgmtd_pb2_grpc.MgmtdStub:
        global _open_channels
        stub = self._stubs.get(address)
        if stub is None:
            if _forked_with_channels:
                raise RuntimeError(
                    "this process was forked while its parent had an fs3 client open, and gRPC "
                    f"(the mgmtd connection) does not survive that: {FORKED_CLIENT_ADVICE}"
                )
            ch = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[address] = ch
            with _channels_lock:
                _open_channels += 1
            stub = self._stubs[address] = mgmtd_pb2_grpc.MgmtdStub(ch)
        return stub

    async def _unary(
        self, address: str, method: str, request: Any, metadata: tuple[tuple[str, str], ...], timeout_s: float
    ) -> Any:
        """One gRPC call, made on the process's gRPC loop (see _on_grpc_loop)."""

        async def call() -> Any:
            stub = self._stub(address)  # made there: a channel belongs to the loop it was made on
            return await getattr(stub, method)(
                request, metadata=metadata, timeout=timeout_s, wait_for_ready=False
            )

        return await _on_grpc_loop(call())

    def _order(self) -> list[str]:
        if self.primary is None:
            return list(self.addresses)
        return [self.primary] + [a for a in self.addresses if a != self.primary]

    async def call(
        self,
        method: str,
        request: Any,
        *,
        timeout_s: float | None = None,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Any:
        """Send ``request`` to the primary's ``method``, following redirects and failing over;
        ``metadata`` replaces this client's credentials for the call."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        last: FS3Error | None = None
        backoff = 0.05
        hinted: str | None = None
        # addresses this call could not reach: a standby's redirect to one (a primary advertising
        # an address that does not work from here) is not followed again, the list goes on instead
        unreachable: set[str] = set()
        failing_since: float | None = None  # this call's first failure to reach any mgmtd
        while True:
            candidates = [hinted] if hinted else self._order()
            hinted = None
            for address in candidates:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    reply = await self._unary(
                        address,
                        method,
                        request,
                        self._metadata if metadata is None else metadata,
                        min(self.rpc_timeout_s, remaining),
                    )
                except grpc.aio.AioRpcError as e:
                    err, primary = decode_error(e)
                    if err.code == StatusCode.MGMTD_NOT_PRIMARY:
                        last = err
                        if primary and primary != address and primary not in unreachable:
                            hinted = primary
                            break
                        continue
                    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and (
                        e.trailing_metadata() is None
                        or not any(k == GRPC_METADATA_KEY for k, _ in e.trailing_metadata())
                    ):
                        # transport trouble, not an answer: try the next mgmtd
                        if method in _NOT_IDEMPOTENT and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                            raise err from None
                        last = FS3Error(StatusCode.UNAVAILABLE, f"mgmtd {address}: {e.details()}")
                        if failing_since is None:
                            failing_since = time.monotonic()
                        unreachable.add(address)
                        if self.primary == address:
                            self.primary = None
                        continue
                    self._answered()
                    raise err from None
                self.primary = address
                self._answered()
                return reply
            if hinted:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                error = last or FS3Error(StatusCode.UNAVAILABLE, "no mgmtd answered")
                if error.code not in (StatusCode.UNAVAILABLE, StatusCode.MGMTD_NOT_PRIMARY):
                    raise error
                self._unanswered(method, error, failing_since)
                raise MgmtdUnreachable(error.code, error.message)
            await asyncio.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, 0.5)

    def _unanswered(self, method: str, error: FS3Error, since: float | None = None) -> None:
        """A call gave up, having failed to reach mgmtd from ``since`` on: the outage is dated from
        there, not from the end of the call's retries (its "answers again after" undercounted)."""
        now = time.monotonic()
        self._unreachable_calls += 1
        if self._unreachable_since is None:
            self._unreachable_logged = now
            self._unreachable_since = now if since is None else since
            log.log(
                self._outage_level,
                "mgmtd unreachable (said again every %.0f s while it lasts) addresses=%s call=%s error=%s",
                UNREACHABLE_REMINDER_S,
                ",".join(self.addresses),
                method,
                error,
            )
        elif now - self._unreachable_logged >= UNREACHABLE_REMINDER_S:
            self._unreachable_logged = now
            log.log(
                self._outage_level,
                "mgmtd still unreachable for %.0f s failed_calls=%d error=%s",
                now - self._unreachable_since,
                self._unreachable_calls,
                error,
            )

    def _answered(self) -> None:
        if self._unreachable_since is not None:
            log.log(
                min(logging.INFO, self._outage_level),
                "mgmtd answers again after %.1f s failed_calls=%d address=%s",
                time.monotonic() - self._unreachable_since,
                self._unreachable_calls,
                self.primary,
            )
            self._unreachable_since = None
            self._unreachable_calls = 0

    # ---- any mgmtd -----------------------------------------------------------------------------

    async def get_primary(self) -> mgmtd_pb2.GetPrimaryReply:
        """Ask the mgmtds in turn who the primary is (the first answer wins)."""
        last: Exception | None = None
        for address in self._order():
            try:
                return await self._unary(
                    address, "GetPrimary", mgmtd_pb2.GetPrimaryRequest(), self._metadata, self.rpc_timeout_s
                )
            except grpc.aio.AioRpcError as e:
                last = decode_error(e)[0]
        raise last or FS3Error(StatusCode.UNAVAILABLE, "no mgmtd answered")

    # ---- services ------------------------------------------------------------------------------

    async def register_node(
        self, node_id: int, node_type: int, endpoints: Sequence[common_pb2.Endpoint] = (), hostname: str = ""
    ) -> int:
        r = await self.call(
            "RegisterNode",
            mgmtd_pb2.RegisterNodeRequest(
                node_id=node_id, type=node_type, endpoints=endpoints, hostname=hostname
            ),
        )
        return r.routing_version

    async def claim_file_system(
        self, node_id: int, file_system_id: str, store: str
    ) -> mgmtd_pb2.FileSystemRecord:
        """Meta, before it serves: the file system its store holds is the cluster's (see
        fs3.mgmtd.cluster.Cluster.claim_file_system)."""
        r = await self.call(
            "ClaimFileSystem",
            mgmtd_pb2.ClaimFileSystemRequest(node_id=node_id, file_system_id=file_system_id, store=store),
        )
        return r.recorded

    async def heartbeat(self, request: mgmtd_pb2.HeartbeatRequest) -> mgmtd_pb2.HeartbeatReply:
        return await self.call("Heartbeat", request)

    # ---- everyone ------------------------------------------------------------------------------

    async def get_routing_info(self, known_version: int = 0) -> mgmtd_pb2.GetRoutingInfoReply:
        return await self.call("GetRoutingInfo", mgmtd_pb2.GetRoutingInfoRequest(known_version=known_version))

    async def extend_session(
        self, session: mgmtd_pb2.ClientSession, config_version: int = 0, *, renewing: bool = False
    ) -> mgmtd_pb2.ExtendClientSessionReply:
        return await self.call(
            "ExtendClientSession",
            mgmtd_pb2.ExtendClientSessionRequest(
                session=session, config_version=config_version, renewing=renewing
            ),
        )

    async def end_session(self, client_id: str) -> None:
        await self.call("EndClientSession", mgmtd_pb2.EndClientSessionRequest(client_id=client_id))

    def set_token(self, token: str) -> None:
        """Send ``token`` with later calls instead of the one given at start (the user's token
        file changed: see ``fs3.client.filesystem``)."""
        md = [(k, v) for k, v in self._metadata if k != TOKEN_METADATA_KEY]
        self._metadata = ((TOKEN_METADATA_KEY, token), *md) if token else tuple(md)

    async def verify_token(self, token: str) -> mgmtd_pb2.User:
        """Whose ``token`` is (UNAUTHENTICATED if nobody's). The call carries that token as its
        credential, not this client's: a client whose own token has expired can still ask about
        the new one it was given."""
        md = tuple((k, v) for k, v in self._metadata if k != TOKEN_METADATA_KEY)
        request = mgmtd_pb2.VerifyTokenRequest(token=token)
        return (await self.call("VerifyToken", request, metadata=((TOKEN_METADATA_KEY, token), *md))).user

    async def get_config(self, node_type: int, version: int = 0) -> mgmtd_pb2.ConfigInfo | None:
        r = await self.call("GetConfig", mgmtd_pb2.GetConfigRequest(node_type=node_type, version=version))
        return r.config if r.HasField("config") else None

    # ---- admin ---------------------------------------------------------------------------------

    async def init_cluster(
        self, cluster_id: str = "fs3", admin_name: str = "root", admin_uid: int = 0
    ) -> str:
        """Initialize the cluster; returns the first admin's token (shown only this once)."""
        r = await self.call(
            "InitCluster",
            mgmtd_pb2.InitClusterRequest(cluster_id=cluster_id, admin_name=admin_name, admin_uid=admin_uid),
        )
        return r.admin_token

    async def unregister_node(self, node_id: int) -> None:
        await self.call("UnregisterNode", mgmtd_pb2.UnregisterNodeRequest(node_id=node_id))

    async def set_node_enabled(self, node_id: int, enabled: bool, force: bool = False) -> None:
        await self.call(
            "SetNodeEnabled", mgmtd_pb2.SetNodeEnabledRequest(node_id=node_id, enabled=enabled, force=force)
        )

    async def create_targets(self, targets: Sequence[mgmtd_pb2.TargetSpec]) -> None:
        await self.call("CreateTargets", mgmtd_pb2.CreateTargetsRequest(targets=targets))

    async def remove_target(self, target_id: int) -> None:
        await self.call("RemoveTarget", mgmtd_pb2.RemoveTargetRequest(target_id=target_id))

    async def offline_target(self, target_id: int, force: bool = False) -> mgmtd_pb2.ChainInfo:
        r = await self.call("OfflineTarget", mgmtd_pb2.OfflineTargetRequest(target_id=target_id, force=force))
        return r.chain

    async def upload_chains(
        self, chains: dict[int, Sequence[int]], set_preferred_order: bool = False
    ) -> None:
        specs = [mgmtd_pb2.ChainSpec(chain_id=cid, target_ids=tids) for cid, tids in chains.items()]
        await self.call(
            "UploadChains",
            mgmtd_pb2.UploadChainsRequest(chains=specs, set_preferred_order=set_preferred_order),
        )

    async def upload_chain_table(self, table_id: int, chain_ids: Sequence[int], description: str = "") -> int:
        r = await self.call(
            "UploadChainTable",
            mgmtd_pb2.UploadChainTableRequest(
                table_id=table_id, chain_ids=chain_ids, description=description
            ),
        )
        return r.version

    async def update_chain(
        self, chain_id: int, target_id: int, mode: int, force: bool = False
    ) -> mgmtd_pb2.ChainInfo:
        r = await self.call(
            "UpdateChain",
            mgmtd_pb2.UpdateChainRequest(chain_id=chain_id, target_id=target_id, mode=mode, force=force),
        )
        return r.chain

    async def rotate_lastsrv(self, chain_id: int) -> mgmtd_pb2.ChainInfo:
        return (await self.call("RotateLastSrv", mgmtd_pb2.RotateLastSrvRequest(chain_id=chain_id))).chain

    async def set_preferred_order(self, chain_id: int, target_ids: Sequence[int]) -> mgmtd_pb2.ChainInfo:
        r = await self.call(
            "SetPreferredOrder", mgmtd_pb2.SetPreferredOrderRequest(chain_id=chain_id, target_ids=target_ids)
        )
        return r.chain

    async def rotate_as_preferred_order(self, chain_id: int) -> mgmtd_pb2.ChainInfo:
        r = await self.call(
            "RotateAsPreferredOrder", mgmtd_pb2.RotateAsPreferredOrderRequest(chain_id=chain_id)
        )
        return r.chain

    async def add_user(
        self,
        uid: int,
        name: str,
        gid: int = 0,
        groups: Sequence[int] = (),
        admin: bool = False,
        root: bool = False,
    ) -> str:
        """Create a user; returns its first token."""
        r = await self.call(
            "AddUser",
            mgmtd_pb2.AddUserRequest(uid=uid, name=name, gid=gid, groups=groups, admin=admin, root=root),
        )
        return r.token

    async def remove_user(self, uid: int) -> None:
        await self.call("RemoveUser", mgmtd_pb2.RemoveUserRequest(uid=uid))

    async def set_user(self, request: mgmtd_pb2.SetUserRequest) -> mgmtd_pb2.User:
        return (await self.call("SetUser", request)).user

    async def issue_token(self, uid: int, ttl_s: float = 0.0, invalidate_existing: bool = False) -> str:
        r = await self.call(
            "IssueToken",
            mgmtd_pb2.IssueTokenRequest(uid=uid, ttl_s=ttl_s, invalidate_existing=invalidate_existing),
        )
        return r.token

    async def get_user(self, uid: int) -> mgmtd_pb2.User:
        return (await self.call("GetUser", mgmtd_pb2.GetUserRequest(uid=uid))).user

    async def list_users(self) -> list[mgmtd_pb2.User]:
        return list((await self.call("ListUsers", mgmtd_pb2.ListUsersRequest())).users)

    async def list_nodes(self) -> list[mgmtd_pb2.NodeInfo]:
        return list((await self.call("ListNodes", mgmtd_pb2.ListNodesRequest())).nodes)

    async def list_targets(self, chain_id: int = 0) -> list[mgmtd_pb2.TargetInfo]:
        return list((await self.call("ListTargets", mgmtd_pb2.ListTargetsRequest(chain_id=chain_id))).targets)

    async def list_chains(self, table_id: int = 0, table_version: int = 0) -> list[mgmtd_pb2.ChainInfo]:
        r = await self.call(
            "ListChains", mgmtd_pb2.ListChainsRequest(table_id=table_id, table_version=table_version)
        )
        return list(r.chains)

    async def list_chain_tables(self) -> list[mgmtd_pb2.ChainTable]:
        return list((await self.call("ListChainTables", mgmtd_pb2.ListChainTablesRequest())).tables)

    async def list_client_sessions(self) -> list[mgmtd_pb2.ClientSession]:
        return list((await self.client_sessions()).sessions)

    async def client_sessions(self) -> mgmtd_pb2.ListClientSessionsReply:
        """The live client sessions, and whether the list may be ``partial`` (a primary that has
        not listened for a whole client session timeout yet): asked for page by page, as one reply."""
        whole = mgmtd_pb2.ListClientSessionsReply()
        # as many a page as mgmtd gives (0 would ask for all at once, which may not fit a reply)
        request = mgmtd_pb2.ListClientSessionsRequest(limit=(1 << 32) - 1)
        while True:
            page = await self.call("ListClientSessions", request)
            whole.sessions.extend(page.sessions)
            # a page from another primary (a failover between pages) may know fewer sessions
            whole.partial = whole.partial or page.partial
            whole.listening_s, whole.session_timeout_s = page.listening_s, page.session_timeout_s
            if not page.more or not page.sessions:
                return whole
            request.start_after = page.sessions[-1].client_id

    async def set_config(self, node_type: int, content: str, description: str = "") -> int:
        r = await self.call(
            "SetConfig",
            mgmtd_pb2.SetConfigRequest(node_type=node_type, content=content, description=description),
        )
        return r.version


def _hear_config(on_config: Callable[[mgmtd_pb2.ConfigInfo], None], info: mgmtd_pb2.ConfigInfo) -> None:
    """Hand a pushed config to its listener; whatever that raises is logged here, never failing
    the heartbeat or session extension that brought it (a daemon's first one is its start)."""
    try:
        on_config(info)
    except Exception:
        log.exception("applying pushed config version %d failed", info.version)


class NodeAgent:
    """Registers a service node with mgmtd and keeps it alive with heartbeats (meta and storage).

    ``targets`` (storage only) is called before each heartbeat and returns the report for every
    target the daemon serves; ``routing_version`` (storage only), the routing version it acts on. :meth:`beat_soon` sends one at once, e.g. after a local state change.
    ``on_routing_version`` hears the routing version each reply carries (hand it to the routing
    cache so that it refreshes early); ``on_config`` hears a newer config for this node type.
    """

    def __init__(
        self,
        client: MgmtdClient,
        node_id: int,
        node_type: int,
        *,
        endpoints: Sequence[common_pb2.Endpoint] = (),
        hostname: str = "",
        interval_s: float = 2.0,
        targets: Callable[[], Sequence[mgmtd_pb2.TargetHeartbeat]] | None = None,
        on_routing_version: Callable[[int], None] | None = None,
        on_config: Callable[[mgmtd_pb2.ConfigInfo], None] | None = None,
        routing_version: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.node_type = node_type
        self.endpoints = list(endpoints)
        self.hostname = hostname or socket.gethostname()
        self._targets = targets
        self._routing_version = routing_version
        self._on_routing_version = on_routing_version
        self._on_config = on_config
        # (incarnation, sequence) must grow across restarts: start time in ns, then a counter
        self.incarnation = time.time_ns()
        self.sequence = 0
        self.config_version = 0
        self.last_reply: mgmtd_pb2.HeartbeatReply | None = None
        self.last_error: FS3Error | None = None
        self.max_interval_s = interval_s
        self._loop = Periodic(
            f"fs3-heartbeat-{node_id}", self._beat_in_loop, interval_s, on_error=self._failed
        )

    async def start(self) -> None:
        """Register and send the first heartbeat (errors raise), then heartbeat in the background.
        A disabled node (``fs3 admin disable-node``) starts all the same, refused until enabled: its
        daemon is restarted during maintenance, and must be there when the node is enabled again."""
        await self.client.register_node(self.node_id, self.node_type, self.endpoints, self.hostname)
        try:
            await self.beat()
        except FS3Error as e:
            if e.code != StatusCode.MGMTD_NODE_DISABLED:
                raise
            log.warning(
                "node %d is disabled: it serves nothing until 'fs3 admin enable-node %d'",
                self.node_id,
                self.node_id,
            )
            self.last_error = e
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def beat_soon(self) -> None:
        self._loop.wake()

    async def beat(self) -> mgmtd_pb2.HeartbeatReply:
        """Send one heartbeat now."""
        self.sequence += 1
        req = mgmtd_pb2.HeartbeatRequest(
            node_id=self.node_id,
            type=self.node_type,
            incarnation=self.incarnation,
            sequence=self.sequence,
            endpoints=self.endpoints,
            hostname=self.hostname,
            pid=os.getpid(),
            targets=list(self._targets()) if self._targets is not None else [],
            config_version=self.config_version,
            routing_version=self._routing_version() if self._routing_version is not None else 0,
        )
        try:
            reply = await self.client.heartbeat(req)
        except FS3Error as e:
            if e.code != StatusCode.MGMTD_UNKNOWN_NODE:
                raise
            # the node record is gone (unregistered, or a fresh store): register again
            await self.client.register_node(self.node_id, self.node_type, self.endpoints, self.hostname)
            self.sequence += 1
            req.sequence = self.sequence
            reply = await self.client.heartbeat(req)
        self.last_reply = reply
        self._pace(reply.heartbeat_timeout_s)
        if reply.HasField("config") and reply.config.version > self.config_version:
            self.config_version = reply.config.version
            if self._on_config is not None:
                _hear_config(self._on_config, reply.config)
        if self._on_routing_version is not None:
            self._on_routing_version(reply.routing_version)
        return reply

    def _pace(self, timeout_s: float) -> None:
        """Heartbeat at least three times per mgmtd's heartbeat timeout: an interval configured
        near or above it would have mgmtd fail this node between beats, over and over."""
        interval = self.max_interval_s
        if timeout_s > 0 and interval > timeout_s / 3:
            interval = timeout_s / 3
        if interval != self._loop.interval_s:
            if interval < self.max_interval_s:
                log.warning(
                    "heartbeat interval %.3gs is more than a third of mgmtd's heartbeat timeout "
                    "%.3gs: heartbeating every %.3gs node_id=%d",
                    self.max_interval_s,
                    timeout_s,
                    interval,
                    self.node_id,
                )
            self._loop.interval_s = interval

    async def _beat_in_loop(self) -> None:
        await self.beat()
        self.last_error = None

    def _failed(self, e: Exception) -> None:
        if not isinstance(e, FS3Error):
            log.exception("heartbeat failed node_id=%d", self.node_id)
            return
        if isinstance(e, MgmtdUnreachable):
            log.debug("heartbeat failed node_id=%d error=%s", self.node_id, e)
        elif self.last_error is None or self.last_error.code != e.code:
            log.warning("heartbeat failed node_id=%d error=%s", self.node_id, e)
        self.last_error = e


class ClientSessionKeeper:
    """Keeps a client session (a FUSE mount, a native client) alive by extending it periodically:
    every ``interval_s``, and at least three times per session timeout mgmtd states in its reply.

    Meta expires the open-file sessions of clients without a live session here, so a client that
    holds files open must keep one (``client_id`` = its meta client id)."""

    def __init__(
        self, client: MgmtdClient, session: mgmtd_pb2.ClientSession, *, interval_s: float = 10.0
    ) -> None:
        self.client = client
        self.session = session
        self.max_interval_s = interval_s
        self.last_reply: mgmtd_pb2.ExtendClientSessionReply | None = None
        # hears each newer client config mgmtd pushes (fs3 admin config set client), once set
        self.on_config: Callable[[mgmtd_pb2.ConfigInfo], None] | None = None
        self.config_version = 0
        # Which handles mgmtd's session vouches for (see vouches_for; FileSystem's guard), on
        # session_clock(): mgmtd holds the session at least until ``alive_until`` (a session timeout
        # after the latest extension that succeeded was sent, ``_latest_sent``), and has held it
        # without a break since ``unbroken_since`` (the reply that started the run of extensions,
        # each answered before the one before it could have run out). ``margin``: a third of the
        # timeout, for a write that passed the guard to reach storage.
        self.alive_until = 0.0
        self.unbroken_since = 0.0
        self.margin = 0.0
        self._latest_sent = -math.inf
        self._loop = Periodic("fs3-client-session", self._extend, interval_s, on_error=self._failed)

    async def start(self, *, strict: bool = True) -> None:
        """Extend once now, then periodically. With ``strict`` a failure of the first extension
        raises; without, it is logged and the loop retries every interval."""
        try:
            await self._extend()
        except FS3Error as e:
            if strict:
                raise
            self._failed(e)
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def end(self, timeout_s: float = 2.0) -> None:
        """Tell mgmtd the session is over (after :meth:`stop`): it leaves mgmtd's list of live
        clients now, not a session timeout later. A mgmtd that cannot be told (unreachable, or
        older) lets it expire as before."""
        if self.client._unreachable_since is not None:  # noqa: SLF001 - an outage under way: not waited for
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.client.end_session(self.session.client_id)
        except (FS3Error, TimeoutError) as e:
            log.debug("client session end not told to mgmtd client_id=%s error=%s", self.session.client_id, e)

    def vouches_for(self, since: float) -> bool:
        """Whether mgmtd has held this client's session without a break since ``since`` (a
        :func:`session_clock` time) and will for a while yet: then meta has not ended (and will not
        end soon) the open-file sessions this client held at ``since``, for it prunes only those of
        clients without a session. False while this client cannot tell: mgmtd unreachable for
        most of a session timeout, or this process paused or suspended longer."""
        return since >= self.unbroken_since and session_clock() < self.alive_until - self.margin

    async def _extend(self) -> None:
        sent = session_clock()
        reply = await self.client.extend_session(
            self.session, self.config_version, renewing=self.last_reply is not None
        )
        # Answered after the session could have run out (mgmtd hears of an extension by the time
        # its reply is here, and drops a session a timeout after the last one it heard of, which
        # was sent no sooner than alive_until's), or mgmtd says it did: a new run starts with this
        # reply. Replies may come in any order (a periodic extension and another).
        answered = session_clock()
        timeout = reply.session_timeout_s
        if answered > self.alive_until or reply.session_lost:
            self.unbroken_since = max(self.unbroken_since, answered)
            if reply.session_lost or self.last_reply is not None:
                log.warning(
                    "client session %s at mgmtd (this client was paused or cut off longer than its "
                    "timeout, %.0f s) client_id=%s: files it held open are checked with meta before "
                    "their next I/O",
                    "had expired" if reply.session_lost else "may have expired",
                    timeout,
                    self.session.client_id,
                )
        if sent > self._latest_sent and timeout > 0:  # no timeout (an older mgmtd): no vouching
            self._latest_sent = sent
            self.alive_until, self.margin = sent + timeout, timeout / 3
        self.last_reply = reply
        pushed = reply.config if reply.HasField("config") else None
        if pushed is not None and pushed.version > self.config_version and self.on_config is not None:
            self.config_version = pushed.version
            _hear_config(self.on_config, pushed)
        if timeout > 0:
            self._loop.interval_s = min(self.max_interval_s, timeout / 3)

    def _failed(self, e: Exception) -> None:
        if isinstance(e, MgmtdUnreachable):
            log.debug("client session extension failed client_id=%s error=%s", self.session.client_id, e)
        elif isinstance(e, FS3Error):
            log.warning("client session extension failed client_id=%s error=%s", self.session.client_id, e)
        else:
            log.exception("client session extension failed client_id=%s", self.session.client_id)
