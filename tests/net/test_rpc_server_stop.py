"""A server's graceful stop (a rolling restart's SIGTERM): the calls it cuts short are answered
UNAVAILABLE, which clients retry, never CANCELLED, which they take as final."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rpc_fixtures import TEST_LIMITS, poll
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer, ServiceDef
from fs3.net.service import CallContext
from fs3.net.system import PING
from fs3.net.tcp import TcpTransport
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)

SLOW = ServiceDef(
    101,
    "slow",
    {
        1: ("Wait", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        2: ("Linger", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        3: ("Cancelled", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
    },
)


class SlowService:
    """Wait: until cancelled. Linger: when cancelled, finishes only once ``release`` is set (stop()
    waits for it meanwhile). Cancelled: turns its cancellation into FS3Error(CANCELLED), as a
    handler cut short in a lower layer might."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.lingering = asyncio.Event()
        self.release = asyncio.Event()

    async def wait(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        self.started.append(request.data.decode())
        await asyncio.Event().wait()

    async def linger(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        self.started.append(request.data.decode())
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.lingering.set()
            await self.release.wait()
            raise

    async def cancelled(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        self.started.append(request.data.decode())
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise FS3Error(StatusCode.CANCELLED, "the local write was cancelled") from None


async def _server() -> tuple[RpcServer, SlowService]:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    service = SlowService()
    server.add_service(SLOW, service)
    await server.start(("127.0.0.1", 0))
    return server, service


@pytest.mark.parametrize("method", ["Wait", "Cancelled"])
async def test_calls_cut_short_by_a_stopping_server_are_answered_unavailable(method: str) -> None:
    server, service = await _server()
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    try:
        call = asyncio.ensure_future(
            client.call(server.address, SLOW[method], rpc_pb2.EchoRequest(data=b"a"), timeout=20)
        )
        await poll(lambda: service.started == ["a"], what="the call to reach its handler")
        await asyncio.wait_for(server.stop(), 10)
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(call, 10)
        assert e.value.code == StatusCode.UNAVAILABLE and "shutting down" in e.value.message
        assert e.value.retryable
    finally:
        await client.close()
        await server.stop()


async def test_calls_arriving_while_the_server_stops_are_refused_not_started() -> None:
    server, service = await _server()
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    address = server.address
    try:
        first = asyncio.ensure_future(
            client.call(address, SLOW["Linger"], rpc_pb2.EchoRequest(data=b"first"), timeout=20)
        )
        await poll(lambda: service.started == ["first"], what="the first call to reach its handler")
        stopping = asyncio.ensure_future(server.stop())
        await asyncio.wait_for(service.lingering.wait(), 10)  # stop() waits for that handler now
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(
                client.call(address, SLOW["Wait"], rpc_pb2.EchoRequest(data=b"late"), timeout=20), 10
            )
        assert e.value.code == StatusCode.UNAVAILABLE and e.value.retryable
        assert service.started == ["first"]  # the late call never ran
        service.release.set()
        await asyncio.wait_for(stopping, 10)
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(first, 10)
        assert e.value.code == StatusCode.UNAVAILABLE
    finally:
        service.release.set()
        await client.close()
        await server.stop()


async def test_a_stopped_server_serves_again_once_restarted() -> None:
    server, _ = await _server()
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    try:
        address = server.address
        await server.stop()
        await server.start(address)
        response, _ = await asyncio.wait_for(client.call(address, PING, rpc_pb2.PingRequest(), timeout=5), 10)
        assert response.identity == "server"
    finally:
        await client.close()
        await server.stop()
