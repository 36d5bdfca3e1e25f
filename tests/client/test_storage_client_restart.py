"""A chunk write across a storage daemon's graceful restart (SIGTERM, as in a rolling upgrade): the
write in progress is retried under its tag once the daemon is back, not failed. And a finished
write keeps none of its bytes alive."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest
from cluster import wait_until
from prometheus_client import CollectorRegistry

from fs3.client.fuse_ops import FuseMetrics
from fs3.client.routing import Routing
from fs3.client.storage_client import STORAGE_SERVICE, RetryPolicy, StorageClient, crc32c
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer
from fs3.net.service import CallContext
from fs3.proto import common_pb2, mgmtd_pb2, storage_pb2

pytestmark = pytest.mark.timeout(60)

SECRET = b"storage-restart-test-secret-0123"
CHAIN, TARGET, NODE = 7, 701, 3


def _written(io: storage_pb2.UpdateIO) -> storage_pb2.IOResult:
    """A storage daemon's answer to a write of ``io`` (version 1)."""
    return storage_pb2.IOResult(
        length=io.offset + io.length,
        committed_version=1,
        update_version=1,
        crc32c=io.crc32c,
        commit_chain_version=io.key.chain_version,
    )


class StaticRouting:
    """A RoutingCache that never changes: one chain of one target on one node at ``address``."""

    def __init__(self, address: tuple[str, int]) -> None:
        info = mgmtd_pb2.RoutingInfo(version=1)
        info.nodes.add(node_id=NODE).endpoints.add(host=address[0], port=address[1], transport="tcp")
        info.targets.add(target_id=TARGET, node_id=NODE, chain_id=CHAIN, public_state=common_pb2.SERVING)
        info.chains.add(chain_id=CHAIN, version=1).targets.add(
            target_id=TARGET, public_state=common_pb2.SERVING
        )
        self.routing = Routing(info)

    def refresh_soon(self) -> None:
        pass

    def add_listener(self, fn: Any) -> None:
        pass  # never changes

    async def refresh(self) -> Routing:
        return self.routing

    async def wait_for(self, predicate: Any, timeout_s: float) -> Routing:
        await asyncio.sleep(timeout_s)
        raise FS3Error(StatusCode.DEADLINE_EXCEEDED, "routing does not change here")


class FakeStorage:
    """Write: records each request's tag and bytes; with ``hold``, waits until cancelled (by the
    server's stop) instead of answering."""

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.writes: list[tuple[tuple[int, int, int, int], bytes]] = []

    def handlers(self) -> dict[str, Any]:
        async def refuse(request: Any, payload: Any, ctx: CallContext) -> Any:
            raise FS3Error(StatusCode.NOT_IMPLEMENTED, ctx.method.name)

        table: dict[str, Any] = {meth.name: refuse for meth in STORAGE_SERVICE}
        table["Write"] = self.write
        return table

    async def write(self, request: storage_pb2.WriteReq, payload: Any, ctx: CallContext) -> Any:
        t = request.tag
        self.writes.append(((t.client_id, t.request_id, t.channel, t.seqnum), bytes(payload)))
        if self.hold:
            await asyncio.Event().wait()
        return _written(request.io)


async def _serve(fake: FakeStorage, address: tuple[str, int]) -> RpcServer:
    server = RpcServer(SECRET, identity="storage")
    server.add_service(STORAGE_SERVICE, fake.handlers())
    await server.start(address)
    return server


async def test_a_write_in_progress_survives_a_graceful_restart_of_the_head() -> None:
    before, after = FakeStorage(hold=True), FakeStorage(hold=False)
    server = await _serve(before, ("127.0.0.1", 0))
    address = server.address
    rpc = RpcClient(SECRET)
    client = StorageClient(
        StaticRouting(address),  # type: ignore[arg-type]
        rpc,
        retry=RetryPolicy(total_s=20, initial_s=0.01, max_s=0.2, rpc_timeout_s=10),
    )
    data = b"checkpoint bytes" * 1000
    try:
        write = asyncio.ensure_future(client.write(CHAIN, 0x1234, 0, 0, data, 1 << 20))
        await wait_until(lambda: len(before.writes) == 1, 10, "the write to reach the head", interval_s=0.005)
        await server.stop()  # SIGTERM: the daemon stops serving, the write in progress is cut short
        server = await _serve(after, address)  # and it is back
        result = await asyncio.wait_for(write, 15)
        assert result.length == len(data) and result.crc32c == crc32c(data)
        # the same update, retried: same tag (so the head can tell), same bytes
        assert after.writes == before.writes
    finally:
        await rpc.close()
        await server.stop()


class Payload(bytearray):
    """A write's bytes that can be watched with a weak reference."""


async def test_a_writes_bytes_are_freed_by_reference_counting_once_it_returns() -> None:
    """Nothing of a finished write may keep its bytes in a reference cycle: a mount runs the cyclic
    collector seldom (fs3.daemon.settle_gc), so bytes kept so stayed for gigabytes of writes."""
    fake = FakeStorage(hold=False)
    server = await _serve(fake, ("127.0.0.1", 0))
    rpc = RpcClient(SECRET)
    client = StorageClient(StaticRouting(server.address), rpc)  # type: ignore[arg-type]
    gc.disable()
    try:
        for _ in range(3):
            data = Payload(b"x" * 100_000)
            watch = weakref.ref(data)
            result = await client.write(CHAIN, 0x1234, 0, 0, data, 1 << 20)
            assert result.length == 100_000
            del data
            assert watch() is None, "a finished write's bytes are still referenced"
    finally:
        gc.enable()
        await rpc.close()
        await server.stop()


async def test_a_range_write_that_fails_returns_only_once_every_chunk_write_ended() -> None:
    """write_range over two chunks: the first fails at once (NO_SPACE), the second is retrying
    (UNAVAILABLE). It raised at once while the second went on retrying with the caller's buffer,
    which the caller, told the call had failed, reuses (and may write the range again)."""
    chunk = 8192
    tries: dict[int, int] = {}
    received: list[tuple[int, bytes]] = []

    async def write(request: storage_pb2.WriteReq, payload: Any, ctx: CallContext) -> Any:
        index = request.io.key.chunk_index
        tries[index] = tries.get(index, 0) + 1
        received.append((index, bytes(payload)))
        if index == 0:
            raise FS3Error(StatusCode.STORAGE_NO_SPACE, "full")
        if tries[index] == 1:
            await asyncio.sleep(0.2)
            raise FS3Error(StatusCode.UNAVAILABLE, "busy, try again")
        return _written(request.io)

    async def refuse(request: Any, payload: Any, ctx: CallContext) -> Any:
        raise FS3Error(StatusCode.NOT_IMPLEMENTED, "not in this test")

    server = RpcServer(SECRET, identity="storage")
    server.add_service(STORAGE_SERVICE, {**{m.name: refuse for m in STORAGE_SERVICE}, "Write": write})
    await server.start(("127.0.0.1", 0))
    rpc = RpcClient(SECRET)
    client = StorageClient(
        StaticRouting(server.address),  # type: ignore[arg-type]
        rpc,
        retry=RetryPolicy(total_s=5, initial_s=0.05, max_s=0.1, rpc_timeout_s=2),
    )
    data = bytearray(b"A" * (2 * chunk))
    try:
        with pytest.raises(FS3Error) as e:
            await client.write_range(lambda i: CHAIN, 0x99, 0, data, chunk)
        assert e.value.code == StatusCode.STORAGE_NO_SPACE
        assert tries[1] == 2  # the second chunk's write ended (its retry answered) first
        data[:] = b"Z" * len(data)  # the caller reuses its buffer
        await asyncio.sleep(0.5)
        assert [(i, p[:1]) for i, p in received if i == 1] == [(1, b"A"), (1, b"A")]
        # the retry is counted, and a mount's /metrics shows it (retries hide errors, not trouble)
        assert client.retries == {("update", "UNAVAILABLE"): 1}
        reg = CollectorRegistry()
        FuseMetrics(reg, client)
        sample = {"op": "update", "code": "UNAVAILABLE"}
        assert reg.get_sample_value("fs3_client_storage_retries_total", sample) == 1
    finally:
        await rpc.close()
        await server.stop()
