"""The targets one storage daemon serves, their local states, and what routing says about them.

Local state of a target (reported in every heartbeat; reference notes §4.1–4.2):

- **OFFLINE** at startup, until routing shows the target neither SERVING, SYNCING nor WAITING:
  a restarted daemon must not serve anything before mgmtd has taken note that it went away (it
  may have missed writes). Also OFFLINE for good once the target's disk failed.
- **ONLINE** (alive, not known to be up to date): it takes writes forwarded to it while its chain
  has it SYNCING, and waits for its predecessor to resync it.
- **UPTODATE** after its predecessor reported the resync done (SyncDone), or when mgmtd makes an
  ONLINE target SERVING again (the last serving replica of its chain came back: LASTSRV).

An UPTODATE target that routing shows OFFLINE, LASTSRV or WAITING (mgmtd took it for failed) drops
to ONLINE and stops serving until it has been resynced. So does one that routing shows SYNCING at
any chain version but the one a SyncDone made it UPTODATE at: a daemon cut off from mgmtd, or slow
to poll routing, may jump from SERVING straight to SYNCING without ever seeing itself OFFLINE, and
the writes its chain acknowledged meanwhile are not on it. Dropping to ONLINE lets its predecessor
resync it (SyncStart needs ONLINE) and keeps it from reporting UPTODATE at the new version, which
mgmtd would take for the end of a resync that never happened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fs3.client.routing import ChainView, Routing
from fs3.errors import FS3Error, StatusCode
from fs3.proto import common_pb2, mgmtd_pb2

from .async_engine import AsyncChunkEngine

log = logging.getLogger(__name__)

UPTODATE = common_pb2.UPTODATE
ONLINE = common_pb2.ONLINE
OFFLINE = common_pb2.LOCAL_OFFLINE
_STATE_NAMES = {UPTODATE: "UPTODATE", ONLINE: "ONLINE", OFFLINE: "OFFLINE"}


@dataclass(slots=True)
class LocalTarget:
    """One target of this daemon: a directory with its chunk engine."""

    target_id: int
    path: Path
    engine: AsyncChunkEngine
    disk_index: int = 0
    local_state: int = OFFLINE
    failed: bool = False  # the disk failed: OFFLINE until the daemon restarts
    chain_id: int = 0
    chain_version: int = 0
    public_state: int = common_pb2.PUBLIC_STATE_INVALID
    # The chain version at which a SyncDone made it UPTODATE while its chain has it SYNCING; 0
    # otherwise. UPTODATE vouches for that chain version only (see the module docstring).
    synced_version: int = 0
    used_bytes: int = 0
    low_space: bool = False
    # SERVING, but on its way out of its chain (mgmtd_pb2.DrainingTarget): serves no reads
    draining: bool = False

    @property
    def state_name(self) -> str:
        return _STATE_NAMES.get(self.local_state, str(self.local_state))


class TargetMap:
    """The daemon's targets by id and by chain, kept in step with routing.

    ``on_change`` is called after any local state changed (the daemon heartbeats at once).
    ``lease_ok`` says whether mgmtd can still be taken to regard this node as alive (reads are
    refused otherwise, so a node cut off from mgmtd cannot serve stale data).
    """

    def __init__(
        self,
        node_id: int,
        targets: list[LocalTarget],
        *,
        on_change: Callable[[], None] | None = None,
        lease_ok: Callable[[], bool] | None = None,
    ) -> None:
        self.node_id = node_id
        self.targets: dict[int, LocalTarget] = {t.target_id: t for t in targets}
        self.by_chain: dict[int, LocalTarget] = {}
        self.routing = Routing.empty()
        self._on_change = on_change
        self._lease_ok = lease_ok or (lambda: True)

    # -- routing ----------------------------------------------------------------------------------

    def apply_routing(self, routing: Routing) -> None:
        """Take in a new routing snapshot: chains of our targets, and local state transitions."""
        self.routing = routing
        by_chain: dict[int, LocalTarget] = {}
        changed = False
        for t in self.targets.values():
            info = routing.targets.get(t.target_id)
            t.chain_id = info.chain_id if info is not None else 0
            chain = routing.chains.get(t.chain_id) if t.chain_id else None
            t.chain_version = chain.version if chain else 0
            t.public_state = chain.state_of(t.target_id) if chain else common_pb2.PUBLIC_STATE_INVALID
            t.draining = chain is not None and t.target_id in chain.draining
            if t.chain_id:
                if t.chain_id in by_chain:
                    log.error("two targets of one chain on this node chain_id=%d", t.chain_id)
                by_chain.setdefault(t.chain_id, t)
            changed |= self._transition(t)
        self.by_chain = by_chain
        if changed and self._on_change is not None:
            self._on_change()

    def _transition(self, t: LocalTarget) -> bool:
        old = t.local_state
        ps = t.public_state
        if t.failed:
            new = OFFLINE
        elif old == OFFLINE:
            # the startup protocol: wait until mgmtd agrees that the target was away
            new = (
                ONLINE if ps not in (common_pb2.SERVING, common_pb2.SYNCING, common_pb2.WAITING) else OFFLINE
            )
        elif old == ONLINE and ps == common_pb2.SERVING:
            new = UPTODATE  # mgmtd made it SERVING from LASTSRV: it holds the newest data
        elif old == UPTODATE and ps in (common_pb2.OFFLINE, common_pb2.LASTSRV, common_pb2.WAITING):
            new = ONLINE  # mgmtd took it for failed: it may have missed writes
        elif old == UPTODATE and ps == common_pb2.SYNCING and t.synced_version != t.chain_version:
            # SYNCING with no resync done at this chain version: it was taken out of its chain
            # while it was not looking (it never saw itself OFFLINE) and may have missed writes
            new = ONLINE
        else:
            new = old
        if ps != common_pb2.SYNCING:
            t.synced_version = 0
        if new != old:
            t.local_state = new
            log.info(
                "target local state target_id=%d %s -> %s public=%s chain_version=%d",
                t.target_id,
                _STATE_NAMES[old],
                _STATE_NAMES[new],
                common_pb2.PublicTargetState.Name(ps),
                t.chain_version,
            )
            return True
        return False

    def set_state(self, t: LocalTarget, state: int, why: str) -> None:
        """Change ``t``'s local state outside routing: UPTODATE here is a SyncDone, which vouches
        for the chain version ``t`` is at now and no other."""
        if t.failed:
            return
        if state == UPTODATE:
            t.synced_version = t.chain_version
        if t.local_state == state:
            return
        log.info(
            "target local state target_id=%d %s -> %s why=%s",
            t.target_id,
            _STATE_NAMES[t.local_state],
            _STATE_NAMES[state],
            why,
        )
        t.local_state = state
        if self._on_change is not None:
            self._on_change()

    def fail(self, target_id: int, error: FS3Error) -> None:
        """The target's disk failed: OFFLINE until the daemon restarts."""
        t = self.targets.get(target_id)
        if t is None or t.failed:
            return
        log.error("target failed target_id=%d error=%s", target_id, error)
        t.failed = True
        self.set_state(t, OFFLINE, "disk error")
        t.local_state = OFFLINE

    def rejoin(self, target_id: int, error: FS3Error) -> None:
        """A call failed here for a passing reason (too many open files...) in a way that may have
        left the target behind its chain: OFFLINE, as a restarted target is, so that mgmtd takes
        it out of its chain and it comes back through a resync from its predecessor (the startup
        protocol, see the module docstring), with no restart. Meanwhile it serves nothing."""
        t = self.targets.get(target_id)
        if t is None or t.failed or t.local_state == OFFLINE:
            return
        log.warning("target leaves its chain to be resynced target_id=%d error=%s", target_id, error.message)
        self.set_state(t, OFFLINE, "may lack a write its chain took")

    # -- heartbeats -------------------------------------------------------------------------------

    def heartbeat_reports(self) -> list[mgmtd_pb2.TargetHeartbeat]:
        return [
            mgmtd_pb2.TargetHeartbeat(
                target_id=t.target_id,
                local_state=t.local_state,
                chain_version=t.chain_version,
                used_bytes=t.used_bytes,
                low_space=t.low_space,
                disk_index=t.disk_index,
            )
            for t in self.targets.values()
        ]

    # -- lookups with the checks each kind of request needs ---------------------------------------

    def chain(self, chain_id: int) -> ChainView:
        chain = self.routing.chains.get(chain_id)
        if chain is None:
            if not self.routing.version:
                # listening, but the first routing snapshot has not arrived (the daemon is starting)
                raise FS3Error(
                    StatusCode.STORAGE_ROUTING_STALE,
                    f"node {self.node_id} is starting: it has no routing yet",
                )
            raise FS3Error(StatusCode.MGMTD_UNKNOWN_CHAIN, f"chain {chain_id} is not in this node's routing")
        return chain

    def of_chain(self, chain_id: int) -> LocalTarget:
        t = self.by_chain.get(chain_id)
        if t is None:
            self.chain(chain_id)
            raise FS3Error(
                StatusCode.STORAGE_TARGET_NOT_SERVING,
                f"node {self.node_id} holds no target of chain {chain_id}",
            )
        return t

    def target(self, target_id: int) -> LocalTarget:
        t = self.targets.get(target_id)
        if t is None:
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_TARGET,
                f"node {self.node_id} does not serve target {target_id} (a daemon takes up the "
                "targets its config names when it starts: restart it after create-targets)",
            )
        return t

    def check_readable(self, t: LocalTarget, *, tail: bool = False) -> None:
        """Reads: the target must be SERVING, up to date, not draining, and this node not cut off
        from mgmtd. ``tail``: a question the chain's tail answers (which version is committed),
        which a draining tail still does: it is still where the chain commits first."""
        if t.draining and not tail:
            raise FS3Error(
                StatusCode.STORAGE_TARGET_NOT_SERVING,
                f"target {t.target_id} is leaving its chain (draining): it serves no reads",
            )
        if t.failed:
            raise FS3Error(StatusCode.STORAGE_TARGET_OFFLINE, f"target {t.target_id} is offline (disk error)")
        if t.public_state != common_pb2.SERVING or t.local_state != UPTODATE:
            raise FS3Error(
                StatusCode.STORAGE_TARGET_NOT_SERVING,
                f"target {t.target_id} is {common_pb2.PublicTargetState.Name(t.public_state)}/"
                f"{t.state_name}, not serving",
            )
        if not self._lease_ok():
            raise FS3Error(
                StatusCode.STORAGE_TARGET_NOT_SERVING,
                f"node {self.node_id} has not reached mgmtd lately; target {t.target_id} not serving",
            )

    def check_head(self, t: LocalTarget, chain: ChainView) -> None:
        """Client updates: the target must be the chain's head, SERVING and up to date."""
        if t.failed:
            raise FS3Error(StatusCode.STORAGE_TARGET_OFFLINE, f"target {t.target_id} is offline (disk error)")
        head = chain.head
        if head is None or head.target_id != t.target_id:
            raise FS3Error(
                StatusCode.STORAGE_NOT_HEAD,
                f"target {t.target_id} is not the head of chain {chain.chain_id} at version {chain.version}",
            )
        if t.local_state != UPTODATE:
            raise FS3Error(
                StatusCode.STORAGE_TARGET_NOT_SERVING, f"target {t.target_id} is {t.state_name}, not serving"
            )

    def check_replica(self, t: LocalTarget) -> None:
        """Forwarded updates: the target must be SERVING or SYNCING in its chain, and not OFFLINE."""
        if t.failed or t.local_state == OFFLINE:
            raise FS3Error(StatusCode.STORAGE_TARGET_OFFLINE, f"target {t.target_id} is offline")
        if t.public_state not in (common_pb2.SERVING, common_pb2.SYNCING):
            raise FS3Error(
                StatusCode.STORAGE_TARGET_NOT_SERVING,
                f"target {t.target_id} is {common_pb2.PublicTargetState.Name(t.public_state)} in chain "
                f"{t.chain_id}; it takes no updates",
            )


class Lease:
    """When this node last heard mgmtd accept a heartbeat, measured from when it was sent.

    mgmtd declares a node failed only after ``timeout_s`` without heartbeats, so until the send
    time of the last accepted heartbeat plus a margin of that, nobody has replaced this node's
    targets in their chains.

    That holds only for a node that acts on the routing mgmtd had when it accepted the heartbeat:
    after a partition heals, the first heartbeat goes through while the node still acts on the
    routing from before it (its targets SERVING there, OFFLINE now). A reply that carries a newer
    routing version than the node has applied (:meth:`routing_applied`) is therefore held, and
    counts from the moment the node has applied that version: one routing poll later in steady
    state, where routing versions move on many events.

    A primary stopping cleanly answers with a fence (``fence_s``, see ``fs3.mgmtd.cluster``): no
    node is failed for that many seconds, by it or the next primary. The lease then lasts until the
    fence's end less the margin a heartbeat timeout has (``timeout_s * (1 - margin)``), whether or
    not a mgmtd answers meanwhile; it is held for a newer routing as a plain confirmation is.
    """

    #: confirmations held for a newer routing; beyond this many the oldest are let go
    MAX_HELD = 16

    def __init__(self, margin: float = 0.8) -> None:
        self.margin = margin
        self.timeout_s = 0.0
        self._sent = 0.0
        self._confirmed = 0.0
        self._routing_version = 0
        # (routing version the reply carried, send time, heartbeat timeout, fence end), versions
        # ascending
        self._held: list[tuple[int, float, float, float]] = []
        # monotonic end of a stop fence's extension (0: none)
        self._fence_until = 0.0
        # when a request first found the lease run out (logged then, and again once renewed)
        self._lapsed_at: float | None = None

    def sending(self) -> None:
        self._sent = time.monotonic()

    @property
    def routing_version(self) -> int:
        """The routing version the node acts on (as :meth:`routing_applied` last said)."""
        return self._routing_version

    def confirmed(self, timeout_s: float, routing_version: int = 0, fence_s: float = 0.0) -> None:
        """mgmtd accepted the heartbeat sent last; its reply said ``timeout_s``,
        ``routing_version`` and ``fence_s``."""
        sent = self._sent
        fence_end = sent + fence_s - timeout_s * (1 - self.margin) if fence_s > 0 else 0.0
        if routing_version <= self._routing_version:
            self._confirm(sent, timeout_s, fence_end)
            return
        if self._held and self._held[-1][0] >= routing_version:
            # replies of one mgmtd carry ascending versions; a failover may not, so keep the larger
            version, _, _, held_fence = self._held[-1]
            self._held[-1] = (version, sent, timeout_s, max(held_fence, fence_end))
        else:
            self._held.append((routing_version, sent, timeout_s, fence_end))
            del self._held[: -self.MAX_HELD]

    def routing_applied(self, version: int) -> None:
        """The node now acts on routing ``version``: confirmations held for it count."""
        self._routing_version = version
        while self._held and self._held[0][0] <= version:
            _, sent, timeout_s, fence_end = self._held.pop(0)
            self._confirm(sent, timeout_s, fence_end)

    def _confirm(self, sent: float, timeout_s: float, fence_end: float = 0.0) -> None:
        self._confirmed = max(self._confirmed, sent)
        if timeout_s > 0:
            self.timeout_s = timeout_s
        if fence_end > self._fence_until:
            now = time.monotonic()
            if self._fence_until <= now:
                log.info(
                    "mgmtd is stopping: this node's targets serve on without it for %.1f s (its stop fence)",
                    fence_end - now,
                )
            self._fence_until = fence_end
        lapsed_at = self._lapsed_at
        if lapsed_at is not None and self._valid():
            self._lapsed_at = None
            log.info(
                "lease from mgmtd renewed: targets serve again after %.1f s", time.monotonic() - lapsed_at
            )

    def _valid(self) -> bool:
        now = time.monotonic()
        if now < self._fence_until:
            return True
        if self.timeout_s <= 0:
            return self._confirmed > 0
        return now < self._confirmed + self.timeout_s * self.margin

    def ok(self) -> bool:
        if self._valid():
            return True
        if self._lapsed_at is None and self._confirmed > 0:
            self._lapsed_at = now = time.monotonic()
            log.warning(
                "lease from mgmtd ran out: this node's targets refuse reads until mgmtd accepts a "
                "heartbeat (writes go on, fenced by chain versions; last accepted heartbeat sent "
                "%.1f s ago, heartbeat timeout %.1f s)",
                now - self._confirmed,
                self.timeout_s,
            )
        return False
