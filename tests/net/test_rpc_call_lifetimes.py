"""What outlives a call, and what a call outlives: a payload is not read once its call has returned
(the caller reuses its memory), a call waiting for a connection that the client's close() gives up
fails like any call in flight, and a call that a stopping server had not started yet is answered
and forgotten like those it had."""

from __future__ import annotations

import asyncio
import gc
import select
import socket
import warnings
from typing import Any

import pytest
from rpc_fixtures import TEST_LIMITS, TEST_SERVICE, poll
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer, ServiceDef
from fs3.net.rdma.connection import RdmaConnection
from fs3.net.service import CallContext, inline
from fs3.net.system import PING
from fs3.net.tcp import TcpTransport
from fs3.net.transport import Transport
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20

RECORD = ServiceDef(102, "record", {1: ("Record", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse)})


class RecordService:
    """Record: keeps what each call's payload held when its handler ran."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, bytes]] = []  # (request data, payload)

    async def record(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        self.seen.append((request.data, bytes(payload)))
        return rpc_pb2.EchoResponse()


def _stop_reading(server: RpcServer, paused: bool) -> None:
    # as a stopped process (SIGSTOP) or a frozen VM would: connected, but reading nothing
    for session in list(server._sessions):  # noqa: SLF001
        session.conn.pause_receiving(paused)


async def _payload(client: RpcClient, address: tuple[str, int]) -> memoryview:
    """A payload that the transport sends from where it lies, not from a copy: over TCP, more than
    the kernel's socket buffers take (the rest waits in the transport, uncopied on uvloop); over
    RDMA, registered memory, which the peer READs in place."""
    conn = client._single[address].conn  # noqa: SLF001
    if isinstance(conn, RdmaConnection):
        buf = await client.transport.alloc_buffer(conn, MiB)  # type: ignore[attr-defined]
        view = buf.view[:MiB]
    else:
        view = memoryview(bytearray(TEST_LIMITS.max_payload_bytes - MiB))
    view[:] = b"A" * view.nbytes
    return view


def _stalled(client: RpcClient, address: tuple[str, int]) -> bool:
    """The payload is on its way but not all sent: queued in the transport (TCP), or lent to a
    peer that has not read it (RDMA)."""
    conn = client._single[address].conn  # noqa: SLF001
    if isinstance(conn, RdmaConnection):
        return conn.stats()["lent_payloads"] > 0
    return conn.write_paused


@pytest.mark.parametrize("ending", ["deadline", "cancel"])
async def test_a_payload_is_not_sent_on_after_its_call_ends_unsent(
    transports: tuple[Transport, Transport], ending: str
) -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=transports[0])
    service = RecordService()
    server.add_service(RECORD, service)
    address = await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=transports[1])
    try:
        await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        payload = await _payload(client, address)
        _stop_reading(server, True)
        other = asyncio.ensure_future(client.call(address, PING, rpc_pb2.PingRequest(), timeout=30))
        call = asyncio.ensure_future(
            client.call(
                address,
                RECORD["Record"],
                rpc_pb2.EchoRequest(data=b"write-A"),
                payload=payload,
                timeout=0.5 if ending == "deadline" else 30,
            )
        )
        if ending == "cancel":
            await poll(lambda: _stalled(client, address), what="the payload to be on its way")
            call.cancel()
        with pytest.raises((FS3Error, asyncio.CancelledError)) as e:
            await asyncio.wait_for(call, 10)
        if ending == "deadline":
            assert isinstance(e.value, FS3Error) and e.value.code == StatusCode.DEADLINE_EXCEEDED
        # the call has returned: its caller reuses the memory, as a pooled buffer would be
        payload[:] = b"\xff" * payload.nbytes
        _stop_reading(server, False)
        # the server gets the request whole and as it was sent, or not at all (the connection
        # that carried it is gone)
        await poll(lambda: service.seen or not server.connection_count, what="the request's fate")
        for data, seen in service.seen:
            assert data == b"write-A" and seen.count(b"A") == len(seen) == payload.nbytes
        # the connection went with the payload, and the other call on it failed, to be retried
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(other, 10)
        assert e.value.code == StatusCode.RPC_CONNECTION_CLOSED and e.value.retryable
        # the client connects again for the next call
        response, _ = await client.call(address, PING, rpc_pb2.PingRequest(), timeout=10)
        assert response.identity == "server"
    finally:
        _stop_reading(server, False)
        await client.close()
        await server.stop()


async def test_a_call_ending_after_its_payload_left_keeps_the_connection(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    service = rpc_server.handlers  # type: ignore[attr-defined]
    address = rpc_server.address
    method = TEST_SERVICE["Block"]
    other = asyncio.ensure_future(
        rpc_client.call(address, method, rpc_pb2.EchoRequest(data=b"B"), timeout=30)
    )
    late = asyncio.ensure_future(
        rpc_client.call(address, method, rpc_pb2.EchoRequest(data=b"A"), payload=bytes(MiB), timeout=1)
    )
    await poll(lambda: service.blocked == 2, what="both calls, payload and all, to reach their handler")
    with pytest.raises(FS3Error) as e:
        await asyncio.wait_for(late, 10)
    assert e.value.code == StatusCode.DEADLINE_EXCEEDED
    service.gate.set()
    response, _ = await asyncio.wait_for(other, 10)  # the connection it shares is still there
    assert response.data == b"B"


@pytest.mark.parametrize("when", ["connecting", "about to connect"])
async def test_closing_the_client_fails_calls_waiting_for_a_connection(when: str) -> None:
    # a peer that accepts connections but never answers the handshake (a hung server)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()[:2]
        client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport(), connect_timeout=20)
        call = asyncio.ensure_future(client.call(address, PING, rpc_pb2.PingRequest(), timeout=20))
        if when == "connecting":
            await poll(lambda: bool(select.select([listener], [], [], 0)[0]), what="the connection")
        else:
            await asyncio.sleep(0)  # one step: the call has started the connecting, which has not run yet
        await asyncio.wait_for(client.close(), 10)
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(call, 10)
        assert e.value.code == StatusCode.RPC_CONNECTION_CLOSED and e.value.retryable
        assert not call.cancelled()


async def test_a_caller_cancelled_while_waiting_for_a_connection_is_cancelled() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()[:2]
        client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport(), connect_timeout=20)
        try:
            call = asyncio.ensure_future(client.call(address, PING, rpc_pb2.PingRequest(), timeout=20))
            await poll(lambda: bool(select.select([listener], [], [], 0)[0]), what="the connection")
            call.cancel()
            await client.close()  # in the same step: the connecting is cancelled too
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(call, 10)
            assert call.cancelled()
        finally:
            await client.close()


STOPPING = ServiceDef(
    103,
    "stopping",
    {
        1: ("Trigger", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        2: ("Work", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
        3: ("InlineWork", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse),
    },
)


class StoppingService:
    """Trigger: schedules the server's stop() (as a SIGTERM handler would) and answers at once.
    Work, InlineWork: wait a little, then answer; ``started`` records who ran."""

    def __init__(self) -> None:
        self.server: RpcServer | None = None
        self.started: list[str] = []

    @inline
    async def trigger(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        assert self.server is not None
        asyncio.ensure_future(self.server.stop())
        return rpc_pb2.EchoResponse()

    async def work(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        self.started.append("Work")
        await asyncio.sleep(0.01)
        return rpc_pb2.EchoResponse(data=b"done")

    @inline
    async def inline_work(self, request: rpc_pb2.EchoRequest, payload: Any, ctx: CallContext) -> Any:
        self.started.append("InlineWork")
        await asyncio.sleep(0.01)
        return rpc_pb2.EchoResponse(data=b"done")


@pytest.mark.parametrize("method", ["Work", "InlineWork"])
async def test_a_call_whose_task_had_not_started_when_the_server_stopped_is_answered_unavailable(
    method: str,
) -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    service = StoppingService()
    service.server = server
    server.add_service(STOPPING, service)
    address = await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    try:
        # Three calls at once: the connection's writes then carry several frames, so the next
        # requests sent together also go out together (a connection whose writes carried one frame
        # each writes a request at once: see TcpConnection.send_frame).
        await asyncio.gather(
            *(client.call(address, PING, rpc_pb2.PingRequest(), timeout=5) for _ in range(3))
        )
        (session,) = server._sessions  # noqa: SLF001
        # Both requests go out in one write and are dispatched in one read: the Trigger's stop()
        # is scheduled before the task of the call after it, so it finds that task not started.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = await asyncio.wait_for(
                asyncio.gather(
                    client.call(address, STOPPING["Trigger"], rpc_pb2.EchoRequest(), timeout=10),
                    client.call(address, STOPPING[method], rpc_pb2.EchoRequest(), timeout=10),
                    return_exceptions=True,
                ),
                20,
            )
            await asyncio.wait_for(server.stop(), 10)
            gc.collect()
        assert not isinstance(results[0], BaseException)
        assert isinstance(results[1], FS3Error), results[1]
        assert results[1].code == StatusCode.UNAVAILABLE and results[1].retryable
        # an inline handler had started, in the receive path; a plain one never does
        assert service.started == (["InlineWork"] if method == "InlineWork" else [])
        assert not session._tasks and session._inflight == 0  # noqa: SLF001
        assert not [w for w in caught if "never awaited" in str(w.message)]
    finally:
        await client.close()
        await server.stop()
