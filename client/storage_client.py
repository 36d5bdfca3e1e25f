"""The storage client: chunk I/O against fs3-storage chains over fs3 RPC.

::

    rpc = RpcClient(secret, identity="fuse-7", connections_per_peer=2)
    routing = RoutingCache(MgmtdClient(mgmtd_addresses, cluster_secret=secret))
    await routing.start()
    storage = StorageClient(routing, rpc)
    r = await storage.write(chain_id, inode_id, chunk_index, offset, data, chunk_size)
    data = await storage.read(chain_id, inode_id, chunk_index, offset, length)

What a caller may rely on:

- **Writes** go to the chain's head with the chain version this client knows; they return once
  every replica of the chain has committed them. A write that fails with a routing error (chain
  version mismatch, not the head, target not serving, connection lost) is retried with backoff
  after refreshing routing (:meth:`RoutingCache.refresh_soon`), under the same (client id, request
  id, channel, sequence number) tag, so the head recognises a retry of a write it already applied.
  Non-retryable errors (invalid argument, checksum mismatch, no space, chunk too large) raise at
  once as :class:`fs3.errors.FS3Error`.
- **Reads** go to one SERVING replica, chosen for load (the node with the fewest calls in flight
  from this client); replicas answer with the newest committed version (CRAQ apportioned query),
  so reads are linearizable. A chunk that does not exist reads as empty; a read past the chunk's
  end is short. The data's CRC32C is checked on arrival.
- Everything runs until ``retry.total_s`` has passed, then the last error is raised.

Chunk-level calls take the chain explicitly (the file layout is the metadata service's business);
:meth:`StorageClient.write_range` and :meth:`StorageClient.read_range` split a byte range of a file
at chunk boundaries given a ``chain_of(chunk_index)`` function.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import crc32c as _crc32c

from fs3 import capability
from fs3.capability import CapabilityCache
from fs3.client.routing import Routing, RoutingCache
from fs3.errors import FS3Error, StatusCode, fresh_error
from fs3.net import RpcClient, ServiceDef
from fs3.net.transport import Address
from fs3.proto import common_pb2, mgmtd_pb2, rpc_pb2, storage_pb2

log = logging.getLogger(__name__)

STORAGE_SERVICE = ServiceDef(
    rpc_pb2.SERVICE_STORAGE,
    "storage",
    {
        storage_pb2.METHOD_STORAGE_BATCH_READ: (
            "BatchRead",
            storage_pb2.BatchReadReq,
            storage_pb2.BatchReadRsp,
        ),
        storage_pb2.METHOD_STORAGE_WRITE: ("Write", storage_pb2.WriteReq, storage_pb2.IOResult),
        storage_pb2.METHOD_STORAGE_UPDATE: ("Update", storage_pb2.UpdateReq, storage_pb2.IOResult),
        storage_pb2.METHOD_STORAGE_QUERY_COMMITTED: (
            "QueryCommitted",
            storage_pb2.QueryCommittedReq,
            storage_pb2.QueryCommittedRsp,
        ),
        storage_pb2.METHOD_STORAGE_QUERY_LAST_CHUNK: (
            "QueryLastChunk",
            storage_pb2.QueryLastChunkReq,
            storage_pb2.QueryLastChunkRsp,
        ),
        storage_pb2.METHOD_STORAGE_TRUNCATE_CHUNKS: (
            "TruncateChunks",
            storage_pb2.TruncateChunksReq,
            storage_pb2.TruncateChunksRsp,
        ),
        storage_pb2.METHOD_STORAGE_REMOVE_CHUNKS: (
            "RemoveChunks",
            storage_pb2.RemoveChunksReq,
            storage_pb2.RemoveChunksRsp,
        ),
        storage_pb2.METHOD_STORAGE_SYNC_START: (
            "SyncStart",
            storage_pb2.SyncStartReq,
            storage_pb2.SyncStartRsp,
        ),
        storage_pb2.METHOD_STORAGE_SYNC_DONE: ("SyncDone", storage_pb2.SyncDoneReq, storage_pb2.SyncDoneRsp),
        storage_pb2.METHOD_STORAGE_SPACE_INFO: (
            "SpaceInfo",
            storage_pb2.SpaceInfoReq,
            storage_pb2.SpaceInfoRsp,
        ),
        storage_pb2.METHOD_STORAGE_DUMP_CHUNK_META: (
            "DumpChunkMeta",
            storage_pb2.DumpChunkMetaReq,
            storage_pb2.DumpChunkMetaRsp,
        ),
    },
)

MAX_IO_BYTES = 64 << 20  # the largest chunk size: no single chunk I/O is longer
# What one BatchRead may ask of a storage node (it refuses more): a batch read of more goes to
# the node in several calls.
MAX_BATCH_READS = 4096
MAX_BATCH_READ_BYTES = 64 << 20


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC32C (Castagnoli) of ``data``."""
    return _crc32c.crc32c(data)


@dataclass(slots=True, frozen=True)
class IOResult:
    """Outcome of one chunk update: the chunk's length, versions and whole-chunk CRC32C after it."""

    length: int
    committed_version: int
    update_version: int
    crc32c: int
    chain_version: int

    @classmethod
    def from_pb(cls, r: storage_pb2.IOResult) -> IOResult:
        return cls(r.length, r.committed_version, r.update_version, r.crc32c, r.commit_chain_version)


class LastChunk(NamedTuple):
    """What :meth:`StorageClient.query_last_chunk` finds of one file on one chain."""

    found: bool
    last_chunk_index: int
    last_chunk_length: int
    total_length: int
    chunk_count: int


@dataclass(slots=True, frozen=True)
class ReadRequest:
    """One piece of a batch read."""

    chain_id: int
    inode_id: int
    chunk_index: int
    offset: int
    length: int


@dataclass(slots=True)
class RetryPolicy:
    """Backoff for retryable errors: ``initial_s`` doubling up to ``max_s``, for ``total_s`` in all;
    each attempt has ``rpc_timeout_s`` (a write includes the chain's forwarding)."""

    total_s: float = 60.0
    initial_s: float = 0.05
    max_s: float = 1.0
    rpc_timeout_s: float = 10.0


_ROUTING_CODES = frozenset(
    {
        StatusCode.STORAGE_CHAIN_VERSION_MISMATCH,
        StatusCode.STORAGE_NOT_HEAD,
        StatusCode.STORAGE_TARGET_NOT_SERVING,
        StatusCode.STORAGE_TARGET_OFFLINE,
        StatusCode.STORAGE_ROUTING_STALE,
        StatusCode.MGMTD_UNKNOWN_TARGET,
        StatusCode.MGMTD_UNKNOWN_NODE,
    }
)
# Also retried: the call's outcome is unknown, and a write is retried under the same tag. (A daemon
# stopping gracefully answers the calls it cuts short UNAVAILABLE; CANCELLED is not here, as it means
# our own RpcClient was closed, where a retry cannot succeed.)
_TRANSIENT_CODES = frozenset(
    {
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.RPC_CONNECTION_CLOSED,
        StatusCode.RPC_CONNECT_FAILED,
        StatusCode.UNAVAILABLE,
        StatusCode.ABORTED,
        StatusCode.STORAGE_IO_ERROR,
    }
)


def _retryable(e: FS3Error) -> bool:
    return e.code in _ROUTING_CODES or e.code in _TRANSIENT_CODES


def _batches(group: list[tuple[int, int]], ios: Sequence[ReadRequest]) -> list[list[tuple[int, int]]]:
    """``group`` (request index, target) of one node cut into calls a node takes: at most
    MAX_BATCH_READS reads and MAX_BATCH_READ_BYTES bytes each (one read is never longer)."""
    out: list[list[tuple[int, int]]] = [[]]
    size = 0
    for item in group:
        n = ios[item[0]].length
        if out[-1] and (len(out[-1]) == MAX_BATCH_READS or size + n > MAX_BATCH_READ_BYTES):
            out.append([])
            size = 0
        out[-1].append(item)
        size += n
    return out


def node_address(routing: Routing, target_id: int, *, backend: bool = False) -> Address:
    """The fs3 RPC address of the storage node holding ``target_id``.

    A storage node lists its client endpoint first and, when it has a separate network for
    chain replication, that endpoint second; ``backend=True`` (storage daemons talking to each
    other) picks the latter where there is one.
    """
    address = routing.addresses.get((target_id, backend))
    if address is not None:
        return address
    node = routing.node_of_target(target_id)
    tcp = [ep for ep in node.endpoints if ep.transport in ("", "tcp")]
    if not tcp:
        raise FS3Error(StatusCode.STORAGE_TARGET_OFFLINE, f"node {node.node_id} has no tcp endpoint")
    ep = tcp[-1] if backend else tcp[0]
    address = routing.addresses[(target_id, backend)] = (ep.host, ep.port)
    return address


# the nodes clients and storage daemons call: meta (namespace) and storage (chunks)
_SERVING_NODES = (common_pb2.NODE_STORAGE, common_pb2.NODE_META)


def failed_nodes(routing: Routing) -> set[int]:
    """The storage and meta nodes mgmtd has declared failed in ``routing``."""
    return {
        n.node_id
        for n in routing.nodes.values()
        if n.type in _SERVING_NODES and n.status == mgmtd_pb2.NODE_STATUS_FAILED
    }


def drop_failed_nodes(rpc: RpcClient, routing: Routing, failed: set[int]) -> None:
    """A routing listener: abort ``rpc``'s connections to each storage or meta node mgmtd has
    declared failed since the last call (``failed``: the nodes failed then, updated here).

    A node that hangs (stopped, swapping, a frozen VM) keeps its connections open and answers
    nothing: every call in flight to it would wait out its whole deadline (30 s in a mount) even
    though mgmtd, once the node's heartbeats stop, takes a storage node's targets out of their
    chains, and a meta node out of the active ones, within its heartbeat timeout. Dropped, those
    calls fail as a lost connection does, and their callers retry them on the new routing
    (another replica, the new head, the next successor, another meta server)."""
    now = failed_nodes(routing)
    for node_id in now - failed:
        for ep in routing.nodes[node_id].endpoints:
            if ep.transport in ("", "tcp") and rpc.drop_peer(
                (ep.host, ep.port), f"node {node_id} failed (mgmtd stopped hearing from it)"
            ):
                log.info("dropped the connections to a failed node node_id=%d", node_id)
    failed.clear()
    failed.update(now)


class _Channels:
    """Update channels: a write holds one for its lifetime; each new write on a channel takes the
    next sequence number, and its retries repeat it (so the head can tell a retry from a new write)."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._seq: dict[int, int] = {}
        self._next = 1

    def acquire(self) -> tuple[int, int]:
        ch = self._free.pop() if self._free else self._new()
        self._seq[ch] += 1
        return ch, self._seq[ch]

    def _new(self) -> int:
        ch = self._next
        self._next += 1
        self._seq[ch] = 0
        return ch

    def release(self, ch: int) -> None:
        self._free.append(ch)


#: reads up to this long may wait a few loop turns to go out in a batch (StorageClient.read_into)
COALESCE_MAX_BYTES = 64 << 10


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if not fut.done():
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)


class StorageClient:
    """Chunk I/O on storage chains.

    ``routing`` is a started :class:`RoutingCache` (it gives chains, their targets and nodes);
    ``rpc`` an :class:`fs3.net.RpcClient` holding the cluster secret (one per process, shared with
    other clients; the caller closes it). ``client_id`` identifies this client's updates for
    exactly-once retries (random by default). ``user`` is sent with every request.

    A client that is not a cluster member (``rpc`` opens user connections with its token) passes
    ``capabilities``, where it keeps the capabilities meta issued it (:mod:`fs3.capability`):
    each write and read then carries its file's, and one that storage refuses (expired by
    storage's clock, say) is dropped and the call made once more with a fresh one from meta; a
    second refusal is the caller's (STORAGE_CAPABILITY, EACCES). Such a client can only write
    data and read: every other call here is for cluster members.
    """

    def __init__(
        self,
        routing: RoutingCache,
        rpc: RpcClient,
        *,
        client_id: int | None = None,
        retry: RetryPolicy | None = None,
        user: common_pb2.UserInfo | None = None,
        verify_read_checksum: bool = True,
        coalesce_turns: int = 0,
        capabilities: CapabilityCache | None = None,
    ) -> None:
        self.routing = routing
        self.rpc = rpc
        failed = failed_nodes(routing.routing)
        routing.add_listener(lambda r: drop_failed_nodes(rpc, r, failed))
        self.capabilities = capabilities
        self.client_id = client_id or secrets.randbits(63) | 1
        self.retry = retry or RetryPolicy()
        self.user = user or common_pb2.UserInfo()
        self.verify_read_checksum = verify_read_checksum
        self._request_ids = itertools.count(1)
        self._channels = _Channels()
        self._inflight: dict[Address, int] = {}
        self._served: dict[Address, int] = {}
        # read_into: reads waiting for the next batch, and how many loop turns it waits
        self.coalesce_turns = coalesce_turns
        self._waiting: list[tuple[ReadRequest, memoryview, asyncio.Future[int]]] = []
        self._reading = 0  # small reads of read_into at storage now
        self.batches = 0  # batches read_into sent, and the reads in them (for metrics)
        self.batched_reads = 0
        # (operation, status code name) -> calls that failed and were tried again (for metrics):
        # retries hide the errors from the caller, not the trouble
        self.retries: dict[tuple[str, str], int] = {}

    # -- chunk updates ----------------------------------------------------------------------------

    async def write(
        self,
        chain_id: int,
        inode_id: int,
        chunk_index: int,
        offset: int,
        data: bytes | bytearray | memoryview,
        chunk_size: int,
        extents: Sequence[tuple[int, int]] = (),
        fence: Callable[[], Awaitable[None]] | None = None,
    ) -> IOResult:
        """Write ``data`` at ``offset`` of one chunk (``offset + len(data) <= chunk_size``).

        With ``extents`` (``(offset, length)`` pairs, increasing and apart), a write of several
        ranges of the chunk as one update, their bytes back to back in ``data`` (``offset`` is then
        the first one's): the chunk changes from one version to the next with all of them or none.
        ``fence`` is awaited before each attempt is sent; what it raises ends the write."""
        n = memoryview(data).nbytes
        end = extents[-1][0] + extents[-1][1] if extents else offset + n
        if offset < 0 or n == 0 or end > chunk_size:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT,
                f"write of {n} bytes at {offset} does not fit a chunk of {chunk_size}",
            )
        io = storage_pb2.UpdateIO(
            type=storage_pb2.UPDATE_WRITE, offset=offset, length=n, chunk_size=chunk_size, crc32c=crc32c(data)
        )
        if len(extents) > 1:  # the storage service checks them (UpdateIO.extents)
            for start, length in extents:
                io.extents.add(offset=start, length=length)
        return await self._update(chain_id, inode_id, chunk_index, io, data, fence)

    async def truncate_chunk(
        self, chain_id: int, inode_id: int, chunk_index: int, length: int, chunk_size: int
    ) -> IOResult:
        """Cut or zero-extend one chunk to ``length`` bytes (creating it if needed)."""
        io = storage_pb2.UpdateIO(type=storage_pb2.UPDATE_TRUNCATE, length=length, chunk_size=chunk_size)
        return await self._update(chain_id, inode_id, chunk_index, io, None)

    async def remove_chunk(self, chain_id: int, inode_id: int, chunk_index: int) -> IOResult:
        """Remove one chunk (no error if it does not exist)."""
        io = storage_pb2.UpdateIO(type=storage_pb2.UPDATE_REMOVE)
        return await self._update(chain_id, inode_id, chunk_index, io, None)

    async def _update(
        self,
        chain_id: int,
        inode_id: int,
        chunk_index: int,
        io: storage_pb2.UpdateIO,
        payload: bytes | bytearray | memoryview | None,
        fence: Callable[[], Awaitable[None]] | None = None,
    ) -> IOResult:
        channel, seq = self._channels.acquire()
        try:
            tag = storage_pb2.UpdateTag(
                client_id=self.client_id, request_id=next(self._request_ids), channel=channel, seqnum=seq
            )
            req = storage_pb2.WriteReq(user=self.user, tag=tag, io=io)
            req.io.key.chain_id = chain_id
            req.io.key.inode_id = inode_id
            req.io.key.chunk_index = chunk_index
            caps = self.capabilities
            renewed = False

            # Not recursive (a closure naming itself is a reference cycle, which would keep the
            # payload until a full collection of the cyclic GC: in a mount, gigabytes).
            async def attempt(routing: Routing) -> IOResult:
                nonlocal renewed
                chain = routing.chain(chain_id)
                head = chain.head
                if head is None:
                    raise FS3Error(StatusCode.STORAGE_TARGET_NOT_SERVING, f"chain {chain_id} has no head")
                req.io.key.chain_version = chain.version
                while True:
                    if caps is not None:
                        req.capability = caps.now(inode_id, capability.WRITE) or await caps.get(
                            inode_id, capability.WRITE
                        )
                    if fence is not None:  # the last wait before the send
                        await fence()
                    try:
                        rsp, _ = await self.rpc.call(
                            node_address(routing, head.target_id),
                            STORAGE_SERVICE["Write"],
                            req,
                            payload=payload,
                            timeout=self.retry.rpc_timeout_s,
                        )
                    except FS3Error as e:
                        if e.code != StatusCode.STORAGE_CAPABILITY or caps is None or renewed:
                            raise
                        # refused before anything was done: once more, with a fresh one from meta
                        renewed = True
                        caps.drop(inode_id, req.capability)
                        continue
                    return IOResult.from_pb(rsp)

            return await self._with_retry(
                "update", f"chain={chain_id} inode={inode_id:#x}/{chunk_index}", attempt, chain_id
            )
        finally:
            self._channels.release(channel)

    async def remove_chunks(self, chain_id: int, inode_id: int, begin_index: int, end_index: int = 0) -> int:
        """Remove the file's chunks with ``begin_index <= index < end_index`` (0 = to the last) on
        one chain; returns how many the head held."""
        req = storage_pb2.RemoveChunksReq(
            user=self.user, chain_id=chain_id, inode_id=inode_id, begin_index=begin_index, end_index=end_index
        )

        async def attempt(routing: Routing) -> int:
            address, req.chain_version = self._head(routing, chain_id)
            rsp, _ = await self.rpc.call(
                address, STORAGE_SERVICE["RemoveChunks"], req, timeout=self.retry.rpc_timeout_s
            )
            return rsp.removed

        return await self._with_retry("remove", f"chain={chain_id} inode={inode_id:#x}", attempt, chain_id)

    async def truncate_chunks(
        self, chain_id: int, inode_id: int, chunk_size: int, length: int, *, timeout_s: float | None = None
    ) -> storage_pb2.TruncateChunksRsp:
        """Make the file's chunks on one chain fit a file of ``length`` bytes: chunks wholly beyond
        it are removed, and the chunk holding the new end, if this chain has it, is cut (or
        zero-extended) to end there. A chunk the chain does not hold is not created.

        ``timeout_s``: retries stop then, and each call carries what is left as its deadline, which
        the head honours: it changes no chunk once that has passed (a truncate whose caller gave
        up must not land after what came next)."""
        req = storage_pb2.TruncateChunksReq(
            user=self.user, chain_id=chain_id, inode_id=inode_id, chunk_size=chunk_size, length=length
        )
        end = None if timeout_s is None else time.monotonic() + timeout_s

        async def attempt(routing: Routing) -> storage_pb2.TruncateChunksRsp:
            address, req.chain_version = self._head(routing, chain_id)
            timeout = self.retry.rpc_timeout_s
            if end is not None:
                timeout = min(timeout, end - time.monotonic())
                if timeout <= 0:
                    raise FS3Error(StatusCode.DEADLINE_EXCEEDED, "truncate: the caller's deadline passed")
            rsp, _ = await self.rpc.call(address, STORAGE_SERVICE["TruncateChunks"], req, timeout=timeout)
            return rsp

        return await self._with_retry(
            "truncate", f"chain={chain_id} inode={inode_id:#x}", attempt, chain_id, total_s=timeout_s
        )

    # -- reads ------------------------------------------------------------------------------------

    async def read(self, chain_id: int, inode_id: int, chunk_index: int, offset: int, length: int) -> bytes:
        """Read ``length`` bytes at ``offset`` of one chunk; short where the chunk ends, empty if
        the chunk does not exist."""
        (data,) = await self.batch_read([ReadRequest(chain_id, inode_id, chunk_index, offset, length)])
        return data

    async def batch_read(self, ios: Sequence[ReadRequest]) -> list[bytes]:
        """Read several chunk ranges at once: one call per storage node, nodes in parallel.

        Returns the data of each request in order (short or empty as :meth:`read` says); raises
        the first non-retryable error.
        """
        return await self._batch_read(ios, None)  # type: ignore[return-value]

    async def batch_read_into(
        self, ios: Sequence[ReadRequest], buffers: Sequence[bytearray | memoryview]
    ) -> list[int]:
        """Like :meth:`batch_read`, but the data of ``ios[i]`` lands in ``buffers[i]`` (writable, at
        least ``ios[i].length`` bytes) and the lengths read are returned. A request that is alone in
        its call to a node is received straight into its buffer, without a copy. After an error the
        buffers' contents are undefined."""
        if len(buffers) != len(ios):
            raise ValueError("one buffer per read request")
        sinks = [memoryview(b).cast("B") if not isinstance(b, memoryview) else b.cast("B") for b in buffers]
        for io, sink in zip(ios, sinks, strict=True):
            if sink.readonly or len(sink) < io.length:
                raise ValueError(f"buffer of {len(sink)} bytes cannot take a read of {io.length}")
        return await self._batch_read(ios, sinks)  # type: ignore[return-value]

    async def read_into(self, io: ReadRequest, sink: memoryview) -> int:
        """One read into ``sink`` (a writable byte view of at least ``io.length``); returns the
        length read. With ``coalesce_turns``, small reads (up to ``COALESCE_MAX_BYTES``) that arrive
        within that many turns of the event loop of each other while others are at storage go out
        together as one batch (one call per storage node), which costs the nodes and this client
        one request each instead of one per read; a read that finds none at storage goes at once."""
        if not self.coalesce_turns or io.length > COALESCE_MAX_BYTES:
            # a large read alone is received straight into its sink; in a batch it would wait for
            # the others and be copied out of the shared reply
            return (await self._batch_read([io], [sink]))[0]  # type: ignore[return-value]
        if not self._reading and not self._waiting:
            # nothing of ours is at storage: no read is likely to join this one, so waiting for
            # one would only add to its latency
            self._reading += 1
            try:
                return (await self._batch_read([io], [sink]))[0]  # type: ignore[return-value]
            finally:
                self._reading -= 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((io, sink, fut))
        if len(self._waiting) == 1:
            asyncio.get_running_loop().call_soon(self._coalesce, 1)
        try:
            return await fut
        finally:
            del fut  # an error's traceback holds this frame: no cycle through the future to the sink

    def _coalesce(self, turn: int) -> None:
        if turn < self.coalesce_turns:
            asyncio.get_running_loop().call_soon(self._coalesce, turn + 1)
            return
        batch, self._waiting = self._waiting, []
        self.batches += 1
        self.batched_reads += len(batch)
        asyncio.get_running_loop().create_task(self._read_batch(batch))

    async def _read_batch(self, batch: list[tuple[ReadRequest, memoryview, asyncio.Future[int]]]) -> None:
        self._reading += len(batch)
        try:
            await self._read_batch_now(batch)
        finally:
            self._reading -= len(batch)

    async def _read_batch_now(self, batch: list[tuple[ReadRequest, memoryview, asyncio.Future[int]]]) -> None:
        try:
            # each read is answered as soon as its own result is in, not after retries of others
            await self._batch_read(
                [b[0] for b in batch], [b[1] for b in batch], lambda i, n: _settle(batch[i][2], n, None)
            )
        except asyncio.CancelledError:
            for _, _, fut in batch:
                fut.cancel()
            raise
        except Exception as e:
            left = [b for b in batch if not b[2].done()]
            if len(left) == 1:
                # not ``e`` itself: its traceback holds this frame, which holds the batch and so
                # the future that would hold ``e`` (a cycle keeping the caller's buffer)
                _settle(left[0][2], None, fresh_error(e))
                return
            # one read's error must not fail the others: each alone, with its own outcome
            outcomes = await asyncio.gather(
                *(self._batch_read([io], [sink]) for io, sink, _ in left), return_exceptions=True
            )
            for (_, _, fut), out in zip(left, outcomes, strict=True):
                _settle(fut, None, out) if isinstance(out, BaseException) else _settle(fut, out[0], None)

    async def _batch_read(
        self,
        ios: Sequence[ReadRequest],
        sinks: list[memoryview] | None,
        done: Callable[[int, Any], None] | None = None,
    ) -> list[bytes | int]:
        """The reads of a batch; ``done(i, result)`` is called as each one's result comes in."""
        for io in ios:
            if io.offset < 0 or io.length < 0 or io.offset + io.length > MAX_IO_BYTES:
                raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad read range {io.offset}+{io.length}")
        await self._known_chains({io.chain_id for io in ios})
        caps = self.capabilities
        held: dict[int, bytes] | None = None  # a user connection's capability of each file read
        renewed: set[int] = set()  # files whose capability storage refused once
        if caps is not None:
            held = {}
            for io in ios:
                if io.inode_id not in held:
                    held[io.inode_id] = caps.now(io.inode_id, capability.READ) or await caps.get(
                        io.inode_id, capability.READ
                    )
        results: list[bytes | int | None] = [None] * len(ios)
        failed: dict[int, set[int]] = {}  # request index -> targets that failed it
        corrupt: dict[int, set[int]] = {}  # request index -> targets whose copy failed its CRC
        deadline = time.monotonic() + self.retry.total_s
        backoff = self.retry.initial_s
        last: FS3Error | None = None
        while True:
            todo = [i for i, r in enumerate(results) if r is None]
            if not todo:
                return results  # type: ignore[return-value]
            routing = self.routing.routing
            groups: dict[Address, list[tuple[int, int]]] = {}
            retry = False
            for i in todo:
                try:
                    target = self._pick_reader(routing, ios[i].chain_id, failed.get(i, set()))
                    address = node_address(routing, target)
                except FS3Error as e:
                    if not _retryable(e):
                        raise
                    last, retry = e, True
                    self._retried("read", e)
                    failed.pop(i, None)  # every replica was tried: start over with fresh routing
                    continue
                groups.setdefault(address, []).append((i, target))
            outcomes = await asyncio.gather(
                *(
                    self._read_group(routing, a, part, ios, results, sinks, held)
                    for a, g in groups.items()
                    for part in _batches(g, ios)
                )
            )
            if done is not None:
                for i in todo:
                    if results[i] is not None:
                        done(i, results[i])
            refused: set[int] = set()
            for errors in outcomes:
                for i, target, e in errors:
                    if e.code == StatusCode.STORAGE_CAPABILITY and held is not None:
                        if ios[i].inode_id in renewed:
                            raise e
                        refused.add(ios[i].inode_id)
                        continue
                    if e.code == StatusCode.STORAGE_CHECKSUM_MISMATCH:
                        # That replica's copy is damaged (or the reply was, on the way): another
                        # replica serves the read; only when every one fails it is it an error.
                        bad = corrupt.setdefault(i, set())
                        bad.add(target)
                        if set(routing.readable(ios[i].chain_id)) <= bad:
                            raise e
                    elif not _retryable(e):
                        raise e
                    last, retry = e, True
                    self._retried("read", e)
                    failed.setdefault(i, set()).add(target)
            if refused:
                # refused before anything was read: once more, with fresh ones from meta
                assert caps is not None and held is not None
                for inode_id in refused:
                    caps.drop(inode_id, held[inode_id])
                    held[inode_id] = await caps.get(inode_id, capability.READ)
                renewed |= refused
                if not retry:
                    continue
            if not retry and all(r is not None for r in results):
                return results  # type: ignore[return-value]
            self.routing.refresh_soon()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last or FS3Error(StatusCode.DEADLINE_EXCEEDED, "read retries exhausted")
            await asyncio.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, self.retry.max_s)

    def _pick_reader(self, routing: Routing, chain_id: int, exclude: set[int]) -> int:
        readable = routing.readable(chain_id)
        serving = [t for t in readable if t not in exclude] if exclude else readable
        serving = serving or readable
        if not serving:
            raise FS3Error(StatusCode.STORAGE_TARGET_NOT_SERVING, f"chain {chain_id} has no serving target")

        def load(t: int) -> tuple[int, int, float]:
            try:
                a = node_address(routing, t)
            except FS3Error:
                return (1 << 30, 0, 0.0)
            return (self._inflight.get(a, 0), self._served.get(a, 0), random.random())

        return min(serving, key=load)

    async def _read_group(
        self,
        routing: Routing,
        address: Address,
        group: list[tuple[int, int]],
        ios: Sequence[ReadRequest],
        results: list[bytes | int | None],
        sinks: list[memoryview] | None,
        caps: dict[int, bytes] | None,
    ) -> list[tuple[int, int, FS3Error]]:
        req = storage_pb2.BatchReadReq(user=self.user)
        for i, _ in group:
            io = ios[i]
            r = req.ios.add(offset=io.offset, length=io.length)
            r.key.chain_id = io.chain_id
            r.key.chain_version = routing.chain(io.chain_id).version
            r.key.inode_id = io.inode_id
            r.key.chunk_index = io.chunk_index
            if caps is not None:
                r.capability = caps[io.inode_id]
        self._inflight[address] = self._inflight.get(address, 0) + len(group)
        # The reply lands in a pooled buffer: a fresh one per call would be zeroed (and page-faulted
        # in) by the allocator first, which costs more than the copy out below.
        pool = self.rpc.pool
        direct = sinks is not None and len(group) == 1
        buf = None if direct else pool.acquire(max(1, sum(ios[i].length for i, _ in group)))
        try:
            rsp, payload = await self.rpc.call(
                address,
                STORAGE_SERVICE["BatchRead"],
                req,
                timeout=self.retry.rpc_timeout_s,
                into=sinks[group[0][0]] if direct else buf,  # type: ignore[index]
            )
        except FS3Error as e:
            return [(i, t, e) for i, t in group]  # a late reply may still arrive in buf: not reused
        finally:
            self._inflight[address] -= len(group)
            self._served[address] = self._served.get(address, 0) + len(group)
        try:
            return self._unpack(group, rsp, payload, results, sinks is not None, None if direct else sinks)
        finally:
            if buf is not None:
                pool.release(buf)

    def _unpack(
        self,
        group: list[tuple[int, int]],
        rsp: storage_pb2.BatchReadRsp,
        payload: memoryview | None,
        results: list[bytes | int | None],
        into: bool,
        sinks: list[memoryview] | None,
    ) -> list[tuple[int, int, FS3Error]]:
        """Check each result's CRC32C and store it: as bytes (not ``into``), or as its length after
        copying it into its sink (``sinks``) or finding it received there already (no ``sinks``)."""
        if len(rsp.results) != len(group):
            e = FS3Error(StatusCode.INTERNAL, f"{len(rsp.results)} results for {len(group)} reads")
            return [(i, t, e) for i, t in group]
        view = memoryview(payload) if payload is not None else memoryview(b"")
        errors: list[tuple[int, int, FS3Error]] = []
        for (i, t), res in zip(group, rsp.results, strict=True):
            code = res.status.code
            if code == StatusCode.STORAGE_CHUNK_NOT_FOUND:
                results[i] = 0 if into else b""
                continue
            if code != StatusCode.OK:
                errors.append((i, t, FS3Error(code, res.status.message)))
                continue
            data = view[res.payload_offset : res.payload_offset + res.length]
            if len(data) != res.length or (self.verify_read_checksum and crc32c(data) != res.crc32c):
                errors.append(
                    (
                        i,
                        t,
                        FS3Error(StatusCode.STORAGE_CHECKSUM_MISMATCH, "read data does not match its CRC32C"),
                    )
                )
                continue
            if not into:
                results[i] = bytes(data)
            else:
                if sinks is not None:
                    sinks[i][: len(data)] = data
                results[i] = len(data)
        return errors

    # -- queries ----------------------------------------------------------------------------------

    async def query_last_chunk(self, chain_id: int, inode_id: int) -> LastChunk:
        """The file's last committed chunk on one chain (highest index), its length, and the total
        length and count of the file's chunks there. Asked of the head, which commits last."""
        req = storage_pb2.QueryLastChunkReq(user=self.user, chain_id=chain_id, inode_id=inode_id)

        async def attempt(routing: Routing) -> LastChunk:
            address, req.chain_version = self._head(routing, chain_id)
            rsp, _ = await self.rpc.call(
                address, STORAGE_SERVICE["QueryLastChunk"], req, timeout=self.retry.rpc_timeout_s
            )
            return LastChunk(
                rsp.found, rsp.last_chunk_index, rsp.last_chunk_length, rsp.total_length, rsp.chunk_count
            )

        return await self._with_retry(
            "query_last_chunk", f"chain={chain_id} inode={inode_id:#x}", attempt, chain_id
        )

    async def space_info(self, node_id: int, target_ids: Sequence[int] = ()) -> list[storage_pb2.TargetSpace]:
        """Capacity, use and chunk counts of a storage node's targets (all of them by default)."""
        routing = self.routing.routing
        node = routing.node(node_id)
        address = next((ep.host, ep.port) for ep in node.endpoints if ep.transport in ("", "tcp"))
        rsp, _ = await self.rpc.call(
            address,
            STORAGE_SERVICE["SpaceInfo"],
            storage_pb2.SpaceInfoReq(target_ids=target_ids),
            timeout=self.retry.rpc_timeout_s,
        )
        return list(rsp.targets)

    async def dump_chunk_meta(self, target_id: int, inode_id: int = 0) -> list[storage_pb2.ChunkMeta]:
        """Metadata of every chunk a target holds (only ``inode_id``'s when given), paged."""
        address = node_address(self.routing.routing, target_id)
        out: list[storage_pb2.ChunkMeta] = []
        after = b""
        while True:
            rsp, _ = await self.rpc.call(
                address,
                STORAGE_SERVICE["DumpChunkMeta"],
                storage_pb2.DumpChunkMetaReq(target_id=target_id, inode_id=inode_id, after=after),
                timeout=self.retry.rpc_timeout_s,
            )
            out.extend(rsp.chunks)
            if not rsp.more or not rsp.chunks:
                return out
            after = rsp.chunks[-1].chunk_id

    # -- byte ranges of a file --------------------------------------------------------------------

    async def write_range(
        self,
        chain_of: Callable[[int], int],
        inode_id: int,
        offset: int,
        data: bytes | bytearray | memoryview,
        chunk_size: int,
    ) -> list[IOResult]:
        """Write ``data`` at file ``offset``, split at chunk boundaries, chunks in parallel;
        ``chain_of(chunk_index)`` names each chunk's chain. If a chunk's write fails, the first
        error is raised once every chunk's write has ended: one still retrying must not read the
        caller's buffer after the call returned, nor land after a newer write of its range."""
        view = memoryview(data).cast("B")
        pieces = []
        pos = 0
        while pos < len(view):
            index, within = divmod(offset + pos, chunk_size)
            n = min(chunk_size - within, len(view) - pos)
            pieces.append(
                self.write(chain_of(index), inode_id, index, within, view[pos : pos + n], chunk_size)
            )
            pos += n
        results = await asyncio.gather(*pieces, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def read_range(
        self, chain_of: Callable[[int], int], inode_id: int, offset: int, length: int, chunk_size: int
    ) -> bytes:
        """Read ``length`` bytes at file ``offset`` as one batch. Holes and chunks shorter than the
        range read as zeros (the caller knows the file's length; this does not)."""
        ios: list[ReadRequest] = []
        pos = 0
        while pos < length:
            index, within = divmod(offset + pos, chunk_size)
            n = min(chunk_size - within, length - pos)
            ios.append(ReadRequest(chain_of(index), inode_id, index, within, n))
            pos += n
        parts = await self.batch_read(ios)
        return b"".join(p.ljust(io.length, b"\0") for p, io in zip(parts, ios, strict=True))

    # -- plumbing ---------------------------------------------------------------------------------

    def _head(self, routing: Routing, chain_id: int) -> tuple[Address, int]:
        chain = routing.chain(chain_id)
        head = chain.head
        if head is None:
            raise FS3Error(StatusCode.STORAGE_TARGET_NOT_SERVING, f"chain {chain_id} has no head")
        return node_address(routing, head.target_id), chain.version

    async def _known_chains(self, chain_ids: set[int]) -> None:
        """Raise MGMTD_UNKNOWN_CHAIN for a chain that even a fresh routing snapshot lacks."""
        if chain_ids <= self.routing.routing.chains.keys():
            return
        routing = await self.routing.refresh()
        for cid in chain_ids:
            routing.chain(cid)

    def _retried(self, op: str, e: FS3Error) -> None:
        key = (op, e.code.name)
        self.retries[key] = self.retries.get(key, 0) + 1

    async def _with_retry(  # type: ignore[no-untyped-def]
        self,
        op: str,
        what: str,
        attempt: Callable[[Routing], object],
        chain_id: int | None = None,
        total_s: float | None = None,
    ):
        if chain_id is not None:
            await self._known_chains({chain_id})
        budget = self.retry.total_s if total_s is None else min(total_s, self.retry.total_s)
        deadline = time.monotonic() + budget
        backoff = self.retry.initial_s
        tries = 0
        while True:
            routing = self.routing.routing
            try:
                return await attempt(routing)  # type: ignore[misc]
            except FS3Error as e:
                if not _retryable(e):
                    raise
                tries += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                self._retried(op, e)
                if tries == 1 or tries % 10 == 0:
                    log.info("retrying %s %s tries=%d error=%s", op, what, tries, e)
                self.routing.refresh_soon()
                if e.code in _ROUTING_CODES:
                    # a newer routing usually explains the error: wait briefly for one
                    with contextlib.suppress(FS3Error):
                        await self.routing.wait_for(
                            lambda r, v=routing.version: r.version > v, min(backoff, remaining)
                        )
                        continue
                else:
                    await asyncio.sleep(min(backoff, remaining))
                backoff = min(backoff * 2, self.retry.max_s)
