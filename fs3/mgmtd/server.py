"""fs3-mgmtd assembled: the gRPC server, the election loop and the primary's periodic work.

Every mgmtd process runs the same :class:`MgmtdServer`. It serves gRPC at once; while it is a
standby it answers MGMTD_NOT_PRIMARY (naming the primary) to everything but GetPrimary and health.
When it takes the lease it loads the cluster from the store and runs the chain updater; when it
loses the lease it drops that state and becomes a standby again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.background import cancel_and_wait
from fs3.config import MgmtdConfig
from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import Database, Transaction
from fs3.mgmtd import users
from fs3.mgmtd.admin import Admin
from fs3.mgmtd.cluster import Cluster, Timing
from fs3.mgmtd.election import Election
from fs3.mgmtd.service import HealthServicer, MgmtdServicer, NotPrimaryError
from fs3.net.transport import advertised_host, check_bindable, format_address
from fs3.proto import common_pb2, health_pb2_grpc, mgmtd_pb2, mgmtd_pb2_grpc

log = logging.getLogger(__name__)

# A clean stop waits for the storage nodes' heartbeats to tell them of the stop fence at most half
# a heartbeat timeout, and never longer than this (systemd's TimeoutStopSec for mgmtd is 30 s).
FENCE_WAIT_MAX_S = 10.0


class _Metrics:
    def __init__(self, reg: CollectorRegistry) -> None:
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.is_primary = metrics.gauge("fs3_mgmtd_is_primary", "1 while this mgmtd holds the lease", reg=reg)
        self.routing_version = metrics.gauge(
            "fs3_mgmtd_routing_version", "current routing info version", reg=reg
        )
        self.heartbeats = metrics.counter("fs3_mgmtd_heartbeats_total", "heartbeats received", reg=reg)
        self.chain_updates = metrics.counter(
            "fs3_mgmtd_chain_updates_total", "chain versions published", reg=reg
        )
        self.targets = metrics.gauge("fs3_mgmtd_targets", "targets by public state", ("state",), reg=reg)
        self.requests = metrics.counter(
            "fs3_mgmtd_requests", "mgmtd requests by method and outcome", ("method", "code"), reg
        )
        self.request_seconds = metrics.histogram(
            "fs3_mgmtd_request_seconds", "mgmtd request latency", ("method",), reg
        )
        self.stop_fence = metrics.gauge(
            "fs3_mgmtd_stop_fence_seconds",
            "seconds until the stop fence this primary honours ends (no node is failed before it "
            "and a heartbeat timeout have passed); 0 when there is none",
            reg=reg,
        )

    def request(self, method: str, code: str, seconds: float) -> None:
        """One RPC answered (``code``: OK or the FS3Error's status name)."""
        children = self._children.get((method, code))
        if children is None:  # labels() takes a lock and builds a key: looked up once
            children = self._children[(method, code)] = (
                self.requests.labels(method, code),
                self.request_seconds.labels(method),
            )
        children[0].inc()
        children[1].observe(seconds)


class MgmtdServer:
    """One mgmtd process: ``await start()``, later ``await stop()``."""

    def __init__(
        self,
        cfg: MgmtdConfig,
        db: Database,
        *,
        secret: bytes | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``registry``: where metrics go (the daemon passes the process registry; by default a
        private one, so that several servers can share a test process)."""
        self.cfg = cfg
        self.registry = registry if registry is not None else CollectorRegistry()
        self.db = db
        self.secret = secret or b""
        self.port = 0
        self.address = ""
        self.election: Election | None = None
        self.cluster: Cluster | None = None
        self.admin: Admin | None = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._updater: asyncio.Task | None = None
        self._role_event = asyncio.Event()
        self._metrics: _Metrics | None = None
        self._metrics_server = None

    def count_request(self, method: str, code: str, seconds: float) -> None:
        """An RPC answered (see fs3.mgmtd.service.rpc): fs3_mgmtd_requests_total, ..._seconds."""
        if self._metrics is not None:
            self._metrics.request(method, code, seconds)

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the port and start serving; raises FS3Error(UNAVAILABLE) when the port is taken."""
        # SO_REUSEPORT is on by default in gRPC; off, so that a second process on the same port
        # fails instead of silently sharing it.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        _add_checked(mgmtd_pb2_grpc.add_MgmtdServicer_to_server, MgmtdServicer(self), server)
        _add_checked(health_pb2_grpc.add_HealthServicer_to_server, HealthServicer(self), server)
        where = format_address(self.cfg.listen_host, self.cfg.listen_port)
        check_bindable(self.cfg.listen_host, self.cfg.listen_port)
        try:
            port = server.add_insecure_port(where)
        except RuntimeError as e:
            raise FS3Error(StatusCode.UNAVAILABLE, f"cannot listen on {where}: {e}") from None
        if port == 0:
            raise FS3Error(StatusCode.UNAVAILABLE, f"cannot listen on {where} (address in use?)")
        self.port = port
        self.address = format_address(advertised_host(self.cfg.listen_host, self.cfg.advertise_host), port)
        if self.cfg.metrics_port:
            self._metrics_server = metrics.serve(self.cfg.metrics_port, self.cfg.listen_host, self.registry)
        self._metrics = _Metrics(self.registry)
        self._metrics.stop_fence.set_function(
            lambda: self.cluster.fence_left() if self.cluster is not None else 0.0
        )
        metrics.KvCommitMetrics(self.db.commit_stats, self.registry, space=self.db.space)
        await server.start()
        self._server = server
        self.election = Election(self.db, self.cfg.node_id, self.address, self.cfg.lease_interval_s)
        if self.cfg.lease_interval_s > self.cfg.heartbeat_timeout_s / 2:
            log.warning(
                "lease_interval_s %.1f is over half of heartbeat_timeout_s %.1f: when a standby "
                "takes over from a dead primary, storage nodes' leases (0.8 x heartbeat_timeout_s) "
                "may run out first, and their targets refuse reads until it hears from them",
                self.cfg.lease_interval_s,
                self.cfg.heartbeat_timeout_s,
            )
        self._tasks.append(asyncio.create_task(self._election_loop(), name="mgmtd-election"))
        log.info("mgmtd serving node_id=%d address=%s", self.cfg.node_id, self.address)

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; a primary first sets the stop fence (``stop_fence_s``, see
        :meth:`_fence`), then gives up its lease so that a standby takes over at once."""
        if self.cfg.stop_fence_s > 0 and self.is_primary():
            await self._fence(self.cfg.stop_fence_s)
        for t in [*self._tasks, *([self._updater] if self._updater else [])]:
            t.cancel()
        for t in [*self._tasks, *([self._updater] if self._updater else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._updater = None
        if self._server is not None:
            await self._server.stop(grace_s)
        if self.election is not None:
            await self.election.release()
        self._set_role(None, stopping=True)
        if self._metrics_server is not None:
            self._metrics_server.close()
        log.info("mgmtd stopped node_id=%d", self.cfg.node_id)

    async def _fence(self, seconds: float) -> None:
        """Unless another mgmtd recorded itself as a standby within a lease interval (it takes
        over within a second of the lease's release, and its heartbeat replies renew the leases),
        promise that no node is failed for ``seconds`` (:meth:`Cluster.begin_fence`), then keep
        answering heartbeats until every storage node that may be serving has had that answer
        and acts on the routing it named (which extends its lease to the fence's end), for at
        most half a heartbeat timeout (and :data:`FENCE_WAIT_MAX_S`): a node that heartbeats
        slower keeps the lease it has. Chains stop changing first (this mgmtd is stopping), so
        that routing versions stop moving and nodes catch up with the last one."""
        cluster = self.cluster
        assert cluster is not None
        if not cluster.fence_waiting():
            log.info("stop fence: none needed, no storage node serves (they stopped first)")
            return
        assert self.election is not None
        try:
            standbys = await self.election.standbys(self.cfg.lease_interval_s)
        except FS3Error:
            standbys = []
        if standbys:
            log.info(
                "stop fence: none needed, standby mgmtd %s takes over",
                ",".join(map(str, sorted(standbys))),
            )
            return
        await self._stop_updater()
        try:
            ends = await cluster.begin_fence(seconds)
        except FS3Error as e:
            log.warning("could not set the stop fence (storage leases run out as usual) error=%s", e)
            return
        wait_s = min(self.cfg.heartbeat_timeout_s / 2, FENCE_WAIT_MAX_S)
        deadline = asyncio.get_running_loop().time() + wait_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                while cluster.fence_waiting():
                    cluster.fence_heard.clear()
                    await cluster.fence_heard.wait()
        waiting = cluster.fence_waiting()
        log.info(
            "stop fence: no node is failed before %s (%.0f s from now, by this or the next primary); "
            "storage nodes told %d, not told %s",
            time.strftime("%H:%M:%S", time.localtime(ends)),
            ends - cluster.wall(),
            len(cluster.fence_told),
            ",".join(map(str, waiting)) or "none",
        )

    # ---- roles ---------------------------------------------------------------------------------

    def is_primary(self) -> bool:
        return self.cluster is not None and self.election is not None and self.election.is_primary()

    def primary_address(self) -> tuple[int, str]:
        if self.is_primary():
            return self.cfg.node_id, self.address
        return self.election.primary_address() if self.election is not None else (0, "")

    def require_primary(self) -> None:
        if not self.is_primary():
            raise NotPrimaryError(self.primary_address()[1])

    def cluster_or_raise(self) -> Cluster:
        cluster = self.cluster
        if cluster is None or not self.is_primary():
            raise NotPrimaryError(self.primary_address()[1])
        return cluster

    def admin_or_raise(self) -> Admin:
        self.cluster_or_raise()
        assert self.admin is not None
        return self.admin

    def role_event(self) -> asyncio.Event:
        """An event set at the next change of role (primary or standby). Take it before looking
        at the role, so that a change in between is not missed."""
        return self._role_event

    def _set_role(self, cluster: Cluster | None, *, stopping: bool = False) -> None:
        if self.cluster is not None and cluster is None:
            # a lost lease is worth a warning; a stop asked for is not
            log.log(
                logging.INFO if stopping else logging.WARNING,
                "stepping down to standby node_id=%d",
                self.cfg.node_id,
            )
        self.cluster = cluster
        self.admin = Admin(cluster) if cluster is not None else None
        if self._metrics is not None:
            self._metrics.is_primary.set(1 if cluster is not None else 0)
        # wake every waiter, then arm a fresh event for the next change
        self._role_event.set()
        self._role_event = asyncio.Event()

    async def _election_loop(self) -> None:
        assert self.election is not None
        while True:
            try:
                primary, newly = await self.election.tick()
                if primary and (newly or self.cluster is None):
                    await self._become_primary()
                elif not primary and self.cluster is not None:
                    await self._step_down()
            except asyncio.CancelledError:
                raise
            except FS3Error as e:
                log.warning("election round failed node_id=%d error=%s", self.cfg.node_id, e)
                if self.cluster is not None and not self.election.is_primary():
                    await self._step_down()
            except Exception:
                log.exception("election round failed node_id=%d", self.cfg.node_id)
            await asyncio.sleep(self._next_election_round())

    def _next_election_round(self) -> float:
        """Seconds until the next election round. The holder renews well within its trust window;
        a standby looks every tenth of a lease and also right when the lease it saw runs out, so
        that a dead primary is replaced within one lease interval of its last renewal."""
        lease = self.cfg.lease_interval_s
        if self.cluster is not None:
            return lease / 4
        delay = min(lease / 10, 1.0)
        if self.election is not None:
            until = self.election.takeover_in()
            if until >= 0:
                delay = min(delay, until + 0.005)
        return delay

    async def _become_primary(self) -> None:
        await self._step_down()
        cluster = Cluster(
            self.db,
            self.election,
            Timing(
                heartbeat_timeout_s=self.cfg.heartbeat_timeout_s,
                client_session_timeout_s=self.cfg.client_session_timeout_s,
            ),
        )
        await cluster.load()
        self._set_role(cluster)
        self._updater = asyncio.create_task(self._update_loop(cluster), name="mgmtd-chain-updater")

    async def _stop_updater(self) -> None:
        if self._updater is not None:
            updater, self._updater = self._updater, None
            with contextlib.suppress(Exception):
                await cancel_and_wait(updater)

    async def _step_down(self) -> None:
        await self._stop_updater()
        if self.cluster is not None:
            self._set_role(None)

    async def _update_loop(self, cluster: Cluster) -> None:
        """The primary's periodic work, run at once after a change and at least every interval.

        It lives exactly as long as this primary role: :meth:`_step_down` cancels it. While the
        lease is not trusted for a moment (a renewal late past the trust margin on a busy host,
        then renewed with the same epoch, so that the election loop sees nothing new) it skips
        rounds instead of ending; ending there left a primary that never updated a chain again.
        """
        interval = self.cfg.chain_update_interval_s
        while True:
            # not wait_for: on 3.11 it can drop _step_down's cancel (see fs3.background)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await cluster.changed.wait()
            cluster.changed.clear()
            if not self.is_primary():
                continue
            try:
                changed = await cluster.tick()
            except asyncio.CancelledError:
                raise
            except FS3Error as e:
                # MGMTD_NOT_PRIMARY (fenced): the election loop either takes the lease again with a
                # new epoch or steps down; both replace this loop.
                log.warning("chain update failed error=%s", e)
                continue
            except Exception:
                log.exception("chain update failed")
                continue
            if self._metrics is not None:
                self._metrics.chain_updates.inc(len(changed))
                self._metrics.routing_version.set(cluster.rec.routing_version)
                counts: dict[int, int] = {}
                for ch in cluster.rec.chains.values():
                    for t in ch.targets:
                        counts[t.public_state] = counts.get(t.public_state, 0) + 1
                for value in (1, 2, 3, 4, 5):
                    name = common_pb2.PublicTargetState.Name(value)
                    self._metrics.targets.labels(state=name).set(counts.get(value, 0))

    # ---- helpers for the servicer --------------------------------------------------------------

    async def verify_token(self, token: str) -> mgmtd_pb2.User:
        now = time.time()

        async def fn(tr: Transaction) -> mgmtd_pb2.User:
            return await users.verify_token(tr.snapshot, token, now)

        return await self.db.run(fn, read_only=True)

    def metrics_heartbeat(self) -> None:
        if self._metrics is not None:
            self._metrics.heartbeats.inc()


class _Unparsable:
    """A request body protobuf could not parse (see _add_checked)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _add_checked(add: Any, servicer: object, server: Any) -> None:
    """``add(servicer, server)`` (a generated ``add_*Servicer_to_server``), with request bodies
    that protobuf cannot parse answered INVALID_ARGUMENT instead of handing grpcio the DecodeError:
    it logged a 7-line traceback at ERROR for each one, before any credential is checked (an
    input review flooded mgmtd's log at ~1 MB/s without a credential)."""
    captured: dict[str, Any] = {}

    class _Capture:
        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
            captured[service] = handlers

    add(servicer, _Capture())
    for service, handlers in captured.items():
        checked = {name: _checked_handler(h) for name, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, checked),))
        server.add_registered_method_handlers(service, checked)


def _checked_handler(handler: Any) -> Any:
    if handler.request_streaming or handler.response_streaming or handler.unary_unary is None:
        return handler
    parse, serve = handler.request_deserializer, handler.unary_unary

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as e:
            return _Unparsable(e)

    async def unary_unary(request: Any, context: Any) -> Any:
        if isinstance(request, _Unparsable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unparsable request: {request.error}")
        return await serve(request, context)

    return grpc.unary_unary_rpc_method_handler(
        unary_unary, request_deserializer=deserialize, response_serializer=handler.response_serializer
    )
