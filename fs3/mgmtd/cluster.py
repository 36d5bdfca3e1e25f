"""The primary's view of the cluster: stored records mirrored in memory, plus runtime state.

Only the primary has a :class:`Cluster`. It is built by :meth:`Cluster.load` when this mgmtd takes
the lease and discarded when it loses it. Stored records (nodes, targets, chains, chain tables,
configs) live in the KV store and are mirrored here; runtime state (heartbeat times, targets' local
states and usage, client sessions) lives here only, as in 3FS, and is rebuilt from heartbeats after
a failover.

Every write goes through :meth:`Cluster.write`: one KV transaction that re-checks the lease
(fencing), writes the new records and, when routing changed, the new routing version; memory is
updated only after that transaction commits. Writes are serialized by one lock, so memory equals
the store whenever the lock is free.

Failure detection judges silence only over time this primary was listening. The primary notes each
time it acts (accepts a heartbeat or a session extension, runs a round of periodic work, lists
sessions); a gap between two such moments means its event loop stalled, the process was paused, or
the lease was not trusted for a while (everything was refused). Nobody could have reached it
meanwhile, so every node gets a fresh heartbeat timeout from the end of the gap, and the client
session list counts as partial again.

The stop fence: a primary stopping cleanly (:meth:`Cluster.begin_fence`) stores a wall time T (and
the fence's length) and answers heartbeats with the seconds left until T, which the storage daemons
add to their leases (``storage.target_map.Lease``): they serve until T even if no mgmtd answers
meanwhile. So no node may be taken out of a chain before T, by this primary or any later one:
:meth:`Cluster.load` reads T (:attr:`Cluster.fence_until`, at most the fence's length from then:
a clock far ahead cannot fence for longer), silence counts only from T on, targets unheard of stay
unjudged until a heartbeat timeout after it (bootstrapping: their chains change not at all
meanwhile; nodes not heard from count as serving, :meth:`Cluster.may_serve`, so that an admin's
take-out drains them), and a drain ends no sooner than a heartbeat timeout after T. The price: a node
that dies during the fence stays in its chains until a heartbeat timeout after T. Like the
election, this needs the mgmtd hosts' clocks to agree: a next primary whose clock is ahead of the
stopping one's by more than 1.2 heartbeat timeouts could fail a node still serving on its fence.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fs3.errors import FS3Error, StatusCode
from fs3.kv.base import Database, Transaction
from fs3.mgmtd import chain_state, schema
from fs3.mgmtd.chain_state import ChainTarget, LocalState, PublicState, next_chain
from fs3.mgmtd.election import Election
from fs3.proto import common_pb2, mgmtd_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")

Apply = Callable[[], None]
# A write: given the transaction, stage the writes and return what to apply to memory afterwards.
WriteFn = Callable[[Transaction], Awaitable[Apply | None]]

_NODE_TYPES = {common_pb2.NODE_MGMTD, common_pb2.NODE_META, common_pb2.NODE_STORAGE}
MAX_ENDPOINTS = 16
MAX_TARGETS_PER_NODE = 4096
_LOCAL_STATES = {LocalState.UPTODATE, LocalState.ONLINE, LocalState.OFFLINE}
# A gap longer than this fraction of a timeout between two moments the primary acted means it was not
# listening (stalled, paused, or not trusting its lease): judge silence afresh from then on. Periodic
# work runs every chain_update_interval_s (1 s by default) and live nodes heartbeat every few seconds,
# well inside it.
RESUME_GAP_FRACTION = 0.5
# Client sessions a user (a non-root token, not a cluster member) may hold at once: each is kept in
# the primary's memory (up to ~1.5 KB) until it ends or expires, and a user could start them
# without bound. Many thousands of native clients of one job fit; a flood does not.
MAX_SESSIONS_PER_USER = 16384


@dataclass(slots=True)
class Timing:
    """The intervals a :class:`Cluster` works with (from MgmtdConfig)."""

    heartbeat_timeout_s: float = 10.0
    client_session_timeout_s: float = 300.0


@dataclass(slots=True)
class NodeRuntime:
    status: int = mgmtd_pb2.NODE_STATUS_REGISTERED
    last_heartbeat: float = 0.0  # monotonic; the failure timeout counts from it (see detect_failures)
    heard_at: float = 0.0  # monotonic, of the last heartbeat accepted (0: none since this primary began)
    incarnation: int = 0
    sequence: int = 0
    pid: int = 0
    hostname: str = ""
    duplicate_logged: tuple[str, int] | None = None  # the other process named in the last warning


@dataclass(slots=True)
class TargetRuntime:
    local_state: LocalState | None = None  # None: not heard of since this primary took over
    used_bytes: int = 0
    low_space: bool = False
    chain_version: int = 0  # of its chain, as its daemon last said it acts on


@dataclass(slots=True)
class Records:
    """The stored records, decoded."""

    nodes: dict[int, mgmtd_pb2.NodeInfo] = field(default_factory=dict)
    targets: dict[int, mgmtd_pb2.TargetInfo] = field(default_factory=dict)
    chains: dict[int, mgmtd_pb2.ChainInfo] = field(default_factory=dict)
    tables: dict[tuple[int, int], mgmtd_pb2.ChainTable] = field(default_factory=dict)
    configs: dict[int, mgmtd_pb2.ConfigInfo] = field(default_factory=dict)  # newest per node type
    routing_version: int = 0
    initialized: bool = False
    file_system: mgmtd_pb2.FileSystemRecord | None = None  # see claim_file_system
    # wall time before which no node is failed (a clean stop's promise), and that fence's length
    fence_at: float = 0.0
    fence_s: float = 0.0


def serialized(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Run a method of a Cluster (or of an object with a ``c`` Cluster) under the cluster lock:
    the checks it makes against the records in memory still hold when its write commits."""

    @functools.wraps(fn)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        cluster = self if isinstance(self, Cluster) else self.c
        async with cluster.lock:
            return await fn(self, *args, **kwargs)

    return wrapper


def chain_targets(chain: mgmtd_pb2.ChainInfo) -> list[ChainTarget]:
    return [ChainTarget(t.target_id, PublicState(t.public_state)) for t in chain.targets]


def serving_staying(chain: mgmtd_pb2.ChainInfo, leaving: Iterable[int] = ()) -> list[int]:
    """The chain's SERVING targets that stay (in chain order): not draining, which are on their
    way out and leave no one to read from, and not in ``leaving``."""
    going = {d.target_id for d in chain.draining}.union(leaving)
    return [
        t.target_id
        for t in chain.targets
        if t.public_state == common_pb2.SERVING and t.target_id not in going
    ]


def _holding(chain: mgmtd_pb2.ChainInfo) -> set[int]:
    """The SERVING targets that hold ``chain``'s data for good: those that stay; a draining target
    (its node disabled a moment ago) counts for none while another stays (two disables at once both
    passed, the chain left UNAVAILABLE), but when none does, the draining ones are the chain's last
    servers, whose drain never ends (see Cluster._take_out_drained): they count."""
    return set(serving_staying(chain)) or {
        t.target_id for t in chain.targets if t.public_state == common_pb2.SERVING
    }


def draining_chain(
    chain: mgmtd_pb2.ChainInfo, target_ids: Iterable[int], *, remove: bool = False, force: bool = False
) -> mgmtd_pb2.ChainInfo:
    """``chain``'s next version, with ``target_ids`` draining (those not draining already; see
    mgmtd_pb2.DrainingTarget)."""
    c = mgmtd_pb2.ChainInfo()
    c.CopyFrom(chain)
    c.version = chain.version + 1
    already = {d.target_id for d in chain.draining}
    for tid in target_ids:
        if tid not in already:
            c.draining.add(target_id=tid, remove=remove, since_version=c.version, force=force)
    return c


def make_chain(
    chain_id: int,
    version: int,
    targets: Iterable[ChainTarget],
    preferred: Iterable[int] = (),
    draining: Iterable[mgmtd_pb2.DrainingTarget] = (),
) -> mgmtd_pb2.ChainInfo:
    """A chain record. Of ``draining`` (and ``preferred``) only the targets still SERVING (still
    in the chain) are kept."""
    targets = list(targets)
    serving = {t.target_id for t in targets if t.state == PublicState.SERVING}
    members = {t.target_id for t in targets}
    return mgmtd_pb2.ChainInfo(
        chain_id=chain_id,
        version=version,
        targets=[mgmtd_pb2.ChainTarget(target_id=t.target_id, public_state=int(t.state)) for t in targets],
        preferred_order=[t for t in preferred if t in members],
        draining=[d for d in draining if d.target_id in serving],
    )


async def load_records(tr: Transaction) -> Records:
    """Every mgmtd record in the store, read in one transaction."""
    r = Records()
    for kv in await tr.get_prefix(schema.NODE):
        n = mgmtd_pb2.NodeInfo.FromString(kv.value)
        r.nodes[n.node_id] = n
    for kv in await tr.get_prefix(schema.TGIF):
        t = mgmtd_pb2.TargetInfo.FromString(kv.value)
        r.targets[t.target_id] = t
    for kv in await tr.get_prefix(schema.CHIF):
        c = mgmtd_pb2.ChainInfo.FromString(kv.value)
        r.chains[c.chain_id] = c
    for kv in await tr.get_prefix(schema.CHIT):
        t = mgmtd_pb2.ChainTable.FromString(kv.value)
        r.tables[(t.table_id, t.version)] = t
    for node_type in common_pb2.NodeType.values():
        # only the newest of each type (the key holds ~version: newest first), not every version
        # ever set (up to 64 KiB each, and nothing deletes old ones: `fs3 admin config get` reads them)
        for kv in await tr.get_prefix(schema.config_prefix(node_type), limit=1):
            r.configs[node_type] = mgmtd_pb2.ConfigInfo.FromString(kv.value)
    r.routing_version = schema.decode_u64(await tr.get(schema.ROUTING_VERSION_KEY))
    r.initialized = await tr.get(schema.CLUSTER_KEY) is not None
    if (raw := await tr.get(schema.FILE_SYSTEM_KEY)) is not None:
        r.file_system = mgmtd_pb2.FileSystemRecord.FromString(raw)
    r.fence_at, r.fence_s = schema.decode_fence(await tr.get(schema.FENCE_KEY))
    return r


class Cluster:
    """The primary's state and every operation that reads or changes it."""

    def __init__(
        self,
        db: Database,
        election: Election,
        timing: Timing,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.election = election
        self.timing = timing
        self._mono = monotonic
        self.wall = wall
        self.rec = Records()
        self.node_rt: dict[int, NodeRuntime] = {}
        self.target_rt: dict[int, TargetRuntime] = {}
        self.sessions: dict[str, mgmtd_pb2.ClientSession] = {}
        # when each session was last extended, on the monotonic clock: expiry counts on this, not
        # on ClientSession.extended_at (wall time, for people), which a clock step would move
        self._extended_mono: dict[str, float] = {}
        # sessions a user holds (see MAX_SESSIONS_PER_USER): client id -> uid, and uid -> how many
        self._session_user: dict[str, int] = {}
        self._user_sessions: dict[int, int] = {}
        self.target_chain: dict[int, int] = {}  # target -> its chain
        self.node_targets: dict[int, list[int]] = {}  # node -> its targets
        self.bootstrapping_until = 0.0
        self._was_bootstrapping = True
        # Monotonic times: silence before listening_since does not count against a node; before
        # sessions_complete_at clients alive before this primary listened may not have extended yet.
        self.listening_since = 0.0
        self.sessions_complete_at = 0.0
        # Monotonic: no node is failed for silence before this (a stop fence, see the module
        # docstring); while ``fencing``, heartbeat replies carry it, and ``fence_told`` collects
        # the nodes answered so.
        self.fence_until = 0.0
        self.fencing = False
        self.fence_told: set[int] = set()
        self.fence_heard = asyncio.Event()  # set when a node is told
        self._last_listening: float | None = None
        self.lock = asyncio.Lock()  # held by every operation that writes (see serialized)
        self._snapshot: mgmtd_pb2.RoutingInfo | None = None
        self._routing_pending = False
        # routing writes under way: a heartbeat answered meanwhile names the version they publish
        self._routing_writes = 0
        self.changed = asyncio.Event()  # set when the chain updater should run now
        # (chain id, target id) -> monotonic time this primary first saw it draining
        self.draining_since: dict[tuple[int, int], float] = {}
        # (node id, target id) reported by a node that does not own the target (logged once)
        self._foreign_reported: set[tuple[int, int]] = set()

    # ---- loading and writing -------------------------------------------------------------------

    async def load(self) -> None:
        """Read every record and publish a new routing version (run once after taking the lease)."""

        async def txn(tr: Transaction) -> Records:
            await self.election.check(tr)
            rec = await load_records(tr)
            rec.routing_version += 1
            tr.set(schema.ROUTING_VERSION_KEY, schema.encode_u64(rec.routing_version))
            return rec

        self.rec = await self._run(txn)
        now = self._mono()
        fence_left = self.rec.fence_at - self.wall()
        if fence_left > self.rec.fence_s:  # it cannot have more left than it had when it was set
            log.warning(
                "the stored stop fence ends %.1f s from now by this host's clock, more than its "
                "length %.1f s: the clocks of the mgmtd hosts disagree; honouring %.1f s",
                fence_left,
                self.rec.fence_s,
                self.rec.fence_s,
            )
            fence_left = self.rec.fence_s
        if fence_left > 0:
            self.fence_until = now + fence_left
            log.info(
                "honouring the stop fence of the previous primary: no node is failed for %.1f s, "
                "as storage nodes may serve on their extended leases until then",
                fence_left,
            )
        # Give every node one heartbeat timeout to reach the new primary before judging it.
        self.node_rt = {
            nid: NodeRuntime(
                status=mgmtd_pb2.NODE_STATUS_DISABLED if n.disabled else mgmtd_pb2.NODE_STATUS_REGISTERED,
                last_heartbeat=now,
            )
            for nid, n in self.rec.nodes.items()
        }
        # a draining target waits (at most) a heartbeat timeout from now: see _drained
        self.draining_since = {
            (c.chain_id, d.target_id): now for c in self.rec.chains.values() for d in c.draining
        }
        draining = {tid for _, tid in self.draining_since}
        self.target_rt = {tid: TargetRuntime() for tid in self.rec.targets}
        for tid, t in self.rec.targets.items():
            node = self.rec.nodes.get(t.node_id)
            if node is not None and node.disabled:
                # A disabled node's targets are OFFLINE; one still draining only once drained, as
                # set_node_enabled left it (OFFLINE now would end the drain at once). Until then
                # it counts as up to date, as there: nothing of a disabled node is heard, and an
                # unknown state would hold its chain back until bootstrapping ends.
                self.target_rt[tid].local_state = (
                    LocalState.UPTODATE if tid in draining else LocalState.OFFLINE
                )
        self.reindex()
        self.bootstrapping_until = max(now, self.fence_until) + self.timing.heartbeat_timeout_s
        self.listening_since = now
        self.sessions_complete_at = now + self.timing.client_session_timeout_s
        self._last_listening = now
        self._snapshot = None
        log.info(
            "cluster state loaded nodes=%d targets=%d chains=%d tables=%d routing_version=%d",
            len(self.rec.nodes),
            len(self.rec.targets),
            len(self.rec.chains),
            len(self.rec.tables),
            self.rec.routing_version,
        )

    async def _run(self, fn: Callable[[Transaction], Awaitable]):
        try:
            return await self.db.run(fn)
        except FS3Error as e:
            if e.code == StatusCode.MGMTD_LEASE_LOST:
                self.election.drop()
                raise FS3Error(StatusCode.MGMTD_NOT_PRIMARY, "this mgmtd lost its lease") from e
            raise

    async def write(self, fn: WriteFn, *, routing: bool = True) -> None:
        """Run ``fn`` in one fenced transaction; when ``routing``, publish a new routing version.

        The caller holds :attr:`lock` (see :func:`serialized`) from the moment it reads the
        records it decides on until this returns, so no other write slips in between."""
        assert self.lock.locked(), "Cluster.write outside the cluster lock"
        new_version = self.rec.routing_version + 1

        async def txn(tr: Transaction) -> Apply | None:
            await self.election.check(tr)
            apply = await fn(tr)
            if routing:
                tr.set(schema.ROUTING_VERSION_KEY, schema.encode_u64(new_version))
            return apply

        if routing:
            self._routing_writes += 1
        try:
            apply = await self._run(txn)
        finally:
            if routing:
                self._routing_writes -= 1
        if apply is not None:
            apply()
        if routing:
            self.rec.routing_version = new_version
            self._routing_pending = False
            self._snapshot = None

    def reindex(self) -> None:
        """Rebuild the lookup tables after chains or targets changed."""
        self.target_chain = {t.target_id: c.chain_id for c in self.rec.chains.values() for t in c.targets}
        self.node_targets = {}
        for tid, t in sorted(self.rec.targets.items()):
            self.node_targets.setdefault(t.node_id, []).append(tid)

    def _runtime_changed(self) -> None:
        """Something in routing info changed in memory only: publish a version soon."""
        self._routing_pending = True
        self._snapshot = None
        self.changed.set()

    @property
    def bootstrapping(self) -> bool:
        return self._mono() < self.bootstrapping_until

    @property
    def sessions_heard_s(self) -> float:
        """How long this primary has listened for session extensions: since it took over, or since
        it resumed after a gap (when :attr:`sessions_complete_at` was last pushed out)."""
        return max(0.0, self._mono() - (self.sessions_complete_at - self.timing.client_session_timeout_s))

    @property
    def sessions_partial(self) -> bool:
        """Whether :attr:`sessions` may still miss live clients: this primary has not listened for
        a full client session timeout yet (since it took over, or since it resumed after a gap)."""
        return self._mono() < self.sessions_complete_at

    # ---- routing info --------------------------------------------------------------------------

    def node_info(self, node: mgmtd_pb2.NodeInfo, *, listing: bool) -> mgmtd_pb2.NodeInfo:
        out = mgmtd_pb2.NodeInfo()
        out.CopyFrom(node)
        rt = self.node_rt.get(node.node_id) or NodeRuntime()
        out.status = rt.status
        if listing and rt.heard_at:
            # of the last heartbeat accepted, whatever the status: a disabled node's are refused,
            # and its age grows (last_heartbeat is not it: enabling a node or a new primary restarts
            # its failure timeout there)
            out.pid = rt.pid
            out.last_heartbeat_age_s = max(0.0, self._mono() - rt.heard_at)
        return out

    def target_info(self, target: mgmtd_pb2.TargetInfo, *, listing: bool) -> mgmtd_pb2.TargetInfo:
        out = mgmtd_pb2.TargetInfo(
            target_id=target.target_id, node_id=target.node_id, disk_index=target.disk_index
        )
        chain_id = self.target_chain.get(target.target_id, 0)
        out.chain_id = chain_id
        if chain_id:
            for ct in self.rec.chains[chain_id].targets:
                if ct.target_id == target.target_id:
                    out.public_state = ct.public_state
        rt = self.target_rt.get(target.target_id)
        if rt is not None and rt.local_state is not None:
            out.local_state = int(rt.local_state)
        if rt is not None:
            # In routing info too: meta steers new files away from chains low on space.
            out.low_space = rt.low_space
            if listing:
                out.used_bytes = rt.used_bytes
        return out

    def routing_info(self) -> mgmtd_pb2.RoutingInfo:
        """The current snapshot (rebuilt only after a change)."""
        if self._snapshot is None or self._snapshot.bootstrapping != self.bootstrapping:
            info = mgmtd_pb2.RoutingInfo(version=self.rec.routing_version, bootstrapping=self.bootstrapping)
            info.nodes.extend(self.node_info(n, listing=False) for _, n in sorted(self.rec.nodes.items()))
            info.targets.extend(
                self.target_info(t, listing=False) for _, t in sorted(self.rec.targets.items())
            )
            info.chains.extend(c for _, c in sorted(self.rec.chains.items()))
            info.chain_tables.extend(t for _, t in sorted(self.rec.tables.items()))
            self._snapshot = info
        return self._snapshot

    # ---- nodes and heartbeats ------------------------------------------------------------------

    @staticmethod
    def _check_endpoints(endpoints: Sequence[common_pb2.Endpoint]) -> None:
        if len(endpoints) > MAX_ENDPOINTS:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"more than {MAX_ENDPOINTS} endpoints")
        for ep in endpoints:
            if not ep.host or len(ep.host) > 255 or not 0 < ep.port < 65536:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad endpoint {ep.host!r}:{ep.port}")
            if ep.transport not in ("", "tcp", "rdma"):
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad endpoint transport {ep.transport!r}")

    @serialized
    async def register_node(self, req: mgmtd_pb2.RegisterNodeRequest) -> None:
        if req.node_id == 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "node id 0 is not valid")
        if req.type not in _NODE_TYPES:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"node type {req.type} cannot register")
        self._check_endpoints(req.endpoints)
        if len(req.hostname) > 255:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "hostname longer than 255 bytes")
        old = self.rec.nodes.get(req.node_id)
        if old is not None and old.type != req.type:
            raise FS3Error(
                StatusCode.ALREADY_EXISTS,
                f"node {req.node_id} is registered as {common_pb2.NodeType.Name(old.type)}",
            )
        node = mgmtd_pb2.NodeInfo()
        if old is not None:
            node.CopyFrom(old)
        node.node_id, node.type = req.node_id, req.type
        if req.endpoints:
            del node.endpoints[:]
            node.endpoints.extend(req.endpoints)
        if req.hostname:
            node.hostname = req.hostname
        if old is not None and node == old:
            return
        await self._put_node(node)
        log.info("node registered node_id=%d type=%s", node.node_id, common_pb2.NodeType.Name(node.type))

    @serialized
    async def claim_file_system(self, req: mgmtd_pb2.ClaimFileSystemRequest) -> mgmtd_pb2.FileSystemRecord:
        """Check that a meta node's store holds the cluster's file system, before it serves; the
        first store to be told about is the cluster's from then on.

        Meta nodes share one store (FoundationDB, or lmdb on one host), so they all hold the same
        file system id. One that holds another is on a store of its own: most likely an empty one
        made on the bare mount point of a disk that did not mount, or at a mistyped kv.path. It
        would serve clients an empty namespace, and the chunks of the files made there would have
        the ids of the real file system's (inode ids restart), overwriting its data."""
        if not req.file_system_id or len(req.file_system_id) > 64 or len(req.store) > 4096:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "a file system id of 1 to 64 characters is needed")
        recorded = self.rec.file_system
        if recorded is not None:
            if recorded.file_system_id == req.file_system_id:
                return recorded
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION,
                f"meta node {req.node_id}'s store ({req.store or 'unnamed'}) holds file system "
                f"{req.file_system_id}, not this cluster's, {recorded.file_system_id} (first served by "
                f"meta node {recorded.node_id} from {recorded.store or 'an unnamed store'}): is kv.path "
                "right, and its disk mounted? Every meta node of a cluster serves one store "
                "(FoundationDB, or lmdb on one host)",
            )
        record = mgmtd_pb2.FileSystemRecord(
            file_system_id=req.file_system_id, node_id=req.node_id, store=req.store, claimed_at=self.wall()
        )

        async def fn(tr: Transaction) -> Apply:
            tr.set(schema.FILE_SYSTEM_KEY, record.SerializeToString())
            return lambda: setattr(self.rec, "file_system", record)

        await self.write(fn, routing=False)
        log.info(
            "file system recorded file_system_id=%s meta_node=%d store=%s",
            req.file_system_id,
            req.node_id,
            req.store,
        )
        return record

    async def _put_node(self, node: mgmtd_pb2.NodeInfo) -> None:
        async def fn(tr: Transaction) -> Apply:
            tr.set(schema.node_key(node.node_id), schema.stored_node(node))

            def apply() -> None:
                self.rec.nodes[node.node_id] = node
                if node.node_id not in self.node_rt:
                    self.node_rt[node.node_id] = NodeRuntime(last_heartbeat=self._mono())

            return apply

        await self.write(fn)

    def _node(self, node_id: int) -> mgmtd_pb2.NodeInfo:
        node = self.rec.nodes.get(node_id)
        if node is None:
            raise FS3Error(StatusCode.MGMTD_UNKNOWN_NODE, f"node {node_id} is not registered")
        return node

    async def heartbeat(self, req: mgmtd_pb2.HeartbeatRequest) -> mgmtd_pb2.HeartbeatReply:
        node = self.rec.nodes.get(req.node_id)
        if node is None:
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_NODE, f"node {req.node_id} is not registered (register it first)"
            )
        if node.disabled:
            # refused; but what its daemon acts on may end the drain of its targets
            for th in req.targets:
                if th.target_id in self.node_targets.get(req.node_id, ()):
                    self._note_acting(th.target_id, th.chain_version)
            raise FS3Error(StatusCode.MGMTD_NODE_DISABLED, f"node {req.node_id} is disabled")
        if req.type != node.type:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT,
                f"node {req.node_id} is registered as {common_pb2.NodeType.Name(node.type)}, "
                f"heartbeat says {common_pb2.NodeType.Name(req.type) if req.type in common_pb2.NodeType.values() else req.type}",
            )
        rt = self.node_rt.setdefault(req.node_id, NodeRuntime())
        if (req.incarnation, req.sequence) <= (rt.incarnation, rt.sequence) and not (
            # A process started with its clock set back numbers its incarnation below the last
            # one. While that one is live this could be a late heartbeat of it; once it has been
            # declared failed, it is a new process.
            req.incarnation != rt.incarnation and rt.status == mgmtd_pb2.NODE_STATUS_FAILED
        ):
            if req.incarnation < rt.incarnation and (req.hostname, req.pid) != (rt.hostname, rt.pid):
                # Not a late heartbeat of the process now accepted: another one, still running.
                # Two processes with one node id (a copied config), the newer one taking over.
                this, other = f"{req.hostname or '?'} pid {req.pid}", f"{rt.hostname or '?'} pid {rt.pid}"
                if rt.duplicate_logged != (req.hostname, req.pid):
                    rt.duplicate_logged = (req.hostname, req.pid)
                    log.warning(
                        "node %d is run by two processes: %s, refused, and %s, started later and "
                        "accepted (two configs with node_id %d?)",
                        req.node_id,
                        this,
                        other,
                        req.node_id,
                    )
                raise FS3Error(
                    StatusCode.MGMTD_STALE_HEARTBEAT,
                    f"node {req.node_id} is also run by another process ({other}), started after this "
                    f"one ({this}), whose heartbeats mgmtd takes now: a node id must be unique (two "
                    f"configs with node_id {req.node_id}?)",
                )
            raise FS3Error(
                StatusCode.MGMTD_STALE_HEARTBEAT,
                f"heartbeat ({req.incarnation}, {req.sequence}) of node {req.node_id} is not newer "
                f"than the last one accepted ({rt.incarnation}, {rt.sequence})",
            )
        self._check_endpoints(req.endpoints)
        if len(req.hostname) > 255:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "hostname longer than 255 bytes")
        if len(req.targets) > MAX_TARGETS_PER_NODE:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"more than {MAX_TARGETS_PER_NODE} targets reported")
        seen: set[int] = set()
        for th in req.targets:
            if th.target_id in seen:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"target {th.target_id} reported twice")
            seen.add(th.target_id)
            if th.local_state not in _LOCAL_STATES:
                raise FS3Error(
                    StatusCode.INVALID_ARGUMENT, f"target {th.target_id}: bad local state {th.local_state}"
                )

        # Accepted: from here on nothing is refused. Targets the node reports that are not its own
        # (removed while its daemon ran, as when a disk is replaced) are passed over: refusing the
        # heartbeat would fail the whole node, and its other targets with it. (A daemon refuses to
        # start with such a target configured.)
        for th in req.targets:
            target = self.rec.targets.get(th.target_id)
            if (target is None or target.node_id != req.node_id) and (
                req.node_id,
                th.target_id,
            ) not in self._foreign_reported:
                self._foreign_reported.add((req.node_id, th.target_id))
                log.warning(
                    "node %d reports target %d, which %s; passed over",
                    req.node_id,
                    th.target_id,
                    "is not known" if target is None else f"belongs to node {target.node_id}",
                )
        now = self._mono()
        self._note_listening(now)
        if req.incarnation < rt.incarnation:
            log.warning(
                "node %d: new incarnation %d numbered below the failed one's %d (clock set back, or "
                "two processes with this node id?)",
                req.node_id,
                req.incarnation,
                rt.incarnation,
            )
        rt.incarnation, rt.sequence = req.incarnation, req.sequence
        rt.last_heartbeat = rt.heard_at = now
        rt.pid, rt.hostname = req.pid, req.hostname
        changed = False
        if rt.status != mgmtd_pb2.NODE_STATUS_ACTIVE:
            log.info("node active node_id=%d", req.node_id)
            rt.status = mgmtd_pb2.NODE_STATUS_ACTIVE
            changed = True
        if node.type == common_pb2.NODE_STORAGE:
            reported = {th.target_id: th for th in req.targets}
            for tid in self.node_targets.get(req.node_id, ()):
                trt = self.target_rt.setdefault(tid, TargetRuntime())
                th = reported.get(tid)
                if th is None:
                    # a storage daemon reports all its targets; one it omits is not served
                    new_state = LocalState.OFFLINE
                else:
                    new_state = LocalState(th.local_state)
                    chain_id = self.target_chain.get(tid)
                    chain_version = self.rec.chains[chain_id].version if chain_id else 0
                    if new_state == LocalState.UPTODATE and th.chain_version < chain_version:
                        # A daemon acting on an older chain cannot vouch for being up to date with
                        # the current one; that it is alive is all this report says.
                        new_state = LocalState.ONLINE
                    trt.used_bytes = th.used_bytes
                    self._note_acting(tid, th.chain_version)
                    if trt.low_space != th.low_space:
                        log.log(
                            logging.WARNING if th.low_space else logging.INFO,
                            "target low on space target_id=%d low=%s",
                            tid,
                            th.low_space,
                        )
                        trt.low_space = th.low_space
                        changed = True
                if trt.local_state != new_state:
                    log.info(
                        "target local state target_id=%d %s -> %s",
                        tid,
                        trt.local_state.name if trt.local_state else "UNKNOWN",
                        new_state.name,
                    )
                    trt.local_state = new_state
                    changed = True
        if changed:
            self._runtime_changed()
        if (req.endpoints and list(req.endpoints) != list(node.endpoints)) or (
            req.hostname and req.hostname != node.hostname
        ):
            async with self.lock:
                current = self.rec.nodes.get(req.node_id)
                if current is not None:  # unregistered meanwhile: nothing to update
                    updated = mgmtd_pb2.NodeInfo()
                    updated.CopyFrom(current)
                    if req.endpoints:
                        del updated.endpoints[:]
                        updated.endpoints.extend(req.endpoints)
                    if req.hostname:
                        updated.hostname = req.hostname
                    await self._put_node(updated)
        # While a routing write is under way (it may take this node's targets out, decided before
        # this heartbeat came), the reply names the version it publishes: the node's lease then
        # counts this heartbeat only once it acts on that routing (storage.target_map.Lease), not
        # while it still serves from the routing before it.
        reply = mgmtd_pb2.HeartbeatReply(
            routing_version=self.rec.routing_version + (1 if self._routing_writes else 0),
            heartbeat_timeout_s=self.timing.heartbeat_timeout_s,
        )
        if self.fencing:
            reply.fence_s = max(0.0, self.fence_until - now)
            # told once it acts on the routing the reply names: the node holds the fence until then
            if node.type == common_pb2.NODE_STORAGE and req.routing_version >= reply.routing_version:
                self.fence_told.add(req.node_id)
                self.fence_heard.set()
        cfg = self.rec.configs.get(node.type)
        if cfg is not None and cfg.version > req.config_version:
            reply.config.CopyFrom(cfg)
        return reply

    @serialized
    async def set_node_enabled(self, node_id: int, enabled: bool, force: bool = True) -> None:
        """Enable or disable a node. A disabled node's heartbeats are refused and its targets go
        OFFLINE; those SERVING in a chain that has another SERVING target drain first (as an admin
        offline-target does, see :meth:`_take_out_drained`): taken out at once, its daemon, still
        on the older routing and its lease, served reads of data its chains no longer wrote to it.
        Without ``force`` a node holding a chain's last SERVING targets is not disabled (checked
        here, one request at a time: the CLI's check of a listing let two nodes disabled at once
        leave a chain UNAVAILABLE)."""
        node = self._node(node_id)
        if node.disabled == (not enabled):
            return
        if not enabled and not force and node.type == common_pb2.NODE_META:
            # here, one request at a time: the CLI's check of a listing let two meta nodes
            # disabled at once leave clients none
            others = [
                n.node_id
                for n in self.rec.nodes.values()
                if n.type == common_pb2.NODE_META
                and n.node_id != node_id
                and not n.disabled
                and (rt := self.node_rt.get(n.node_id)) is not None
                and rt.status == mgmtd_pb2.NODE_STATUS_ACTIVE
            ]
            if not others:
                raise FS3Error(
                    StatusCode.FAILED_PRECONDITION,
                    f"node {node_id} is the only active meta node: disabled, clients that find meta "
                    "through routing would find none until enable-node (--force to do it anyway)",
                )
        elif not enabled and not force:
            mine = set(self.node_targets.get(node_id, ()))
            stranded = [
                c.chain_id for c in self.rec.chains.values() if (serving := _holding(c)) and serving <= mine
            ]
            if stranded:
                raise FS3Error(
                    StatusCode.FAILED_PRECONDITION,
                    f"node {node_id} holds the last SERVING target of chains "
                    f"{' '.join(map(str, sorted(stranded)))}: disabled, their data would be unavailable "
                    "until enable-node (--force to do it anyway)",
                )
        updated = mgmtd_pb2.NodeInfo()
        updated.CopyFrom(node)
        updated.disabled = not enabled
        rt = self.node_rt.setdefault(node_id, NodeRuntime())
        chains = self._drain_targets(node_id) if not enabled and self.may_serve(node_id) else []

        async def fn(tr: Transaction) -> Apply:
            tr.set(schema.node_key(node_id), schema.stored_node(updated))
            for c in chains:
                tr.set(schema.chain_key(c.chain_id), c.SerializeToString())

            def apply() -> None:
                self.rec.nodes[node_id] = updated
                now = self._mono()
                for c in chains:
                    self.rec.chains[c.chain_id] = c
                    for d in c.draining:
                        self.draining_since.setdefault((c.chain_id, d.target_id), now)

            return apply

        await self.write(fn)
        if enabled:
            rt.status, rt.last_heartbeat = mgmtd_pb2.NODE_STATUS_REGISTERED, self._mono()
        else:
            rt.status = mgmtd_pb2.NODE_STATUS_DISABLED
            for tid in self.node_targets.get(node_id, ()):
                if not self._draining(tid):  # those go OFFLINE when drained
                    self.target_rt.setdefault(tid, TargetRuntime()).local_state = LocalState.OFFLINE
        self._runtime_changed()
        log.info("node %s node_id=%d", "enabled" if enabled else "disabled", node_id)

    def may_serve(self, node_id: int) -> bool:
        """Whether the node's daemon may hold a read lease now: it is ACTIVE, or (only registered
        with this primary) a primary before this one heard from it, which is possible while this
        one bootstraps (a lease lasts less than the heartbeat timeout) after taking over from
        another (a lease epoch past the first). A stop fence makes that last until a heartbeat
        timeout after it (bootstrapping, see the module docstring)."""
        rt = self.node_rt.get(node_id)
        if rt is None:
            return False
        return rt.status == mgmtd_pb2.NODE_STATUS_ACTIVE or (
            rt.status == mgmtd_pb2.NODE_STATUS_REGISTERED and self._heard_before()
        )

    def _heard_before(self) -> bool:
        """Whether nodes this primary has not heard from may still act on a lease of an earlier
        primary's."""
        return self.bootstrapping and self.election.epoch > 1

    def _drain_targets(self, node_id: int) -> list[mgmtd_pb2.ChainInfo]:
        """The chains where the node's SERVING targets drain (each chain's next version), those
        of chains with another SERVING target to read from."""
        out = []
        for tid in self.node_targets.get(node_id, ()):
            chain = self.rec.chains.get(self.target_chain.get(tid, 0))
            if chain is None or self._draining(tid):
                continue
            serving = serving_staying(chain)
            if tid in serving and len(serving) >= 2:
                out.append(draining_chain(chain, [tid]))
        return out

    def _draining(self, target_id: int) -> bool:
        """Whether the target drains in its chain."""
        chain = self.rec.chains.get(self.target_chain.get(target_id, 0))
        return chain is not None and any(d.target_id == target_id for d in chain.draining)

    def _note_acting(self, target_id: int, chain_version: int) -> None:
        """The target's daemon says it acts on ``chain_version`` of its chain."""
        trt = self.target_rt.setdefault(target_id, TargetRuntime())
        if chain_version == trt.chain_version:
            return
        trt.chain_version = chain_version
        if self._draining(target_id):
            self.changed.set()  # it may have drained: take it out now

    @serialized
    async def unregister_node(self, node_id: int) -> None:
        self._node(node_id)
        owned = self.node_targets.get(node_id, [])
        if owned:
            raise FS3Error(
                StatusCode.FAILED_PRECONDITION, f"node {node_id} still has targets {owned}; remove them first"
            )

        async def fn(tr: Transaction) -> Apply:
            tr.clear(schema.node_key(node_id))

            def apply() -> None:
                self.rec.nodes.pop(node_id, None)
                self.node_rt.pop(node_id, None)

            return apply

        await self.write(fn)

    def _node_down(self, node_id: int) -> None:
        for tid in self.node_targets.get(node_id, ()):
            self.target_rt.setdefault(tid, TargetRuntime()).local_state = LocalState.OFFLINE

    # ---- periodic work -------------------------------------------------------------------------

    def _note_listening(self, now: float) -> None:
        """The primary acts at ``now`` (see the module docstring). After a gap since the last time,
        start listening afresh; a node that stays silent one full timeout after that is failed."""
        last, self._last_listening = self._last_listening, now
        if last is None:
            return
        gap = now - last
        if gap > self.timing.heartbeat_timeout_s * RESUME_GAP_FRACTION:
            log.warning(
                "primary resumed after %.1fs without listening; every node gets a fresh heartbeat timeout",
                gap,
            )
            self.listening_since = now
            if self._was_bootstrapping:  # the grace for unheard-of targets ran out unobserved
                self.bootstrapping_until = max(
                    self.bootstrapping_until, now + self.timing.heartbeat_timeout_s
                )
        if gap > self.timing.client_session_timeout_s * RESUME_GAP_FRACTION:
            self.sessions_complete_at = max(
                self.sessions_complete_at, now + self.timing.client_session_timeout_s
            )

    def detect_failures(self) -> None:
        """Mark nodes silent past the heartbeat timeout failed, and their targets offline.

        Silence counts only from :attr:`listening_since`, so that a node is never failed for
        heartbeats this primary could not have received."""
        now = self._mono()
        self._note_listening(now)
        for nid, rt in self.node_rt.items():
            if rt.status in (mgmtd_pb2.NODE_STATUS_ACTIVE, mgmtd_pb2.NODE_STATUS_REGISTERED):
                quiet_since = max(rt.last_heartbeat, self.listening_since, self.fence_until)
                if now - quiet_since > self.timing.heartbeat_timeout_s:
                    left = self._left(nid)
                    log.log(
                        logging.INFO if left else logging.WARNING,
                        "node %s node_id=%d silent_s=%.1f",
                        "stopped (its targets were offline)" if left else "failed",
                        nid,
                        now - rt.last_heartbeat,
                    )
                    rt.status = mgmtd_pb2.NODE_STATUS_FAILED
                    self._node_down(nid)
                    self._runtime_changed()
        if not self.bootstrapping:
            if self._was_bootstrapping:
                self._was_bootstrapping = False
                self._runtime_changed()  # routing info's bootstrapping flag flips
            # anything still unheard of after the grace period is down
            for trt in self.target_rt.values():
                if trt.local_state is None:
                    trt.local_state = LocalState.OFFLINE
                    self._runtime_changed()

    def _left(self, node_id: int) -> bool:
        """Whether every target of the node is offline by its own report: a storage daemon's clean
        stop says so in a last heartbeat."""
        targets = self.node_targets.get(node_id, ())
        return bool(targets) and all(
            (trt := self.target_rt.get(t)) is not None and trt.local_state == LocalState.OFFLINE
            for t in targets
        )

    def expire_sessions(self) -> None:
        """Forget sessions not extended for a client session timeout, unless the list is partial:
        then their clients may not have been able to reach this primary yet."""
        self._note_listening(self._mono())
        if self.sessions_partial:
            return
        cutoff = self._mono() - self.timing.client_session_timeout_s
        for cid in [cid for cid, at in self._extended_mono.items() if at < cutoff]:
            log.info("client session expired client_id=%s", cid)
            self._forget_session(cid)

    def _forget_session(self, client_id: str) -> None:
        del self.sessions[client_id]
        self._extended_mono.pop(client_id, None)
        self._count_off(client_id)

    def _count_off(self, client_id: str) -> None:
        """The session no longer counts against the user who held it (if one did)."""
        uid = self._session_user.pop(client_id, None)
        if uid is not None:
            left = self._user_sessions[uid] - 1
            if left:
                self._user_sessions[uid] = left
            else:
                del self._user_sessions[uid]

    @serialized
    async def update_chains(self) -> list[int]:
        """One round of the chain state machine over every chain; returns the chains that changed."""
        new_chains: dict[int, mgmtd_pb2.ChainInfo] = {}
        for cid, chain in self.rec.chains.items():
            local: dict[int, LocalState] = {}
            unknown = False
            for t in chain.targets:
                rt = self.target_rt.get(t.target_id)
                if rt is None or rt.local_state is None:
                    unknown = True
                else:
                    local[t.target_id] = rt.local_state
            if unknown and self.bootstrapping:
                continue  # judge a chain only once every target of it has been heard of
            before = chain_targets(chain)
            after, draining = self._take_out_drained(chain, next_chain(before, local))
            if after != before or draining != list(chain.draining):
                new_chains[cid] = make_chain(cid, chain.version + 1, after, chain.preferred_order, draining)
        if not new_chains and not self._routing_pending:
            return []

        async def fn(tr: Transaction) -> Apply:
            for c in new_chains.values():
                tr.set(schema.chain_key(c.chain_id), c.SerializeToString())

            def apply() -> None:
                for c in new_chains.values():
                    old = self.rec.chains[c.chain_id]
                    log.info(
                        "chain updated chain_id=%d version=%d %s -> %s",
                        c.chain_id,
                        c.version,
                        _render(old),
                        _render(c),
                    )
                    self.rec.chains[c.chain_id] = c
                self.reindex()  # a drained target may have been removed

            return apply

        await self.write(fn)
        return sorted(new_chains)

    def _take_out_drained(
        self, chain: mgmtd_pb2.ChainInfo, targets: list[ChainTarget]
    ) -> tuple[list[ChainTarget], list[mgmtd_pb2.DrainingTarget]]:
        """Make the admin operations waiting on ``chain``'s draining targets whose nodes are done
        (see :meth:`_drained`); ``targets`` is the chain after this round's state changes. Returns
        the chain after them and the draining targets left."""
        now = self._mono()
        left: list[mgmtd_pb2.DrainingTarget] = []
        for d in chain.draining:
            state = next((t.state for t in targets if t.target_id == d.target_id), None)
            if state == PublicState.SERVING and not self._drained(chain.chain_id, d, now):
                left.append(d)
                continue
            self.draining_since.pop((chain.chain_id, d.target_id), None)
            if state is None or (state == PublicState.OFFLINE and not d.remove):
                continue  # out of the data path already (it failed), as the operation wanted
            target = self.rec.targets.get(d.target_id)
            node = self.node_rt.get(target.node_id) if target is not None else None
            disabled = node is not None and node.status == mgmtd_pb2.NODE_STATUS_DISABLED
            try:
                if d.remove:
                    targets = chain_state.remove_target(targets, d.target_id)
                else:
                    targets = chain_state.offline_target(targets, d.target_id, force=d.force)
            except FS3Error as e:
                # the chain changed meanwhile (it is now the last server, say): it stays, and serves,
                # unless its node is disabled: not heard from (its reports are refused), it may
                # not serve on unobserved, so it goes OFFLINE (the chain's LASTSRV, as a disabled
                # last server does at once, until the node is enabled again)
                log.warning(
                    "drained target stays in its chain%s chain_id=%d target_id=%d: %s",
                    " as LASTSRV (its node is disabled)" if disabled else "",
                    chain.chain_id,
                    d.target_id,
                    e,
                )
                if disabled:
                    self.target_rt.setdefault(d.target_id, TargetRuntime()).local_state = LocalState.OFFLINE
                continue
            if disabled:
                # a disabled node's reports are refused: its target stays OFFLINE
                self.target_rt.setdefault(d.target_id, TargetRuntime()).local_state = LocalState.OFFLINE
            log.info(
                "drained target %s chain_id=%d target_id=%d",
                "removed" if d.remove else "offline",
                chain.chain_id,
                d.target_id,
            )
        return targets, left

    def _drained(self, chain_id: int, d: mgmtd_pb2.DrainingTarget, now: float) -> bool:
        """Whether draining target ``d`` may leave the data path: its daemon acts on a chain
        version that has it draining (so it serves no reads), or its node has failed or was never
        heard from (no lease to serve reads with, see :meth:`may_serve`), or a heartbeat timeout has passed since this primary
        first saw it draining (whatever the daemon heard meanwhile, heartbeat replies have named
        newer routing, which it counts only once it acts on it: its lease has run out), and since
        a stop fence ended (which its lease may have lasted until)."""
        target = self.rec.targets.get(d.target_id)
        node = self.node_rt.get(target.node_id) if target is not None else None
        if node is None or (
            node.status != mgmtd_pb2.NODE_STATUS_DISABLED and not self.may_serve(target.node_id)
        ):
            return True  # it holds no lease (a disabled node's may: it waits for its report or the timeout)
        trt = self.target_rt.get(d.target_id)
        if trt is not None and trt.chain_version >= d.since_version:
            return True
        since = self.draining_since.setdefault((chain_id, d.target_id), now)
        return now - max(since, self.fence_until) >= self.timing.heartbeat_timeout_s

    async def tick(self) -> list[int]:
        """The primary's periodic work: failure detection, session expiry, chain updates."""
        self.detect_failures()
        self.expire_sessions()
        return await self.update_chains()

    # ---- stop fence ----------------------------------------------------------------------------

    @serialized
    async def begin_fence(self, seconds: float) -> float:
        """Promise that no node is failed for ``seconds`` from now (see the module docstring): store
        the end, then answer heartbeats with it. Returns the wall time the fence ends (a fence
        this primary honours already and that lasts longer is kept). Raises FS3Error when the
        store or the lease fails: then no reply has promised anything."""
        now = self._mono()
        seconds = max(seconds, self.fence_until - now)
        until = self.wall() + seconds

        async def fn(tr: Transaction) -> None:
            tr.set(schema.FENCE_KEY, schema.encode_fence(until, seconds))

        await self.write(fn, routing=False)
        self.rec.fence_at, self.rec.fence_s = until, seconds
        self.fence_until = now + seconds  # the replies' fences end no later than the stored one
        self.fencing = True
        self.fence_told.clear()
        return until

    def fence_left(self) -> float:
        """Seconds until the stop fence this primary honours ends (0: none)."""
        return max(0.0, self.fence_until - self._mono())

    def fence_waiting(self) -> list[int]:
        """The storage nodes that may be serving and have not been answered with the fence yet."""
        return sorted(
            nid
            for nid, node in self.rec.nodes.items()
            if node.type == common_pb2.NODE_STORAGE
            and self.node_targets.get(nid)
            and nid not in self.fence_told
            and (rt := self.node_rt.get(nid)) is not None
            and rt.status == mgmtd_pb2.NODE_STATUS_ACTIVE
            and not self._left(nid)
        )

    # ---- client sessions -----------------------------------------------------------------------

    def extend_session(
        self, s: mgmtd_pb2.ClientSession, owner: int | None = None, *, renewing: bool = False
    ) -> bool:
        """Start or extend client session ``s``; ``owner``, a user's uid (None for a cluster
        member or a root user), may extend only a session of its own: another's would keep that client's files
        open at meta after it went, and take the session's uid. Returns whether the session of a
        ``renewing`` client (one that had it) was gone while this primary's list is complete: it
        expired, and meta may have ended the client's open-file sessions."""
        if not s.client_id or len(s.client_id) > 128:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "client_id must be 1..128 characters")
        if len(s.description) > 1024 or len(s.hostname) > 255:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "session description or hostname too long")
        self._note_listening(self._mono())
        now = self.wall()
        old = self.sessions.get(s.client_id)
        if owner is not None and old is not None and old.uid != owner:
            raise FS3Error(
                StatusCode.PERMISSION_DENIED, f"client session {s.client_id} belongs to uid {old.uid}"
            )
        # counted against the user who holds it now: one a member (or root token) extends, which
        # then takes the uid it names, is no user's any more
        holder = self._session_user.get(s.client_id)
        if owner != holder:
            if owner is not None:
                held = self._user_sessions.get(owner, 0)
                if held >= MAX_SESSIONS_PER_USER:
                    raise FS3Error(
                        StatusCode.RESOURCE_EXHAUSTED,
                        f"uid {owner} holds {held} client sessions, as many as a user may: end some"
                        " (close file systems, unmount) or wait for them to expire",
                    )
            self._count_off(s.client_id)
            if owner is not None:
                self._user_sessions[owner] = self._user_sessions.get(owner, 0) + 1
                self._session_user[s.client_id] = owner
        new = mgmtd_pb2.ClientSession()
        new.CopyFrom(s)
        new.started_at = old.started_at if old is not None else now
        new.extended_at = now
        lost = renewing and old is None and not self.sessions_partial
        if lost:
            log.warning(
                "client session expired before this extension client_id=%s host=%s: a new one starts",
                s.client_id,
                s.hostname,
            )
        elif old is None:
            log.info("client session started client_id=%s host=%s", s.client_id, s.hostname)
        self.sessions[s.client_id] = new
        self._extended_mono[s.client_id] = self._mono()
        return lost

    def end_session(self, client_id: str, owner: int | None = None) -> None:
        """A client ended its session (``owner`` as in :meth:`extend_session`); ending one that
        is gone already does nothing."""
        old = self.sessions.get(client_id)
        if old is None:
            return
        if owner is not None and old.uid != owner:
            raise FS3Error(
                StatusCode.PERMISSION_DENIED, f"client session {client_id} belongs to uid {old.uid}"
            )
        self._forget_session(client_id)
        log.info("client session ended client_id=%s host=%s", client_id, old.hostname)


def _render(chain: mgmtd_pb2.ChainInfo) -> str:
    return (
        "["
        + " ".join(
            f"{t.target_id}:{common_pb2.PublicTargetState.Name(t.public_state)}" for t in chain.targets
        )
        + "]"
    )
