"""The routing cache every fs3 process keeps: the cluster's nodes, targets, chains and chain tables
as mgmtd last published them.

:class:`Routing` is an immutable, indexed view of one routing snapshot. :class:`RoutingCache` keeps
the newest one, polling mgmtd with the version it knows (mgmtd answers with nothing when that is
current) every ``refresh_interval_s``, and at once when someone calls :meth:`RoutingCache.refresh_soon`
-- what the data path does after a routing error such as a chain-version mismatch::

    cache = RoutingCache(MgmtdClient(addresses, cluster_secret=secret), refresh_interval_s=2.0)
    await cache.start()                  # first snapshot fetched before this returns
    chain = cache.routing.chain(7)
    head = cache.routing.node_of_target(chain.head.target_id)
    ...
    cache.refresh_soon()                 # after STORAGE_CHAIN_VERSION_MISMATCH
    await cache.wait_for(lambda r: r.chain(7).version > old_version, timeout_s=5)
    await cache.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fs3.background import Periodic
from fs3.client.mgmtd_client import MgmtdClient, MgmtdUnreachable
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2, mgmtd_pb2

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChainView:
    """One chain: its version and its targets in order, head first, with public states."""

    chain_id: int
    version: int
    targets: tuple[mgmtd_pb2.ChainTarget, ...]
    # SERVING targets on their way out (mgmtd_pb2.DrainingTarget): written to, not read from
    draining: frozenset[int] = frozenset()

    @property
    def head(self) -> mgmtd_pb2.ChainTarget | None:
        """The head if it is SERVING (writes go there); None when the chain cannot take writes."""
        if self.targets and self.targets[0].public_state == common_pb2.SERVING:
            return self.targets[0]
        return None

    @property
    def serving(self) -> list[int]:
        """SERVING target ids, in chain order: the last one is the tail, which says what the
        chain has committed (CRAQ)."""
        return [t.target_id for t in self.targets if t.public_state == common_pb2.SERVING]

    @property
    def readable(self) -> list[int]:
        """Target ids that may serve reads, in chain order: SERVING and not draining."""
        return [t for t in self.serving if t not in self.draining]

    def successor(self, target_id: int) -> mgmtd_pb2.ChainTarget | None:
        """The next target a write is forwarded to (SERVING or SYNCING), or None at the tail."""
        ids = [t.target_id for t in self.targets]
        if target_id not in ids:
            return None
        for t in self.targets[ids.index(target_id) + 1 :]:
            if t.public_state in (common_pb2.SERVING, common_pb2.SYNCING):
                return t
        return None

    def state_of(self, target_id: int) -> int:
        for t in self.targets:
            if t.target_id == target_id:
                return t.public_state
        return common_pb2.PUBLIC_STATE_INVALID


class Routing:
    """An immutable, indexed view of one RoutingInfo snapshot."""

    def __init__(self, info: mgmtd_pb2.RoutingInfo) -> None:
        self.info = info
        self.version: int = info.version
        self.bootstrapping: bool = info.bootstrapping
        self.nodes: dict[int, mgmtd_pb2.NodeInfo] = {n.node_id: n for n in info.nodes}
        self.targets: dict[int, mgmtd_pb2.TargetInfo] = {t.target_id: t for t in info.targets}
        self.chains: dict[int, ChainView] = {
            c.chain_id: ChainView(
                c.chain_id, c.version, tuple(c.targets), frozenset(d.target_id for d in c.draining)
            )
            for c in info.chains
        }
        self.chain_tables: dict[tuple[int, int], mgmtd_pb2.ChainTable] = {
            (t.table_id, t.version): t for t in info.chain_tables
        }
        # Derived per read on the client's hot path, and fixed for a snapshot: computed once each.
        self.addresses: dict[tuple[int, bool], tuple[str, int]] = {}  # see storage_client.node_address
        self._readable = {c.chain_id: c.readable for c in self.chains.values()}
        # Chains with a target low on space (new files' layouts avoid them, see fs3.meta.layout).
        low = {t.target_id for t in info.targets if t.low_space}
        self.low_space_chains: frozenset[int] = frozenset(
            c.chain_id for c in self.chains.values() if low and any(t.target_id in low for t in c.targets)
        )

    @classmethod
    def empty(cls) -> Routing:
        return cls(mgmtd_pb2.RoutingInfo())

    def chain(self, chain_id: int) -> ChainView:
        try:
            return self.chains[chain_id]
        except KeyError:
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_CHAIN, f"chain {chain_id} is not in routing info"
            ) from None

    def readable(self, chain_id: int) -> list[int]:
        """:attr:`ChainView.readable` of a chain (computed once per snapshot; do not modify it)."""
        try:
            return self._readable[chain_id]
        except KeyError:
            return self.chain(chain_id).readable

    def target(self, target_id: int) -> mgmtd_pb2.TargetInfo:
        try:
            return self.targets[target_id]
        except KeyError:
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_TARGET, f"target {target_id} is not in routing info"
            ) from None

    def node(self, node_id: int) -> mgmtd_pb2.NodeInfo:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise FS3Error(StatusCode.MGMTD_UNKNOWN_NODE, f"node {node_id} is not in routing info") from None

    def node_of_target(self, target_id: int) -> mgmtd_pb2.NodeInfo:
        return self.node(self.target(target_id).node_id)

    def chain_table(self, table_id: int, version: int = 0) -> mgmtd_pb2.ChainTable:
        """A chain table by id and version (0 = the newest)."""
        if version == 0:
            versions = [v for (tid, v) in self.chain_tables if tid == table_id]
            version = max(versions, default=0)
        try:
            return self.chain_tables[(table_id, version)]
        except KeyError:
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_CHAIN_TABLE, f"chain table {table_id} version {version} is not known"
            ) from None

    def nodes_of_type(self, node_type: int, *, active_only: bool = True) -> list[mgmtd_pb2.NodeInfo]:
        return [
            n
            for n in self.nodes.values()
            if n.type == node_type and (not active_only or n.status == mgmtd_pb2.NODE_STATUS_ACTIVE)
        ]

    def targets_of_node(self, node_id: int) -> list[mgmtd_pb2.TargetInfo]:
        return [t for t in self.targets.values() if t.node_id == node_id]


Listener = Callable[[Routing], None]


#: how often a routing refresh that keeps failing the same way is warned of
REFRESH_WARN_EVERY_S = 60.0


class RoutingCache:
    """The newest routing info, refreshed in the background and early on demand."""

    def __init__(
        self,
        client: MgmtdClient,
        *,
        refresh_interval_s: float = 5.0,
        min_refresh_gap_s: float = 0.05,
    ) -> None:
        self.client = client
        self.refresh_interval_s = refresh_interval_s
        self.min_refresh_gap_s = min_refresh_gap_s
        self.routing: Routing = Routing.empty()
        self.last_refresh: float = 0.0  # monotonic time of the last successful poll
        # refreshes failing the same way since the last warning, and when that was (monotonic)
        self._failing: tuple[StatusCode, float, int] | None = None
        self._updated = asyncio.Condition()
        self._listeners: list[Listener] = []
        self._loop = Periodic(
            "fs3-routing-refresh",
            self.refresh,
            refresh_interval_s,
            on_error=self._refresh_failed,
            # an early refresh storm (many failing requests at once) costs at most one poll per gap
            min_gap_s=min_refresh_gap_s,
        )

    @property
    def version(self) -> int:
        return self.routing.version

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(routing)`` (in the event loop) whenever a new version arrives."""
        self._listeners.append(fn)

    async def start(self, *, first_timeout_s: float | None = None) -> None:
        """Fetch the first snapshot, then keep refreshing in the background."""
        await self.refresh(timeout_s=first_timeout_s)
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def refresh_soon(self) -> None:
        """Ask for a refresh now (after a routing error); cheap to call often."""
        self._loop.wake()

    async def refresh(self, *, timeout_s: float | None = None) -> Routing:
        """Poll mgmtd once and return the newest routing."""
        reply = await self.client.call(
            "GetRoutingInfo",
            mgmtd_pb2.GetRoutingInfoRequest(known_version=self.routing.version),
            timeout_s=timeout_s,
        )
        self.last_refresh = time.monotonic()
        if self._failing is not None:
            log.info("routing refresh works again after %d more failures", self._failing[2])
            self._failing = None
        if reply.HasField("info") and reply.info.version > self.routing.version:
            self._install(Routing(reply.info))
        return self.routing

    def _install(self, routing: Routing) -> None:
        old = self.routing.version
        self.routing = routing
        log.debug("routing updated version=%d->%d", old, routing.version)
        for fn in list(self._listeners):
            try:
                fn(routing)
            except Exception:
                log.exception("routing listener failed")
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._updated:
            self._updated.notify_all()

    async def wait_for(self, predicate: Callable[[Routing], bool], timeout_s: float) -> Routing:
        """Wait until the routing satisfies ``predicate`` (refreshing early); raises
        FS3Error(DEADLINE_EXCEEDED) when it does not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.routing):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FS3Error(
                    StatusCode.DEADLINE_EXCEEDED, f"routing did not reach the state in {timeout_s}s"
                )
            self.refresh_soon()
            async with self._updated:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, self.refresh_interval_s)):
                        await self._updated.wait()
        return self.routing

    def _refresh_failed(self, e: Exception) -> None:
        if isinstance(e, MgmtdUnreachable):
            log.debug("routing refresh failed error=%s", e)  # the mgmtd client says so
        elif isinstance(e, FS3Error):
            # a failure that goes on (a revoked token: every poll, every 2 s) is said once a minute
            now = time.monotonic()
            failing = self._failing
            if failing is None or failing[0] != e.code or now - failing[1] >= REFRESH_WARN_EVERY_S:
                more = ""
                if failing is not None and failing[2]:
                    more = (
                        f" ({failing[2]} more failures since the last warning)"
                        if failing[0] == e.code
                        else f" (after {failing[2]} more {failing[0].name} failures)"
                    )
                log.warning("routing refresh failed error=%s%s", e, more)
                self._failing = (e.code, now, 0)
            else:
                self._failing = (failing[0], failing[1], failing[2] + 1)
        else:
            log.exception("routing refresh failed")
