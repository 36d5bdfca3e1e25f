"""One storage daemon's replication in-process: a ``Replicator`` (and, where wanted, the
``StorageService`` over it) on a real chunk engine, the rest of its chain faked (``FakeChain``
records the updates it would forward and answers as the successors would) or reached through a
real RPC client, and routing applied by hand at the moments a test chooses."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from fs3.client.routing import Routing
from fs3.client.storage_client import crc32c
from fs3.proto import common_pb2, mgmtd_pb2, storage_pb2
from fs3.storage.async_engine import AsyncChunkEngine
from fs3.storage.chain_ops import chunk_id
from fs3.storage.chunk_engine import ChunkEngine
from fs3.storage.craq import Replicator
from fs3.storage.service import StorageService
from fs3.storage.target_map import ONLINE, UPTODATE, LocalTarget, TargetMap

SERVING, SYNCING, OFFLINE = common_pb2.SERVING, common_pb2.SYNCING, common_pb2.OFFLINE
CHUNK = 1 << 20
INODE = 7
CID = chunk_id(INODE, 0)
ALL_SERVING = [(1, SERVING), (2, SERVING), (3, SERVING)]


def routing(version: int, order: list[tuple[int, int]], port_base: int = 9000) -> Routing:
    """Chain 1 at ``version`` with ``order``'s targets (target n on node n, at port_base + n), each
    last heard reporting what its public state implies (UPTODATE where SERVING, else ONLINE)."""
    info = mgmtd_pb2.RoutingInfo(version=version)
    chain = info.chains.add(chain_id=1, version=version)
    for tid, state in order:
        chain.targets.add(target_id=tid, public_state=state)
        local = common_pb2.UPTODATE if state == common_pb2.SERVING else common_pb2.ONLINE
        info.targets.add(target_id=tid, node_id=tid, chain_id=1, public_state=state, local_state=local)
        node = info.nodes.add(node_id=tid, type=common_pb2.NODE_STORAGE)
        node.endpoints.add(host="127.0.0.1", port=port_base + tid, transport="tcp")
    return Routing(info)


class FakeChain:
    """The RPC client of the daemon under test, answering as the rest of the chain: every Update
    succeeds (as if the successor committed it) unless ``on_update`` raises. ``on_update`` runs
    first, with the request, while the update is in flight."""

    def __init__(self) -> None:
        self.updates: list[storage_pb2.UpdateReq] = []
        self.on_update: Callable[[storage_pb2.UpdateReq], Awaitable[None]] | None = None

    async def call(self, address, method, req, *, payload=None, **_):  # type: ignore[no-untyped-def]
        assert method.name == "Update", method.name
        self.updates.append(req)
        if self.on_update is not None:
            await self.on_update(req)
        crc = crc32c(bytes(payload)) if req.io.type == storage_pb2.UPDATE_REPLACE else 0
        return storage_pb2.IOResult(committed_version=req.io.update_version, crc32c=crc), None


class Daemon(SimpleNamespace):
    rep: Replicator
    service: StorageService
    targets: TargetMap
    target: LocalTarget
    engine: ChunkEngine
    chain: Any  # a FakeChain, or the real RPC client the test gave


@contextlib.asynccontextmanager
async def replica_daemons(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Daemon]]]:
    """A factory: ``await make(target_id, order)`` is one daemon holding that target of chain 1,
    at version 1 with ``order``'s targets, its local state the one routing implies; ``chain`` (an
    RPC client) replaces the FakeChain, ``port_base`` places the nodes."""
    executor = ThreadPoolExecutor(4)
    engines: list[AsyncChunkEngine] = []

    async def make(
        target_id: int,
        order: list[tuple[int, int]],
        *,
        chain: Any = None,
        port_base: int = 9000,
        forward_timeout_s: float = 5.0,
    ) -> Daemon:
        engine = AsyncChunkEngine(ChunkEngine(tmp_path / f"t{target_id}"), executor)
        engines.append(engine)
        t = LocalTarget(target_id, tmp_path / f"t{target_id}", engine)
        targets = TargetMap(target_id, [t])
        targets.apply_routing(routing(1, order, port_base))
        t.local_state = UPTODATE if t.public_state == SERVING else ONLINE
        chain = FakeChain() if chain is None else chain
        rep = Replicator(
            targets,
            SimpleNamespace(refresh_soon=lambda: None),  # type: ignore[arg-type]
            chain,
            forward_timeout_s=forward_timeout_s,
        )
        service = StorageService(rep, CollectorRegistry())
        return Daemon(rep=rep, service=service, targets=targets, target=t, engine=engine.engine, chain=chain)

    try:
        yield make
    finally:
        for engine in engines:
            await engine.close()
        executor.shutdown()


def forwarded(data: bytes, offset: int = 0, *, target_id: int = 2, **flags):  # type: ignore[no-untyped-def]
    """An UpdateReq as the predecessor forwards (at chain version 1) a write of ``data`` at
    ``offset`` of chunk CID, as its version 1; with ``commit``, a resync copy of it."""
    req = storage_pb2.UpdateReq(target_id=target_id, **flags)
    io = req.io
    io.key.chain_id, io.key.chain_version, io.key.inode_id, io.key.chunk_index = 1, 1, INODE, 0
    io.type = storage_pb2.UPDATE_REPLACE if flags.get("commit") else storage_pb2.UPDATE_WRITE
    io.offset, io.length, io.chunk_size, io.crc32c = offset, len(data), CHUNK, crc32c(data)
    io.update_version = 1
    return req


def client_write(data: bytes, offset: int = 0, index: int = 0) -> storage_pb2.WriteReq:
    """A client's write of ``data`` at ``offset`` of chunk ``index`` of INODE, on chain 1 at 1."""
    req = storage_pb2.WriteReq()
    io = req.io
    io.key.chain_id, io.key.chain_version, io.key.inode_id, io.key.chunk_index = 1, 1, INODE, index
    io.type = storage_pb2.UPDATE_WRITE
    io.offset, io.length, io.chunk_size, io.crc32c = offset, len(data), CHUNK, crc32c(data)
    return req
