"""Calls to a peer that does not read what we send: they wait for room within their deadline, and
waiting callers are neither stranded nor overtaken."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rpc_fixtures import TEST_LIMITS, poll
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer
from fs3.net.frame import F_REQUEST, F_RESPONSE, HEADER_SIZE, FrameError, encode_header
from fs3.net.system import PING, SINK, SOURCE
from fs3.net.tcp import TcpConnection, TcpTransport
from fs3.net.transport import FrameReceiver
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


def _stop_reading(server: RpcServer, paused: bool) -> None:
    # as a stopped process (SIGSTOP) or a frozen VM would: connected, but reading nothing
    for session in list(server._sessions):  # noqa: SLF001
        session.conn.pause_receiving(paused)


async def test_a_call_to_a_peer_that_stopped_reading_fails_at_its_deadline() -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    address = await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    try:
        await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        _stop_reading(server, True)
        # far more than the kernel's socket buffers take: the rest stays queued in the client
        fillers = [
            asyncio.ensure_future(
                client.call(address, SINK, rpc_pb2.SinkRequest(), payload=bytes(4 * MiB), timeout=30)
            )
            for _ in range(16)
        ]
        conn = client._single[address].conn  # noqa: SLF001
        await poll(lambda: conn.write_paused, what="requests queued in the client")
        # a further call waits for room to send, and gives up at its deadline like any other call
        # (with nothing of it queued yet: a call ending with its payload queued drops the
        # connection, see test_rpc_call_lifetimes.py)
        with pytest.raises(FS3Error) as e:
            await asyncio.wait_for(
                client.call(address, SINK, rpc_pb2.SinkRequest(), payload=bytes(MiB), timeout=0.5), 10
            )
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
        # once the peer reads again, the same connection carries the queued calls, and more
        _stop_reading(server, False)
        for response, _ in await asyncio.wait_for(asyncio.gather(*fillers), 30):
            assert response.received == 4 * MiB
        response, _ = await asyncio.wait_for(
            client.call(address, SINK, rpc_pb2.SinkRequest(), payload=bytes(MiB), timeout=20), 30
        )
        assert response.received == MiB
        assert client._single[address].conn is conn  # noqa: SLF001
    finally:
        _stop_reading(server, False)
        await client.close()
        await server.stop()


async def test_closing_a_client_whose_peer_stopped_reading_does_not_hang() -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    address = await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    try:
        await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        _stop_reading(server, True)
        calls = [
            asyncio.ensure_future(
                client.call(address, SINK, rpc_pb2.SinkRequest(), payload=bytes(4 * MiB), timeout=30)
            )
            for _ in range(16)
        ]
        conn = client._single[address].conn  # noqa: SLF001
        await poll(lambda: conn.write_paused, what="requests queued in the client")
        await asyncio.wait_for(client.close(), 10)  # queued requests are dropped, not waited on
        for call in calls:
            with pytest.raises(FS3Error) as e:
                await asyncio.wait_for(call, 10)
            assert e.value.code == StatusCode.RPC_CONNECTION_CLOSED
    finally:
        _stop_reading(server, False)
        await client.close()
        await server.stop()


async def test_stopping_a_server_whose_client_stopped_reading_does_not_hang() -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    address = await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, limits=TEST_LIMITS, transport=TcpTransport())
    calls: list[asyncio.Future[Any]] = []
    try:
        await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        client._single[address].conn.pause_receiving(True)  # noqa: SLF001
        calls += [
            asyncio.ensure_future(
                client.call(address, SOURCE, rpc_pb2.SourceRequest(length=4 * MiB), timeout=30)
            )
            for _ in range(16)
        ]
        await poll(
            lambda: any(s.conn.write_paused for s in server._sessions),  # noqa: SLF001
            what="replies queued in the server",
        )
        await asyncio.wait_for(server.stop(), 10)  # the replies it cannot send are dropped
    finally:
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await client.close()
        await server.stop()


# ---- the TCP connection's send queue, against a transport whose buffer the test controls ----------


class _Receiver(FrameReceiver):
    def __init__(self) -> None:
        self.frames: list[int] = []

    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        return memoryview(bytearray(length))

    def frame_received(self, flags: int, request_id: int, *rest: Any) -> None:
        self.frames.append(request_id)

    def frame_error(self, error: FrameError) -> None:
        raise AssertionError(error)

    def connection_lost(self, exc: BaseException | None) -> None:
        pass


class _Transport:
    """Holds ``unsent`` bytes, as a socket's peer reads them (the test says how many are left)."""

    def __init__(self) -> None:
        self.unsent = 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def set_write_buffer_limits(self, high: int = 0, low: int = 0) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.unsent += len(data)

    def writelines(self, data: list[Any]) -> None:
        self.unsent += sum(memoryview(d).nbytes for d in data)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False


@pytest.fixture
async def conn() -> tuple[TcpConnection, _Transport, _Receiver]:
    receiver = _Receiver()
    c = TcpConnection(asyncio.get_running_loop(), TEST_LIMITS, lambda _: receiver, server_side=False)
    t = _Transport()
    c.connection_made(t)  # type: ignore[arg-type]
    return c, t, receiver


def _reply_arrives(c: TcpConnection, request_id: int) -> None:
    frame = encode_header(F_RESPONSE, request_id, 0, 0, 0, 0, 0)
    buf = c.get_buffer(len(frame))
    buf[: len(frame)] = frame
    c.buffer_updated(len(frame))


def _backlog(c: TcpConnection, t: _Transport, nbytes: int) -> None:
    t.unsent = nbytes
    c.pause_writing()  # the transport's high-water mark is 0: it says so at the first unsent byte


async def test_waiting_callers_go_on_once_the_backlog_is_low_not_only_when_it_is_empty(
    conn: tuple[TcpConnection, _Transport, _Receiver],
) -> None:
    c, t, receiver = conn
    _backlog(c, t, 20 * MiB)
    assert c.write_paused
    waiter = asyncio.ensure_future(c.drain())
    await asyncio.sleep(0)
    # the peer reads and answers, but we keep sending: the queue never empties under steady load
    t.unsent = 12 * MiB
    _reply_arrives(c, 1)
    await asyncio.sleep(0)
    assert not waiter.done()
    t.unsent = 3 * MiB
    _reply_arrives(c, 2)
    await asyncio.wait_for(waiter, 5)
    assert receiver.frames == [1, 2]


async def test_newcomers_do_not_overtake_callers_waiting_for_room(
    conn: tuple[TcpConnection, _Transport, _Receiver],
) -> None:
    c, t, _ = conn
    _backlog(c, t, 20 * MiB)
    waiter = asyncio.ensure_future(c.drain())
    await asyncio.sleep(0)
    t.unsent = 10 * MiB  # below the high-water mark, above the low one: the waiter still waits
    assert c.write_paused  # so a newcomer waits too rather than keeping the queue from draining
    late = asyncio.ensure_future(c.drain())
    await asyncio.sleep(0)
    assert not waiter.done() and not late.done()
    t.unsent = 0
    c.resume_writing()
    await asyncio.wait_for(asyncio.gather(waiter, late), 5)
    assert not c.write_paused


async def test_a_waiter_giving_up_leaves_the_others_waiting(
    conn: tuple[TcpConnection, _Transport, _Receiver],
) -> None:
    c, t, _ = conn
    _backlog(c, t, 20 * MiB)
    first = asyncio.ensure_future(c.drain())
    second = asyncio.ensure_future(c.drain())
    await asyncio.sleep(0)
    first.cancel()  # its caller's deadline passed
    await asyncio.sleep(0)
    assert first.cancelled() and not second.done()
    assert c.write_paused
    t.unsent = 0
    c.resume_writing()
    await asyncio.wait_for(second, 5)
    assert not c.write_paused


async def test_on_sent_comes_once_the_frame_has_left_not_once_all_that_is_queued_has(
    conn: tuple[TcpConnection, _Transport, _Receiver],
) -> None:
    # (the RPC client drops a connection on which a call ends with its payload not sent; under
    # steady load the transport's buffer may never empty, so waiting for that would be too late)
    c, t, _ = conn
    sent: list[int] = []
    for rid in (1, 2):
        c.send_frame(F_REQUEST, rid, 0, 0, b"", bytes(MiB), on_sent=lambda rid=rid: sent.append(rid))
    await poll(lambda: t.unsent > 2 * MiB, what="the frames handed to the transport")
    c.pause_writing()
    assert sent == []
    t.unsent = MiB  # the kernel has taken the first frame, not the second
    _reply_arrives(c, 1)
    assert sent == [1]
    t.unsent = 0
    c.resume_writing()
    assert sent == [1, 2]


class _Writes(_Transport):
    """Records the bytes of each write, which the kernel takes whole."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, data: bytes) -> None:
        self.writes.append(len(data))

    def writelines(self, data: list[Any]) -> None:
        self.writes.append(sum(memoryview(d).nbytes for d in data))


async def test_a_frame_goes_out_at_once_on_a_connection_whose_writes_carry_one_frame_each() -> None:
    # (16 clients with a connection each, one request at a time: each frame waiting for the loop's
    # next turn waited for every other ready task too, 324 us of a 2.1 ms round at the meta server;
    # see TcpConnection.send_frame)
    c = TcpConnection(asyncio.get_running_loop(), TEST_LIMITS, lambda _: _Receiver(), server_side=False)
    t = _Writes()
    c.connection_made(t)  # type: ignore[arg-type]
    h = HEADER_SIZE
    c.send_frame(F_REQUEST, 1, 0, 0, b"")
    assert t.writes == [h]  # before the event loop has turned
    await asyncio.sleep(0)
    for rid in (2, 3, 4):
        c.send_frame(F_REQUEST, rid, 0, 0, b"")
    assert t.writes == [h, h]  # the first of them at once, the others together a turn later
    await poll(lambda: len(t.writes) == 3, what="the frames sent with it")
    assert t.writes == [h, h, 2 * h]
    # Its writes now carry several frames: the next frames wait for those sent in the same turn.
    for rid in (5, 6):
        c.send_frame(F_REQUEST, rid, 0, 0, b"")
    assert t.writes == [h, h, 2 * h]
    await poll(lambda: len(t.writes) == 4, what="the next write")
    assert t.writes == [h, h, 2 * h, 2 * h]
    # ... until a write carries one frame again
    await asyncio.sleep(0)
    c.send_frame(F_REQUEST, 7, 0, 0, b"")
    await poll(lambda: len(t.writes) == 5, what="a lone frame")
    c.send_frame(F_REQUEST, 8, 0, 0, b"")
    assert t.writes == [h, h, 2 * h, 2 * h, h, h]
