"""The storage daemon: targets, the storage service over fs3 RPC, heartbeats, routing and resync.

Startup (reference notes §4.2): open every target (recovery runs), listen, fetch routing,
register with mgmtd and heartbeat every target as OFFLINE; each target goes ONLINE once routing
shows mgmtd has taken it out of service (:mod:`fs3.storage.target_map`), from where the chain
brings it back: SERVING again if it was the last server, otherwise SYNCING, resynced by its
predecessor, then SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.background import Periodic
from fs3.capability import CapabilityVerifier
from fs3.client.meta_client import DEV_SECRET
from fs3.client.mgmtd_client import MgmtdClient, NodeAgent
from fs3.client.routing import Routing, RoutingCache
from fs3.client.storage_client import STORAGE_SERVICE, drop_failed_nodes
from fs3.config import StorageConfig
from fs3.daemon import apply_pushed_config, hot_log_level
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer
from fs3.net.auth import TokenCache
from fs3.net.transport import WILDCARDS, advertised_host, check_bindable, format_address
from fs3.net.transport_select import TransportMetrics, make_transport
from fs3.proto import common_pb2

from .aio import AioReader, open_aio
from .async_engine import AsyncChunkEngine
from .chunk_engine import EngineOptions, StallClock
from .craq import Replicator
from .resync import ResyncWorker
from .scrub import Scrubber
from .service import StorageService
from .target_map import OFFLINE, Lease, LocalTarget, TargetMap

log = logging.getLogger(__name__)

_TARGET_ID_FILE = "target_id"
# Which cluster a target directory belongs to: a fingerprint of the cluster secret (the secret
# tells clusters apart; its fingerprint does not give it away). Target ids repeat across clusters
# (every `fs3 local` cluster numbers its targets alike), so the id alone let a storage daemon of
# one cluster take another cluster's directory (a config pointing at a reused disk) and resync it
# empty.
_OWNER_FILE = "cluster_owner"
#: how long a stop waits for the engine calls already in the I/O threads
_IO_DRAIN_S = 30.0
# how long a clean stop waits for mgmtd to take its last heartbeat (see StorageDaemon._leave): a
# live mgmtd answers in milliseconds; one stopping at the same time (a whole host going down) is
# not waited for longer than this, and finds out by the heartbeat timeout as before
_LEAVE_S = 1.0
#: how long a usage pass waits for one target's space figures
_USAGE_CALL_S = 5.0
#: A target whose file system has less than this fraction free is reported low on space (3FS: 96 %
#: used), so meta places new files on other chains and operators see it before writes are refused
#: (``keep_free``, 2 % by default); the report is withdrawn once more than the second fraction is free.
#: Both are counted above ``keep_free`` where that is set higher than the default (a pushed config may).
LOW_SPACE_FRACTION = 0.04
LOW_SPACE_CLEAR_FRACTION = 0.05
_DEFAULT_KEEP_FREE = StorageConfig().keep_free  # the config's default, not a copy of it


class StorageDaemon:
    """One fs3-storage process. ``start`` raises FS3Error when it cannot start; ``stop`` is safe
    to call after a failed start."""

    def __init__(
        self, cfg: StorageConfig, *, secret: bytes | None = None, registry: CollectorRegistry | None = None
    ) -> None:
        self.cfg = cfg
        self.file_cfg = copy.deepcopy(cfg)  # what a pushed config's hot settings go back to
        self.secret = secret
        self.registry = registry or metrics.registry()
        # Each target's engine calls run in threads of its own: a disk that hangs holds only its
        # target's threads, and the node's other disks go on being served.
        self.pools = {
            tid: ThreadPoolExecutor(cfg.io_threads, thread_name_prefix=f"chunk-io-{tid}")
            for tid in cfg.target_ids
        }
        self.targets: TargetMap | None = None
        self.server: RpcServer | None = None
        self.backend_server: RpcServer | None = None
        self.backend_port = 0
        self.rpc: RpcClient | None = None
        self._failed_nodes: set[int] = set()  # nodes mgmtd had declared failed (drop_failed_nodes)
        self.mgmtd: MgmtdClient | None = None
        self.routing: RoutingCache | None = None
        self.agent: NodeAgent | None = None
        self.resync: ResyncWorker | None = None
        self.replicator: Replicator | None = None
        self.scrub: Scrubber | None = None
        self.lease = Lease()
        self.port = 0
        self._engines: list[AsyncChunkEngine] = []
        # a stop left I/O threads in a disk call (a hung disk): the process must not wait for them
        self.io_abandoned = False
        self.aio: AioReader | None = None
        self._usage: Periodic | None = None
        self._stalls: Periodic | None = None
        self._stall_clock = StallClock(min(1.0, self.cfg.disk_stall_s / 4) if self.cfg.disk_stall_s else 1.0)

    async def start(self) -> None:
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    def _hot_settings(self) -> dict[str, Callable[[Any], None]]:
        """What a config pushed by mgmtd changes while the daemon runs (see apply_pushed_config):
        the log level, how long a replica retries a forward, and the space each target keeps free."""

        def keep_free(fraction: float) -> None:
            for e in self._engines:
                e.engine.options = dataclasses.replace(e.engine.options, keep_free=fraction)

        return {
            **hot_log_level(),
            "forward_timeout_s": lambda v: setattr(self.replicator, "forward_timeout_s", v),
            "keep_free": keep_free,
        }

    async def _start(self) -> None:
        cfg = self.cfg
        if problem := cfg.problem():  # a config made in code, not loaded (load_config asks too)
            raise FS3Error(StatusCode.CONFIG_INVALID, problem)
        if not cfg.target_paths:  # the template's default, valid to load, nothing to serve
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                "no targets: target_paths (and target_ids) name none; a storage node serves at least "
                "one (a directory on each of its disks, with the target id made for it by fs3 admin "
                "create-targets)",
            )
        loop = asyncio.get_running_loop()
        secret = self.secret or DEV_SECRET
        owner = owner_mark(secret)
        # What is wrong here is said at once, before the wait for mgmtd; nothing is made on disk
        # until mgmtd has confirmed that every target is this node's.
        for tid, path in zip(cfg.target_ids, cfg.target_paths, strict=True):
            try:
                await loop.run_in_executor(self.pools[tid], _check_target_dir, Path(path), tid, owner)
            except FS3Error as e:
                if e.code != StatusCode.STORAGE_IO_ERROR:
                    raise
                # a disk that fails (EIO reading its directory): its target is left out below
                log.error("target directory unreadable target_id=%d error=%s", tid, e.message)
        check_bindable(cfg.listen_host, cfg.listen_port)
        if cfg.backend_port:
            check_bindable(cfg.backend_host or cfg.listen_host, cfg.backend_port)
        if self.secret is None:
            log.warning(
                "no cluster_secret_file: peers authenticate with the built-in development secret,"
                " which anyone can read in fs3's source; set one outside tests"
            )
        # one transport (cfg.transport: auto, tcp or rdma) for chain forwarding, resync and serving
        transport = make_transport(cfg.transport, cfg.rdma, metrics_sink=TransportMetrics(self.registry))
        self.rpc = RpcClient(
            secret, identity=f"storage-{cfg.node_id}", connections_per_peer=2, transport=transport
        )
        # a call to a hung mgmtd gives up within a heartbeat interval: the next address (a new
        # primary) is tried before this node's lease runs out
        self.mgmtd = MgmtdClient(
            cfg.mgmtd_addresses,
            cluster_secret=self.secret,
            rpc_timeout_s=min(3.0, max(cfg.heartbeat_interval_s, 1.0)),
        )
        self.routing = RoutingCache(self.mgmtd, refresh_interval_s=cfg.routing_refresh_interval_s)
        await self.routing.start(first_timeout_s=cfg.mgmtd_connect_timeout_s)
        removed = _check_targets_known(self.routing.routing, cfg.node_id, cfg.target_ids, cfg.target_paths)
        if len(removed) == len(cfg.target_ids):
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_TARGET,
                f"every target of this node ({', '.join(map(str, sorted(removed)))}) was removed from "
                "the cluster: nothing to serve (give it targets, or stop running it)",
            )
        local: list[LocalTarget] = []
        broken: list[Exception] = []
        for index, (tid, path) in enumerate(zip(cfg.target_ids, cfg.target_paths, strict=True)):
            if tid in removed:
                continue
            p = Path(path)

            def on_failure(e: FS3Error, tid: int = tid) -> None:
                loop.call_soon_threadsafe(self._target_failed, tid, e)

            try:
                await loop.run_in_executor(self.pools[tid], _claim_target_dir, p, tid, owner)
                engine = await AsyncChunkEngine.open(
                    p,
                    EngineOptions(
                        sync=cfg.sync_writes,
                        direct_io=cfg.direct_io,
                        keep_free=cfg.keep_free,
                        map_size=cfg.chunk_meta_map_size,
                    ),
                    on_failure=on_failure,
                    executor=self.pools[tid],
                )
            except (OSError, FS3Error) as e:
                if isinstance(e, FS3Error) and e.code != StatusCode.STORAGE_IO_ERROR:
                    raise  # a config's mistake (another target's directory, say), not a disk's
                # A disk that fails: its target is left out (mgmtd takes a target its daemon
                # does not report for offline), the node's other disks serve on.
                log.error("target cannot be opened, not served until a restart target_id=%d error=%s", tid, e)
                broken.append(e)
                continue
            self._engines.append(engine)
            local.append(LocalTarget(tid, p, engine, disk_index=index))
        if broken and not local:
            raise broken[0]
        self.targets = TargetMap(cfg.node_id, local, on_change=self._state_changed, lease_ok=self.lease.ok)
        if cfg.aio_reads and cfg.direct_io:
            self.aio = open_aio(loop, depth=cfg.aio_depth)
        self.replicator = replicator = Replicator(
            self.targets,
            self.routing,
            self.rpc,
            forward_timeout_s=cfg.forward_timeout_s,
            rpc_timeout_s=cfg.rpc_timeout_s,
            aio=self.aio,
        )
        self.resync = ResyncWorker(replicator, interval_s=cfg.resync_interval_s, registry=self.registry)
        self.scrub = Scrubber(
            replicator,
            bytes_per_s=cfg.scrub_mib_per_s * (1 << 20),
            interval_s=cfg.scrub_interval_s,
            start_delay_s=cfg.scrub_start_delay_s,
            registry=self.registry,
        )
        service = StorageService(replicator, self.registry, capabilities=CapabilityVerifier(secret))
        # Clients that hold no cluster secret connect with their user token (checked with mgmtd) and
        # read and write what meta's capabilities let them; the backend listener is for the chain.
        self.server = RpcServer(
            secret,
            identity=f"storage-{cfg.node_id}",
            transport=transport,
            verify_user=TokenCache(self.mgmtd.verify_token, stale_s=cfg.token_stale_s).user_of,
        )
        self.server.add_service(STORAGE_SERVICE, service)
        self.port = await _listen(self.server, cfg.listen_host, cfg.listen_port)
        advertise = advertised_host(cfg.listen_host, cfg.advertise_host)
        endpoints = [common_pb2.Endpoint(host=advertise, port=self.port, transport="tcp")]
        if cfg.backend_port:
            # chain replication on its own network: same service, second listener, second endpoint
            host = cfg.backend_host or cfg.listen_host
            self.backend_server = RpcServer(
                secret, identity=f"storage-{cfg.node_id}-backend", transport=transport
            )
            self.backend_server.add_service(STORAGE_SERVICE, service)
            self.backend_port = await _listen(self.backend_server, host, cfg.backend_port)
            endpoints.append(
                common_pb2.Endpoint(
                    # a backend address of its own, or where clients reach it
                    host=advertise if host in WILDCARDS else host,
                    port=self.backend_port,
                    transport="tcp",
                )
            )

        self.routing.add_listener(self._routing_changed)
        self._routing_changed(self.routing.routing)
        self.agent = NodeAgent(
            self.mgmtd,
            cfg.node_id,
            common_pb2.NODE_STORAGE,
            endpoints=endpoints,
            interval_s=cfg.heartbeat_interval_s,
            targets=self._heartbeat_reports,
            routing_version=lambda: self.lease.routing_version,
            on_routing_version=self._heartbeat_ok,
            on_config=lambda info: apply_pushed_config(
                "storage", self.cfg, self.file_cfg, info, self._hot_settings()
            ),
        )
        await self.agent.start()
        self.resync.start()
        self.scrub.start()
        self._usage = Periodic("fs3-storage-usage", self._usage_pass, max(self.cfg.heartbeat_interval_s, 1.0))
        self._usage.start()
        self._usage.wake()  # the first figures now, not one interval later
        if cfg.disk_stall_s:
            self._stalls = Periodic("fs3-storage-stalls", self._stall_pass, self._stall_clock.interval_s)
            self._stalls.start()
        log.info(
            "storage serving node_id=%d port=%d targets=%s",
            cfg.node_id,
            self.port,
            ",".join(str(t) for t in (self.targets.targets if self.targets else ())),  # (not those left out)
        )

    async def stop(self) -> None:
        if self._stalls is not None:
            await self._stalls.stop()
        if self._usage is not None:
            await self._usage.stop()
        if self.resync is not None:
            await self.resync.stop()
        if self.scrub is not None:
            await self.scrub.stop()
        if self.agent is not None:
            await self.agent.stop()
            await self._leave()
        if self.routing is not None:
            await self.routing.stop()
        if self.server is not None:
            await self.server.stop()
        if self.backend_server is not None:
            await self.backend_server.stop()
        if self.replicator is not None:
            await self.replicator.stop_repairs()  # once no read can start another
        if self.rpc is not None:
            await self.rpc.close()
        if self.mgmtd is not None:
            await self.mgmtd.close()
        if self.aio is not None:
            await self.aio.close()  # after the servers: no read is submitted any more
        # The servers cancelled their calls, but an engine call already in an I/O thread runs on:
        # let those finish before the engines close under them (an update on a closed store fails
        # as a disk error would, and would mark its target failed on a clean stop). A disk that
        # hangs does not hold the stop for longer than this.
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(_IO_DRAIN_S):
                await asyncio.gather(
                    *(loop.run_in_executor(None, p.shutdown, True) for p in self.pools.values())
                )
        except TimeoutError:
            # Python joins the executor's threads at exit: the process would wait for the disk
            self.io_abandoned = True
            log.warning(
                "I/O threads still in a disk call %.0f s after the stop began: the process exits "
                "without them (what they were writing is settled at the next start, as after a "
                "crash)",
                _IO_DRAIN_S,
            )
        for e in self._engines:
            with contextlib.suppress(Exception):
                await e.close()
        self._engines.clear()

    async def _leave(self) -> None:
        """On a clean stop, tell mgmtd first that this node's targets go offline, in one last
        heartbeat: it takes them out of their chains at once, and clients' writes go on with the
        other replicas instead of failing until a heartbeat timeout has passed (the targets come
        back, resyncing, when the daemon starts again; a resync of a target that missed nothing
        costs a comparison of chunk metadata). Served no more from here: their local state is
        OFFLINE before the heartbeat leaves."""
        assert self.agent is not None
        if self.targets is None:
            return
        for t in self.targets.targets.values():
            self.targets.set_state(t, OFFLINE, "the daemon is stopping")
        try:
            async with asyncio.timeout(_LEAVE_S):
                await self.agent.beat()
        except (FS3Error, TimeoutError) as e:  # mgmtd unreachable: it finds out by the timeout
            if not (isinstance(e, FS3Error) and e.code == StatusCode.MGMTD_NODE_DISABLED):  # out already
                why = e if isinstance(e, FS3Error) else f"no answer within {_LEAVE_S:g} s"
                log.warning("could not tell mgmtd that this node's targets go offline error=%s", why)

    # -- callbacks --------------------------------------------------------------------------------

    def _routing_changed(self, routing: Routing) -> None:
        assert self.targets is not None and self.rpc is not None
        self.targets.apply_routing(routing)
        drop_failed_nodes(self.rpc, routing, self._failed_nodes)
        self.lease.routing_applied(routing.version)
        if self.resync is not None:
            self.resync.poke()

    def _state_changed(self) -> None:
        if self.agent is not None:
            self.agent.beat_soon()

    def _target_failed(self, target_id: int, error: FS3Error) -> None:
        if self.targets is not None:
            self.targets.fail(target_id, error)

    def _heartbeat_reports(self):  # type: ignore[no-untyped-def]
        assert self.targets is not None
        self.lease.sending()
        return self.targets.heartbeat_reports()

    def _heartbeat_ok(self, routing_version: int) -> None:
        assert self.agent is not None and self.routing is not None
        reply = self.agent.last_reply
        # held until this daemon has applied that routing version (see Lease): mgmtd may have
        # taken its targets out of their chains while it was cut off
        if reply is None:
            self.lease.confirmed(0.0, routing_version)
        else:
            self.lease.confirmed(reply.heartbeat_timeout_s, routing_version, reply.fence_s)
        if routing_version > self.routing.version:
            self.routing.refresh_soon()

    async def _usage_pass(self) -> None:
        """Each target's space, for heartbeats (mgmtd shows it; meta steers new files by
        ``low_space``). A Periodic step: an unexpected error is logged and the next pass runs."""
        assert self.targets is not None
        for t in list(self.targets.targets.values()):
            if t.failed:
                continue
            try:
                # not held up by a disk that hangs (the stall check takes its target offline)
                async with asyncio.timeout(_USAGE_CALL_S):
                    space = await t.engine.space_info()
            except (FS3Error, TimeoutError):
                continue
            t.used_bytes = space.used
            # A little hysteresis: each change republishes routing info (meta steers new files
            # by it), so a target hovering at the line must not flip on every pass.
            line = LOW_SPACE_CLEAR_FRACTION if t.low_space else LOW_SPACE_FRACTION
            line += max(self.cfg.keep_free - _DEFAULT_KEEP_FREE, 0.0)  # writes are refused earlier
            low = space.free < space.capacity * line
            if low != t.low_space:
                log.log(
                    logging.WARNING if low else logging.INFO,
                    "target low on space target_id=%d low=%s free=%d capacity=%d",
                    t.target_id,
                    low,
                    space.free,
                    space.capacity,
                )
                t.low_space = low
                self._state_changed()

    async def _stall_pass(self) -> None:
        """Take offline each target whose disk has left a call unanswered for longer than
        ``disk_stall_s``: its chains drop it and go on with their other replicas, instead of
        waiting for it without end (a disk that fails answers with an error, and the engine takes
        its target offline then; one that hangs never answers). A Periodic step."""
        assert self.targets is not None
        limit = self.cfg.disk_stall_s
        now = time.monotonic()
        since = self._stall_clock.tick(now)
        for t in list(self.targets.targets.values()):
            if not t.failed:
                t.engine.engine.fail_if_stalled(limit, now, since)  # its on_failure tells the target map


async def _listen(server: RpcServer, host: str, port: int) -> int:
    try:
        return (await server.start((host, port)))[1]
    except OSError as e:
        raise FS3Error(
            StatusCode.UNAVAILABLE, f"cannot listen on {format_address(host, port)}: {e.strerror}"
        ) from None


def _check_targets_known(
    routing: Routing, node_id: int, target_ids: Sequence[int], target_paths: Sequence[str]
) -> set[int]:
    """Refuse a configured target that mgmtd does not know or places on another node, before any
    target directory is made: mgmtd would refuse the first heartbeat for it all the same, and a
    refused start must leave the disks as it found them (no directories of a mistyped target id).

    Returns the targets to leave out: those mgmtd no longer knows whose directory records that
    they served here (removed from the cluster with ``fs3 admin remove-target``; the node's
    config still names them until an operator edits it, and its other targets must serve on)."""
    removed: set[int] = set()
    for tid, path in zip(target_ids, target_paths, strict=True):
        target = routing.targets.get(tid)
        if target is None:
            served_here = _recorded_target(Path(path)) == str(tid)
            if served_here and not routing.targets:
                # Not a target removed from the cluster: a mgmtd that knows none at all is not the
                # one this target served under (a new or emptied store; a standby mgmtd on
                # another host with an lmdb store of its own, which serves as a second primary).
                # Left out, the node would exit saying to delete good replicas' directories.
                raise FS3Error(
                    StatusCode.MGMTD_UNKNOWN_TARGET,
                    f"target {tid} served here, but mgmtd knows no targets at all: it is not the "
                    "mgmtd of this node's cluster (a new or empty store? a standby mgmtd on another "
                    "host with its own lmdb store?): check mgmtd_addresses and mgmtd's kv store",
                )
            if served_here:
                log.warning(
                    "target %d is no longer known to mgmtd (removed with fs3 admin remove-target?): "
                    "left out; remove it from this node's config (target_ids, target_paths), and "
                    "its directory %s once its data is not wanted",
                    tid,
                    path,
                )
                removed.add(tid)
                continue
            raise FS3Error(
                StatusCode.MGMTD_UNKNOWN_TARGET,
                f"target {tid} is not known to mgmtd: create it first (fs3 admin create-targets), "
                "or correct its id in this node's config",
            )
        if target.node_id != node_id:
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                f"target {tid} belongs to node {target.node_id}, not to this node {node_id}",
            )
    return removed


def _recorded_target(path: Path) -> str | None:
    """The target id recorded in target directory ``path`` (None: no directory, no record, or
    unreadable)."""
    try:
        return (path / _TARGET_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def owner_mark(secret: bytes) -> str:
    """What a target directory records of the cluster that claimed it: a fingerprint of the
    cluster secret."""
    return hashlib.sha256(b"fs3 target directory owner\0" + secret).hexdigest()[:32]


def _check_target_dir(path: Path, target_id: int, owner: str | None = None) -> None:
    """Check, creating nothing, that ``path`` can be target ``target_id``'s directory: its parent
    exists, and a directory already there belongs to this target (a file in it records the id on
    first use), so a config that swaps two paths is caught at startup; and to this cluster
    (``owner``, see :func:`owner_mark`, recorded on first use too), so a config that points at
    another cluster's directory is.

    Only the target directory itself is ever created, never its parents: a target's parent is on
    its disk, and a disk that failed to mount at boot leaves a bare mount point; creating the path
    there would start an empty target on the root file system (resynced in full there, or served
    empty as the last server of its chain)."""
    if not path.parent.is_dir():
        raise FS3Error(
            StatusCode.CONFIG_INVALID,
            f"target directory {path}: its parent {path.parent} is not an existing directory (is the "
            "target's disk mounted? make the parent on the disk once; fs3 creates only the target "
            "directory itself)",
        )
    try:
        if not path.exists():
            return
        if not path.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        marker = path / _TARGET_ID_FILE
        if marker.exists():
            recorded = marker.read_text().strip()
            if not recorded:
                raise FS3Error(
                    StatusCode.CONFIG_INVALID,
                    f"target directory {path}: its target id file {marker} is empty (written by a "
                    "version that did not sync it, and the host crashed?); if this directory is "
                    f"target {target_id}'s, write {target_id} into it",
                )
            if recorded != str(target_id):
                raise FS3Error(
                    StatusCode.CONFIG_INVALID,
                    f"target directory {path} belongs to target {recorded}, not {target_id}",
                )
        mark = path / _OWNER_FILE
        if owner is not None and mark.exists() and (found := mark.read_text().strip()) != owner:
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                f"target directory {path} belongs to another cluster (its {_OWNER_FILE} file records "
                f"{found or 'nothing'}, this cluster's secret gives {owner}): its chunks would be "
                f"replaced by this cluster's; if this cluster's secret was changed on purpose, "
                f"remove {mark} to let it claim the directory",
            )
        if not os.access(path, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"target directory {path}: {e.strerror or e}") from None


def _claim_target_dir(path: Path, target_id: int, owner: str | None = None) -> None:
    """Create the target directory if needed (see :func:`_check_target_dir`, asked again here) and
    record ``target_id`` and ``owner`` in it on first use (a directory of an older version, with
    no owner recorded, is claimed by the cluster that starts it)."""
    _check_target_dir(path, target_id, owner)
    try:
        made = not path.exists()
        path.mkdir(exist_ok=True)
        records = [(_TARGET_ID_FILE, str(target_id))]
        if owner is not None:
            records.append((_OWNER_FILE, owner))
        wrote = False
        for name, text in records:
            marker = path / name
            if marker.exists():
                continue
            # durable before it counts: the rename of an unsynced file can reach the disk before
            # its bytes, and a crash then leaves an empty id file that refuses every start after
            tmp = path / f".{name}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, f"{text}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, marker)
            wrote = True
        if not wrote:
            return
        for d in (path, path.parent) if made else (path,):
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError as e:
        raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"target directory {path}: {e.strerror or e}") from None
