"""The RDMA transport on a real verbs device (a NIC, or Soft-RoCE from deploy/rxe-setup.sh): the same
calls as test_transport_fake.py, through pyverbs. Skipped, with the reason discovery gives, where no
device is usable."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator, Callable

import pytest
from cluster import wait_until

from fs3.config import RdmaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcLimits, RpcServer
from fs3.net.rdma.connection import RdmaConnection
from fs3.net.rdma.discovery import discover
from fs3.net.rdma.transport import RdmaTransport
from fs3.net.system import ECHO, PING
from fs3.net.transport import Connection, FrameReceiver
from fs3.proto import rpc_pb2

INVENTORY = discover()
pytestmark = [
    pytest.mark.rdma,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not INVENTORY.usable, reason=f"no usable RDMA device: {INVENTORY.reason()}"),
]
SECRET = b"rdma-device-secret-0123456789abc"


async def poll(condition: Callable[[], bool], within: float = 10.0) -> None:
    await wait_until(condition, within, interval_s=0.005)


LIMITS = RpcLimits(max_payload_bytes=32 << 20)


@pytest.fixture
async def pair() -> AsyncIterator[tuple[RpcServer, RpcClient, RdmaTransport, RdmaTransport]]:
    st = RdmaTransport(RdmaConfig(), inventory=INVENTORY, limits=LIMITS)
    ct = RdmaTransport(RdmaConfig(), inventory=INVENTORY, limits=LIMITS)
    server = RpcServer(SECRET, transport=st, limits=LIMITS)
    await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, transport=ct, limits=LIMITS, default_timeout=30)
    try:
        yield server, client, st, ct
    finally:
        await client.close()
        await server.stop()
        st.close()
        ct.close()


async def test_calls_payloads_and_concurrency(
    pair: tuple[RpcServer, RpcClient, RdmaTransport, RdmaTransport],
) -> None:
    server, client, st, ct = pair
    response, _ = await client.call(server.address, PING, rpc_pb2.PingRequest())
    assert response.identity
    for size in (1, 65536, 65537, 4 << 20, 16 << 20):
        data = os.urandom(size)
        _, payload = await client.call(server.address, ECHO, rpc_pb2.EchoRequest(), payload=data)
        assert hashlib.sha256(payload).digest() == hashlib.sha256(data).digest()
    big = os.urandom(300_000)
    response, _ = await client.call(server.address, ECHO, rpc_pb2.EchoRequest(data=big))
    assert response.data == big
    results = await asyncio.gather(
        *(
            client.call(server.address, ECHO, rpc_pb2.EchoRequest(data=os.urandom(i % 2000)))
            for i in range(1000)
        )
    )
    assert len(results) == 1000
    assert all(isinstance(c, RdmaConnection) for c in ct.connections)


class _Sink(FrameReceiver):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        return memoryview(bytearray(length))

    def frame_received(self, *args: object) -> None:
        pass

    def frame_error(self, error: Exception) -> None:
        pass

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


async def test_one_sided_write_and_read() -> None:
    st = RdmaTransport(RdmaConfig(), inventory=INVENTORY)
    ct = RdmaTransport(RdmaConfig(), inventory=INVENTORY)
    accepted: list[_Sink] = []
    listener = await st.listen(("127.0.0.1", 0), lambda c: accepted.append(_Sink(c)) or accepted[-1])
    client = await ct.connect(listener.address, _Sink)
    assert isinstance(client, RdmaConnection)
    await poll(lambda: bool(accepted))  # the server attaches its receiver once READY arrives
    server = accepted[0].conn
    assert isinstance(server, RdmaConnection)
    dest = await ct.alloc_buffer(client, 1 << 20)
    data = os.urandom(1 << 20)
    # before the peers authenticate, the server's queue pair refuses remote access: nothing is lent
    with pytest.raises(FS3Error) as exc:
        client.expose(dest.view, write=True)
    assert exc.value.code == StatusCode.PERMISSION_DENIED
    client.peer_authenticated()
    server.peer_authenticated()
    desc = client.expose(dest.view, write=True)
    await server.rdma_write(data, desc)
    assert bytes(dest.view) == data
    back = memoryview(bytearray(1 << 20))
    await server.rdma_read(back, dataclasses.replace(desc))
    assert bytes(back) == data
    # one byte past what was lent is refused by the NIC (the queue pair then breaks, as RC does)
    with pytest.raises(FS3Error, match="remote access error|failed"):
        await server.rdma_read(
            memoryview(bytearray(1)), dataclasses.replace(desc, addr=desc.addr + (1 << 20))
        )
    client.withdraw(desc)
    ct.free_buffer(client, dest)
    client.close()
    await client.wait_closed()
    listener.close()
    st.close()
    ct.close()
