"""The gRPC face of mgmtd: the Mgmtd service and the standard health service.

Each RPC is declared with the access it needs and whether only the primary may answer it. Errors
leave as gRPC statuses with the exact fs3 code in the trailing metadata (``fs3-status``); a standby
adds the primary's address (``fs3-primary``) to MGMTD_NOT_PRIMARY so that clients follow it.

Access levels (DESIGN §10):

* PUBLIC -- anyone (GetPrimary, health).
* SERVICE -- the cluster secret (heartbeats, InitCluster).
* NODE -- the cluster secret or an admin token (RegisterNode: an operator may pre-register a node).
* ANY -- the cluster secret or any valid user token (routing info, sessions, token checks).
* ADMIN -- an admin user's token, or the cluster secret.

With no cluster secret configured (tests and single-user local clusters) SERVICE and ANY are open;
ADMIN always needs an admin token or the secret, so a non-admin token never reaches an admin RPC.
A credential that is presented must be valid, whatever the level.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from fs3.errors import GRPC_METADATA_KEY, FS3Error, StatusCode, cut_middle, grpc_code_name
from fs3.net.auth import mgmtd_credential
from fs3.proto import common_pb2, health_pb2, health_pb2_grpc, mgmtd_pb2, mgmtd_pb2_grpc

if TYPE_CHECKING:
    from fs3.mgmtd.server import MgmtdServer

log = logging.getLogger(__name__)

TOKEN_METADATA_KEY = "fs3-token"
CREDENTIAL_METADATA_KEY = "fs3-cluster-credential"  # fs3.net.auth.mgmtd_credential
SECRET_METADATA_KEY = "fs3-cluster-secret"  # the raw secret, as clients before the credential sent it
PRIMARY_METADATA_KEY = "fs3-primary"
SERVICE_NAME = "fs3.Mgmtd"
# Client sessions in one ListClientSessions reply at most: each is up to ~1.5 KB, and a reply must
# fit in gRPC's 4 MiB message limit (a listing of every session at once stopped fitting at ~3,000).
SESSIONS_PAGE = 1000


class Access(enum.Enum):
    PUBLIC = "public"
    SERVICE = "service"
    NODE = "node"
    ANY = "any"
    ADMIN = "admin"


class NotPrimaryError(FS3Error):
    """MGMTD_NOT_PRIMARY, carrying the primary's address when one is known."""

    def __init__(self, primary_address: str) -> None:
        hint = f"; the primary is {primary_address}" if primary_address else "; no primary right now"
        super().__init__(StatusCode.MGMTD_NOT_PRIMARY, "this mgmtd is not the primary" + hint)
        self.primary_address = primary_address


class Caller:
    """Who is calling: a service holding the cluster secret, a user, or nobody in particular."""

    __slots__ = ("service", "user")

    def __init__(self, service: bool, user: mgmtd_pb2.User | None) -> None:
        self.service = service
        self.user = user


Handler = Callable[[Any, Any, Caller], Awaitable[Any]]


def _may_read_config(caller: Caller, node_type: int) -> bool:
    """Whether ``caller`` may read the stored config of ``node_type``: the client config anyone
    (a mount on a user token takes it up), a daemon's only a cluster member or an admin."""
    return (
        node_type == common_pb2.NODE_CLIENT
        or caller.service
        or (caller.user is not None and caller.user.admin)
    )


def rpc(access: Access, *, primary: bool = True) -> Callable[[Handler], Callable[..., Awaitable[Any]]]:
    """Declare an RPC: check primary-ness and credentials, and turn FS3Error into a gRPC status."""

    def deco(fn: Handler) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def wrapper(self: MgmtdServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            try:
                if primary:
                    self.server.require_primary()
                caller = await self.authorize(context, access)
                reply = await fn(self, request, caller)
            except FS3Error as e:
                self.server.count_request(fn.__name__, e.code.name, time.perf_counter() - start)
                await abort(context, e)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug: answer INTERNAL and keep serving
                log.exception("rpc failed method=%s", fn.__name__)
                self.server.count_request(fn.__name__, StatusCode.INTERNAL.name, time.perf_counter() - start)
                await abort(context, FS3Error(StatusCode.INTERNAL, f"{type(e).__name__}: {e}"))
            else:
                self.server.count_request(fn.__name__, StatusCode.OK.name, time.perf_counter() - start)
                return reply

        return wrapper

    return deco


#: the longest error message sent to a client, in bytes: gRPC sends it in the trailing metadata,
#: which a client refuses whole past 16 KiB (the reason was lost: a message quoting a 17,000-byte
#: user name reached the admin as RESOURCE_EXHAUSTED "received metadata size exceeds hard limit")
MAX_DETAILS_BYTES = 4096


def error_details(message: str) -> str:
    """``message`` as an error's details: valid UTF-8 of MAX_DETAILS_BYTES at most, cut in the middle
    if longer (see fs3.errors.cut_middle)."""
    return cut_middle(message, MAX_DETAILS_BYTES)


async def abort(context: grpc.aio.ServicerContext, e: FS3Error) -> None:
    md: list[tuple[str, str]] = [(GRPC_METADATA_KEY, str(int(e.code)))]
    if isinstance(e, NotPrimaryError) and e.primary_address:
        md.append((PRIMARY_METADATA_KEY, e.primary_address))
    context.set_trailing_metadata(tuple(md))
    await context.abort(
        getattr(grpc.StatusCode, grpc_code_name(e.code)), error_details(e.message or e.code.name)
    )


class MgmtdServicer(mgmtd_pb2_grpc.MgmtdServicer):
    """Every RPC of ``service Mgmtd``; the work is done by the primary's Cluster and Admin."""

    def __init__(self, server: MgmtdServer) -> None:
        self.server = server

    async def authorize(self, context: grpc.aio.ServicerContext, access: Access) -> Caller:
        md = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        credential, token = md.get(CREDENTIAL_METADATA_KEY), md.get(TOKEN_METADATA_KEY)
        secret = md.get(SECRET_METADATA_KEY)
        configured = self.server.secret
        is_service = False
        if credential is not None and configured:
            is_service = hmac.compare_digest(credential.encode(), mgmtd_credential(configured).encode())
            if not is_service:
                raise FS3Error(StatusCode.UNAUTHENTICATED, "wrong cluster secret")
        elif secret is not None and configured:
            is_service = hmac.compare_digest(secret.encode(), configured)
            if not is_service:
                raise FS3Error(StatusCode.UNAUTHENTICATED, "wrong cluster secret")
        user = await self.server.verify_token(token) if token else None
        if access == Access.PUBLIC:
            return Caller(is_service, user)
        if access == Access.SERVICE:
            if is_service or not configured:
                return Caller(is_service, user)
            raise FS3Error(StatusCode.UNAUTHENTICATED, "this call needs the cluster secret")
        if access == Access.NODE and not configured:
            return Caller(is_service, user)
        if access == Access.ANY:
            if is_service or user is not None or not configured:
                return Caller(is_service, user)
            raise FS3Error(StatusCode.UNAUTHENTICATED, "this call needs a user token or the cluster secret")
        if is_service or (user is not None and user.admin):
            return Caller(is_service, user)
        if user is not None:
            raise FS3Error(StatusCode.PERMISSION_DENIED, f"user {user.uid} ({user.name}) is not an admin")
        raise FS3Error(StatusCode.UNAUTHENTICATED, "this call needs an admin token")

    # ---- any mgmtd -----------------------------------------------------------------------------

    @rpc(Access.PUBLIC, primary=False)
    async def GetPrimary(
        self, request: mgmtd_pb2.GetPrimaryRequest, caller: Caller
    ) -> mgmtd_pb2.GetPrimaryReply:
        node_id, address = self.server.primary_address()
        return mgmtd_pb2.GetPrimaryReply(
            node_id=node_id,
            address=address,
            is_self=self.server.is_primary(),
            self_node_id=self.server.cfg.node_id,
        )

    # ---- services ------------------------------------------------------------------------------

    @rpc(Access.NODE)
    async def RegisterNode(
        self, request: mgmtd_pb2.RegisterNodeRequest, caller: Caller
    ) -> mgmtd_pb2.RegisterNodeReply:
        cluster = self.server.cluster_or_raise()
        await cluster.register_node(request)
        return mgmtd_pb2.RegisterNodeReply(routing_version=cluster.rec.routing_version)

    @rpc(Access.SERVICE)
    async def Heartbeat(
        self, request: mgmtd_pb2.HeartbeatRequest, caller: Caller
    ) -> mgmtd_pb2.HeartbeatReply:
        self.server.metrics_heartbeat()
        return await self.server.cluster_or_raise().heartbeat(request)

    @rpc(Access.SERVICE)
    async def ClaimFileSystem(
        self, request: mgmtd_pb2.ClaimFileSystemRequest, caller: Caller
    ) -> mgmtd_pb2.ClaimFileSystemReply:
        recorded = await self.server.cluster_or_raise().claim_file_system(request)
        return mgmtd_pb2.ClaimFileSystemReply(recorded=recorded)

    # ---- everyone ------------------------------------------------------------------------------

    @rpc(Access.ANY)
    async def GetRoutingInfo(
        self, request: mgmtd_pb2.GetRoutingInfoRequest, caller: Caller
    ) -> mgmtd_pb2.GetRoutingInfoReply:
        info = self.server.cluster_or_raise().routing_info()
        if request.known_version == info.version:
            return mgmtd_pb2.GetRoutingInfoReply(version=info.version)
        return mgmtd_pb2.GetRoutingInfoReply(info=info, version=info.version)

    @rpc(Access.ANY)
    async def ExtendClientSession(
        self, request: mgmtd_pb2.ExtendClientSessionRequest, caller: Caller
    ) -> mgmtd_pb2.ExtendClientSessionReply:
        cluster = self.server.cluster_or_raise()
        session = mgmtd_pb2.ClientSession()
        session.CopyFrom(request.session)
        owner = None
        if caller.user is not None and not caller.service:
            session.uid = caller.user.uid  # a user speaks for itself only
            owner = None if caller.user.root else caller.user.uid
        lost = cluster.extend_session(session, owner, renewing=request.renewing)
        reply = mgmtd_pb2.ExtendClientSessionReply(
            routing_version=cluster.rec.routing_version,
            session_timeout_s=cluster.timing.client_session_timeout_s,
            session_lost=lost,
        )
        cfg = cluster.rec.configs.get(session.type) if session.type else None
        if (
            cfg is not None
            and cfg.version > request.config_version
            and _may_read_config(caller, session.type)
        ):
            reply.config.CopyFrom(cfg)
        return reply

    @rpc(Access.ANY)
    async def EndClientSession(
        self, request: mgmtd_pb2.EndClientSessionRequest, caller: Caller
    ) -> mgmtd_pb2.MgmtdEmpty:
        cluster = self.server.cluster_or_raise()
        owner = None
        if caller.user is not None and not caller.service and not caller.user.root:
            owner = caller.user.uid  # a user ends its own sessions only
        cluster.end_session(request.client_id, owner)
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ANY)
    async def VerifyToken(self, request: mgmtd_pb2.VerifyTokenRequest, caller: Caller) -> mgmtd_pb2.UserReply:
        return mgmtd_pb2.UserReply(user=await self.server.verify_token(request.token))

    @rpc(Access.ANY)
    async def GetConfig(
        self, request: mgmtd_pb2.GetConfigRequest, caller: Caller
    ) -> mgmtd_pb2.GetConfigReply:
        if not _may_read_config(caller, request.node_type):
            raise FS3Error(
                StatusCode.PERMISSION_DENIED,
                "a user reads the client config only: the daemons' configs are for cluster members and admins",
            )
        cfg = await self.server.admin_or_raise().get_config(request.node_type, request.version)
        return mgmtd_pb2.GetConfigReply(config=cfg) if cfg is not None else mgmtd_pb2.GetConfigReply()

    # ---- admin ---------------------------------------------------------------------------------

    @rpc(Access.SERVICE)
    async def InitCluster(
        self, request: mgmtd_pb2.InitClusterRequest, caller: Caller
    ) -> mgmtd_pb2.InitClusterReply:
        return await self.server.admin_or_raise().init_cluster(request)

    @rpc(Access.ADMIN)
    async def UnregisterNode(
        self, request: mgmtd_pb2.UnregisterNodeRequest, caller: Caller
    ) -> mgmtd_pb2.MgmtdEmpty:
        await self.server.cluster_or_raise().unregister_node(request.node_id)
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ADMIN)
    async def SetNodeEnabled(
        self, request: mgmtd_pb2.SetNodeEnabledRequest, caller: Caller
    ) -> mgmtd_pb2.MgmtdEmpty:
        await self.server.cluster_or_raise().set_node_enabled(request.node_id, request.enabled, request.force)
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ADMIN)
    async def CreateTargets(
        self, request: mgmtd_pb2.CreateTargetsRequest, caller: Caller
    ) -> mgmtd_pb2.MgmtdEmpty:
        await self.server.admin_or_raise().create_targets(list(request.targets))
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ADMIN)
    async def RemoveTarget(
        self, request: mgmtd_pb2.RemoveTargetRequest, caller: Caller
    ) -> mgmtd_pb2.MgmtdEmpty:
        await self.server.admin_or_raise().remove_target(request.target_id)
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ADMIN)
    async def OfflineTarget(
        self, request: mgmtd_pb2.OfflineTargetRequest, caller: Caller
    ) -> mgmtd_pb2.ChainReply:
        chain = await self.server.admin_or_raise().offline_target(request.target_id, request.force)
        return mgmtd_pb2.ChainReply(chain=chain)

    @rpc(Access.ADMIN)
    async def UploadChains(
        self, request: mgmtd_pb2.UploadChainsRequest, caller: Caller
    ) -> mgmtd_pb2.MgmtdEmpty:
        await self.server.admin_or_raise().upload_chains(list(request.chains), request.set_preferred_order)
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ADMIN)
    async def UploadChainTable(
        self, request: mgmtd_pb2.UploadChainTableRequest, caller: Caller
    ) -> mgmtd_pb2.UploadChainTableReply:
        version = await self.server.admin_or_raise().upload_chain_table(request)
        return mgmtd_pb2.UploadChainTableReply(version=version)

    @rpc(Access.ADMIN)
    async def UpdateChain(
        self, request: mgmtd_pb2.UpdateChainRequest, caller: Caller
    ) -> mgmtd_pb2.ChainReply:
        admin = self.server.admin_or_raise()
        chain = await admin.update_chain(request.chain_id, request.target_id, request.mode, request.force)
        return mgmtd_pb2.ChainReply(chain=chain)

    @rpc(Access.ADMIN)
    async def RotateLastSrv(
        self, request: mgmtd_pb2.RotateLastSrvRequest, caller: Caller
    ) -> mgmtd_pb2.ChainReply:
        return mgmtd_pb2.ChainReply(chain=await self.server.admin_or_raise().rotate_lastsrv(request.chain_id))

    @rpc(Access.ADMIN)
    async def SetPreferredOrder(
        self, request: mgmtd_pb2.SetPreferredOrderRequest, caller: Caller
    ) -> mgmtd_pb2.ChainReply:
        admin = self.server.admin_or_raise()
        chain = await admin.set_preferred_order(request.chain_id, list(request.target_ids))
        return mgmtd_pb2.ChainReply(chain=chain)

    @rpc(Access.ADMIN)
    async def RotateAsPreferredOrder(
        self, request: mgmtd_pb2.RotateAsPreferredOrderRequest, caller: Caller
    ) -> mgmtd_pb2.ChainReply:
        chain = await self.server.admin_or_raise().rotate_as_preferred(request.chain_id)
        return mgmtd_pb2.ChainReply(chain=chain)

    @rpc(Access.ADMIN)
    async def AddUser(self, request: mgmtd_pb2.AddUserRequest, caller: Caller) -> mgmtd_pb2.UserTokenReply:
        return await self.server.admin_or_raise().add_user(request)

    @rpc(Access.ADMIN)
    async def RemoveUser(self, request: mgmtd_pb2.RemoveUserRequest, caller: Caller) -> mgmtd_pb2.MgmtdEmpty:
        await self.server.admin_or_raise().remove_user(request.uid)
        return mgmtd_pb2.MgmtdEmpty()

    @rpc(Access.ADMIN)
    async def SetUser(self, request: mgmtd_pb2.SetUserRequest, caller: Caller) -> mgmtd_pb2.UserReply:
        return mgmtd_pb2.UserReply(user=await self.server.admin_or_raise().set_user(request))

    @rpc(Access.ADMIN)
    async def IssueToken(
        self, request: mgmtd_pb2.IssueTokenRequest, caller: Caller
    ) -> mgmtd_pb2.UserTokenReply:
        return await self.server.admin_or_raise().issue_token(request)

    @rpc(Access.ADMIN)
    async def GetUser(self, request: mgmtd_pb2.GetUserRequest, caller: Caller) -> mgmtd_pb2.UserReply:
        return mgmtd_pb2.UserReply(user=await self.server.admin_or_raise().get_user(request.uid))

    @rpc(Access.ADMIN)
    async def ListUsers(
        self, request: mgmtd_pb2.ListUsersRequest, caller: Caller
    ) -> mgmtd_pb2.ListUsersReply:
        return mgmtd_pb2.ListUsersReply(users=await self.server.admin_or_raise().list_users())

    @rpc(Access.ADMIN)
    async def ListNodes(
        self, request: mgmtd_pb2.ListNodesRequest, caller: Caller
    ) -> mgmtd_pb2.ListNodesReply:
        c = self.server.cluster_or_raise()
        return mgmtd_pb2.ListNodesReply(
            nodes=[c.node_info(n, listing=True) for _, n in sorted(c.rec.nodes.items())]
        )

    @rpc(Access.ADMIN)
    async def ListTargets(
        self, request: mgmtd_pb2.ListTargetsRequest, caller: Caller
    ) -> mgmtd_pb2.ListTargetsReply:
        c = self.server.cluster_or_raise()
        out = [c.target_info(t, listing=True) for _, t in sorted(c.rec.targets.items())]
        if request.chain_id:
            if request.chain_id not in c.rec.chains:
                raise FS3Error(StatusCode.MGMTD_UNKNOWN_CHAIN, f"chain {request.chain_id} does not exist")
            order = [t.target_id for t in c.rec.chains[request.chain_id].targets]
            by_id = {t.target_id: t for t in out}
            out = [by_id[tid] for tid in order if tid in by_id]
        return mgmtd_pb2.ListTargetsReply(targets=out)

    @rpc(Access.ADMIN)
    async def ListChains(
        self, request: mgmtd_pb2.ListChainsRequest, caller: Caller
    ) -> mgmtd_pb2.ListChainsReply:
        c = self.server.cluster_or_raise()
        if request.table_id:
            versions = [v for (tid, v) in c.rec.tables if tid == request.table_id]
            version = request.table_version or max(versions, default=0)
            table = c.rec.tables.get((request.table_id, version))
            if table is None:
                raise FS3Error(
                    StatusCode.MGMTD_UNKNOWN_CHAIN_TABLE,
                    f"chain table {request.table_id} version {version} does not exist",
                )
            return mgmtd_pb2.ListChainsReply(chains=[c.rec.chains[cid] for cid in table.chain_ids])
        return mgmtd_pb2.ListChainsReply(chains=[ch for _, ch in sorted(c.rec.chains.items())])

    @rpc(Access.ADMIN)
    async def ListChainTables(
        self, request: mgmtd_pb2.ListChainTablesRequest, caller: Caller
    ) -> mgmtd_pb2.ListChainTablesReply:
        c = self.server.cluster_or_raise()
        return mgmtd_pb2.ListChainTablesReply(tables=[t for _, t in sorted(c.rec.tables.items())])

    @rpc(Access.ADMIN)
    async def ListClientSessions(
        self, request: mgmtd_pb2.ListClientSessionsRequest, caller: Caller
    ) -> mgmtd_pb2.ListClientSessionsReply:
        c = self.server.cluster_or_raise()
        c.expire_sessions()
        ids = sorted(c.sessions)
        if request.start_after:
            ids = ids[bisect.bisect_right(ids, request.start_after) :]
        limit = min(request.limit, SESSIONS_PAGE) if request.limit else len(ids)
        return mgmtd_pb2.ListClientSessionsReply(
            sessions=[c.sessions[cid] for cid in ids[:limit]],
            more=len(ids) > limit,
            partial=c.sessions_partial,
            listening_s=c.sessions_heard_s,
            session_timeout_s=c.timing.client_session_timeout_s,
        )

    @rpc(Access.ADMIN)
    async def SetConfig(
        self, request: mgmtd_pb2.SetConfigRequest, caller: Caller
    ) -> mgmtd_pb2.SetConfigReply:
        return mgmtd_pb2.SetConfigReply(version=await self.server.admin_or_raise().set_config(request))


class HealthServicer(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: "" is SERVING while the process runs; "fs3.Mgmtd" only on the primary."""

    def __init__(self, server: MgmtdServer) -> None:
        self.server = server

    def _status(self, service: str) -> int | None:
        if service == "":
            return health_pb2.HealthCheckResponse.SERVING
        if service == SERVICE_NAME:
            return (
                health_pb2.HealthCheckResponse.SERVING
                if self.server.is_primary()
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
        return None

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            changed = self.server.role_event()
            status = self._status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await changed.wait()
