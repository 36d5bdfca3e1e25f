"""MetaDaemon: one meta server process's parts wired together (store, RPC server, mgmtd agent,
routing cache, collector, metrics). :mod:`fs3.meta.main` runs it; tests may run it in-process."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.capability import CapabilityIssuer
from fs3.client.meta_client import DEV_SECRET
from fs3.client.mgmtd_client import MgmtdClient, MgmtdUnreachable, NodeAgent
from fs3.client.routing import RoutingCache
from fs3.client.storage_client import StorageClient
from fs3.config import MetaConfig
from fs3.daemon import apply_pushed_config, hot_log_level
from fs3.errors import FS3Error, StatusCode
from fs3.kv import Database, open_daemon_store
from fs3.meta.auth import Authenticator, TokenAuthenticator, TrustingAuthenticator
from fs3.meta.handles import HandleSealer
from fs3.meta.layout import ChainAllocator, ChainTable
from fs3.meta.read_sessions import ReadSessionMetrics
from fs3.meta.service import MetaService
from fs3.meta.storage_io import ChunkStore, NoStorage, StorageChunks
from fs3.meta.store import MetaStore
from fs3.net import RpcClient, RpcServer
from fs3.net.transport import advertised_host, check_bindable, format_address
from fs3.net.transport_select import TransportMetrics, make_transport
from fs3.proto import common_pb2

log = logging.getLogger(__name__)

# how long a stop waits for the queued read sessions before it closes its connections
_SETTLE_AT_STOP_S = 5.0


class MetaDaemon:
    """Start with :meth:`start` (raises FS3Error when it cannot), end with :meth:`stop`."""

    def __init__(
        self,
        cfg: MetaConfig,
        *,
        secret: bytes | None = None,
        db: Database | None = None,
        chunks: ChunkStore | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cfg = cfg
        self.file_cfg = copy.deepcopy(cfg)  # what a pushed config's hot settings go back to
        self.secret = secret
        self.db = db
        self._own_db = db is None
        self.chunks = chunks
        self.mgmtd: MgmtdClient | None = None
        self._sessions_partial_logged = False  # said that mgmtd's session list is partial, this stretch
        self.routing: RoutingCache | None = None
        self.agent: NodeAgent | None = None
        self.server: RpcServer | None = None
        self.storage_rpc: RpcClient | None = None
        # A registry of its own unless given the process's, so several daemons can share a test.
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics_server: metrics.MetricsServer | None = None
        self.store: MetaStore | None = None
        self.port = 0

    async def _refresh_routing(self) -> None:
        if self.routing is not None:
            await self.routing.refresh(timeout_s=5.0)

    def _table(self, table_id: int) -> ChainTable | None:
        if self.routing is None:
            return None
        routing = self.routing.routing
        try:
            t = routing.chain_table(table_id)
        except FS3Error:
            return None
        return ChainTable(t.table_id, t.version, tuple(t.chain_ids), routing.low_space_chains)

    async def _live_clients(self) -> frozenset[int] | None:
        """Meta client ids with a live mgmtd client session; None when mgmtd cannot say (it is
        unreachable, or its primary is too new to know every live client)."""
        assert self.mgmtd is not None
        try:
            reply = await self.mgmtd.client_sessions()
        except FS3Error as e:
            # an outage of mgmtd is the mgmtd client's to log
            level = logging.DEBUG if isinstance(e, MgmtdUnreachable) else logging.WARNING
            log.log(level, "cannot list client sessions, no session expires this round error=%s", e)
            return None
        if reply.partial:
            if not self._sessions_partial_logged:
                log.info("mgmtd's client session list is partial (a new primary), no session expires yet")
                self._sessions_partial_logged = True
            return None
        self._sessions_partial_logged = False
        return frozenset(int(s.client_id) for s in reply.sessions if s.client_id.isdigit())

    async def start(self) -> None:
        cfg = self.cfg
        check_bindable(cfg.listen_host, cfg.listen_port)
        if self.db is None:
            self.db = await open_daemon_store(cfg.kv)
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.cfg
        assert self.db is not None
        # one transport (cfg.transport: auto, tcp or rdma) for serving and for calls to storage
        transport = make_transport(cfg.transport, cfg.rdma, metrics_sink=TransportMetrics(self.registry))
        if self.secret is None:
            log.warning(
                "no cluster_secret_file: peers authenticate with the built-in development secret,"
                " which anyone can read in fs3's source; set one outside tests"
            )
        if cfg.mgmtd_addresses:
            self.mgmtd = MgmtdClient(cfg.mgmtd_addresses, cluster_secret=self.secret)
            self.routing = RoutingCache(self.mgmtd, refresh_interval_s=2.0)
            await self.routing.start()
            if self.chunks is None:
                # Length queries, truncates and GC removals go to storage through this client.
                self.storage_rpc = RpcClient(
                    self.secret or DEV_SECRET, identity=f"meta-{cfg.node_id}", transport=transport
                )
                self.chunks = StorageChunks(StorageClient(self.routing, self.storage_rpc))
        auth: Authenticator = (
            TokenAuthenticator(self.mgmtd.verify_token, stale_s=cfg.token_stale_s)
            if cfg.authenticate and self.mgmtd is not None
            else TrustingAuthenticator()
        )
        layouts = ChainAllocator(
            self._table,
            default_table=cfg.default_chain_table,
            default_chunk_size=cfg.default_chunk_size,
            default_stripe=cfg.default_stripe,
            refresh=self._refresh_routing,
        )
        self.store = MetaStore(
            self.db,
            layouts=layouts,
            chunks=self.chunks or NoStorage(),
            gc_interval_s=cfg.gc_interval_s,
            gc_grace_s=cfg.gc_grace_s,
            session_timeout_s=cfg.session_timeout_s,
            idem_ttl_s=cfg.idem_ttl_s,
            live_clients=self._live_clients if self.mgmtd is not None else None,
        )
        if self.mgmtd is not None:
            await self._claim_file_system()
        await self.store.start()
        # Clients on user connections (a user token, not the cluster secret) only where tokens are
        # verified: a trusting meta would let them act as anyone.
        self.server = RpcServer(
            self.secret or DEV_SECRET,
            identity=f"meta-{cfg.node_id}",
            transport=transport,
            verify_user=auth.user_of if isinstance(auth, TokenAuthenticator) else None,
        )
        self.capabilities = CapabilityIssuer(self.secret or DEV_SECRET, ttl_s=cfg.capability_ttl_s)
        MetaService(
            self.store,
            auth,
            statfs=self.store.chunks.space,
            capabilities=self.capabilities,
            handles=HandleSealer(self.secret or DEV_SECRET),
        ).register(self.server, self.registry)
        metrics.KvCommitMetrics(self.db.commit_stats, self.registry, space=self.db.space)
        ReadSessionMetrics(self.store.read_sessions, self.registry)
        if cfg.metrics_port:
            self.metrics_server = metrics.serve(cfg.metrics_port, cfg.listen_host, self.registry)
        try:
            host, self.port = await self.server.start((cfg.listen_host, cfg.listen_port))
        except OSError as e:
            raise FS3Error(
                StatusCode.UNAVAILABLE,
                f"cannot listen on {format_address(cfg.listen_host, cfg.listen_port)}: {e.strerror}",
            ) from None
        if self.routing is not None and self.mgmtd is not None:
            advertise = advertised_host(cfg.listen_host, cfg.advertise_host)
            self.agent = NodeAgent(
                self.mgmtd,
                cfg.node_id,
                common_pb2.NODE_META,
                endpoints=[common_pb2.Endpoint(host=advertise, port=self.port, transport="tcp")],
                on_routing_version=lambda v: (
                    self.routing.refresh_soon() if self.routing and v > self.routing.version else None
                ),
                on_config=lambda info: apply_pushed_config(
                    "meta", self.cfg, self.file_cfg, info, self._hot_settings()
                ),
            )
            await self.agent.start()
        log.info("meta serving node_id=%d port=%d engine=%s", cfg.node_id, self.port, cfg.kv.engine)

    async def _claim_file_system(self) -> None:
        """Serve only the cluster's file system: tell mgmtd the id this store holds, before the
        root directory is made in a new store (see Cluster.claim_file_system)."""
        assert self.store is not None and self.mgmtd is not None
        kv = self.cfg.kv
        where = {"lmdb": kv.path, "fdb": f"FoundationDB {kv.cluster_file or '(default cluster file)'}"}.get(
            kv.engine, f"a {kv.engine} store"
        )
        fs_id = await self.store.file_system_id()
        try:
            await self.mgmtd.claim_file_system(self.cfg.node_id, fs_id, where)
        except FS3Error as e:
            if e.code == StatusCode.FAILED_PRECONDITION:
                raise FS3Error(StatusCode.CONFIG_INVALID, e.message) from None
            if e.code not in (StatusCode.NOT_IMPLEMENTED, StatusCode.RPC_UNKNOWN_METHOD):
                raise
            # an mgmtd older than this meta (upgraded after it): nothing to check against yet
            log.warning("mgmtd does not check file system ids (older than this meta): not checked")

    def _hot_settings(self) -> dict[str, Callable[[Any], None]]:
        """What a config pushed by mgmtd changes while meta runs (see apply_pushed_config): the
        log level, and how long capabilities and retry results last. (Not the default_* layout:
        the root directory took it when the file system was made, and directories pass theirs on.)"""
        return {
            **hot_log_level(),
            "capability_ttl_s": lambda v: setattr(self.capabilities, "ttl_s", int(v)),
            "idem_ttl_s": lambda v: setattr(self.store, "idem_ttl_s", v),
        }

    async def stop(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        if self.agent is not None:
            await self.agent.stop()
        if self.routing is not None:
            await self.routing.stop()
        if self.server is not None:
            if self.store is not None and self.store.read_sessions is not None:
                # written before the connections end, which has clients end those sessions again
                # (a store refusing them holds the stop no longer than this)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_SETTLE_AT_STOP_S):
                        await self.store.read_sessions.settled()
            await self.server.stop()
        if self.store is not None:
            await self.store.stop()
        if self.storage_rpc is not None:
            await self.storage_rpc.close()
        if self.mgmtd is not None:
            await self.mgmtd.close()
        if self.db is not None and self._own_db:
            await self.db.close()
            self.db = None
