"""Calls through a real server on 127.0.0.1: results, payloads, concurrency, deadlines, errors."""

from __future__ import annotations

import array
import asyncio
import gc
import hashlib
import os
import socket
import sys

import pytest
import rpcwire
from rpc_fixtures import TEST_LIMITS, TEST_SERVICE, ServiceUnderTest, lend_pattern, poll
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcLimits, RpcServer, ServiceDef
from fs3.net.frame import F_REQUEST, F_RESPONSE, HEADER_SIZE, encode_header
from fs3.net.server import MAX_ERROR_MESSAGE_BYTES, error_message
from fs3.net.system import ECHO, PING, SINK, SOURCE, SYSTEM_SERVICE, source_pattern
from fs3.net.transport import Transport
from fs3.proto import common_pb2, rpc_pb2

pytestmark = pytest.mark.timeout(60)


async def test_ping_and_echo(rpc_server: RpcServer, rpc_client: RpcClient) -> None:
    response, payload = await rpc_client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    assert response.identity == "test-server" and payload is None
    response, payload = await rpc_client.call(
        rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=b"hello"), payload=b"raw bytes"
    )
    assert response.data == b"hello" and bytes(payload) == b"raw bytes"
    # "host:port" strings work as addresses too, and a stub calls by name
    host, port = rpc_server.address
    stub = rpc_client.stub(f"{host}:{port}", SYSTEM_SERVICE)
    response, _ = await stub.call("Echo", rpc_pb2.EchoRequest(data=b"x"))
    assert response.data == b"x"
    assert rpc_server.connection_count == 1


async def test_handler_sees_identity_peer_and_deadline(rpc_server: RpcServer, rpc_client: RpcClient) -> None:
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    handlers.gate.set()
    await rpc_client.call(rpc_server.address, TEST_SERVICE["Block"], rpc_pb2.EchoRequest(), timeout=3)
    ctx = handlers.contexts[-1]
    assert ctx.identity == "test-client"
    assert ctx.peer.startswith("127.0.0.1:")
    assert ctx.method.full_name == "test.Block"
    remaining = ctx.remaining(asyncio.get_running_loop().time())
    assert remaining is not None and 0 < remaining <= 3.01


@pytest.mark.parametrize("size", [1, 4095, 65537, 16 << 20])
async def test_large_payload_round_trip_is_byte_exact(
    rpc_server: RpcServer, rpc_client: RpcClient, size: int
) -> None:
    data = os.urandom(size)
    response, payload = await rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(), payload=data)
    assert payload is not None and payload.nbytes == size
    assert hashlib.sha256(payload).digest() == hashlib.sha256(data).digest()
    response, _ = await rpc_client.call(rpc_server.address, SINK, rpc_pb2.SinkRequest(), payload=data)
    assert response.received == size


@pytest.mark.parametrize("size", [8000, 9000, 200_000, 5 << 20])
async def test_large_messages_round_trip(rpc_server: RpcServer, rpc_client: RpcClient, size: int) -> None:
    # messages beyond what the receive buffer assembles inline get a buffer of their own
    data = os.urandom(size)
    response, payload = await rpc_client.call(
        rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=data), payload=data[:1000]
    )
    assert response.data == data and bytes(payload) == data[:1000]
    # and many medium ones back to back (the receive buffer grows, compacts, and keeps frames whole)
    many = await asyncio.gather(
        *(
            rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=data[: 100 + i * 97]))
            for i in range(100)
        )
    )
    assert [r.data for r, _ in many] == [data[: 100 + i * 97] for i in range(100)]


async def test_any_contiguous_buffer_is_a_payload(rpc_server: RpcServer, rpc_client: RpcClient) -> None:
    # sized in bytes, not items
    words = array.array("I", range(1000))
    _, payload = await rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(), payload=words)
    assert bytes(payload) == words.tobytes()
    view = memoryview(words).cast("B")[4:400]
    _, payload = await rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(), payload=view)
    assert bytes(payload) == bytes(view)


async def test_reply_payload_lands_in_the_callers_buffer(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    buf = bytearray(8 << 20)
    n = (5 << 20) + 3
    _, payload = await rpc_client.call(rpc_server.address, SOURCE, rpc_pb2.SourceRequest(length=n), into=buf)
    assert payload is not None and payload.obj is buf and payload.nbytes == n
    assert buf[:n] == source_pattern(n)
    # a reply that does not fit the caller's buffer fails that call only
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(
            rpc_server.address, SOURCE, rpc_pb2.SourceRequest(length=100), into=bytearray(10)
        )
    assert e.value.code == StatusCode.RPC_FRAME_TOO_LARGE
    _, payload = await rpc_client.call(rpc_server.address, SOURCE, rpc_pb2.SourceRequest(length=100))
    assert bytes(payload) == source_pattern(100)


async def test_a_lent_reply_payload_goes_back_only_once_it_has_left(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    """A handler that returns (response, payload, done) gets done called once the payload has been
    sent (the handler then reuses the memory: here it zeroes it), or at once where the reply
    fails; the caller receives the bytes as they were."""
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    lend = TEST_SERVICE["Lend"]
    for calls, size in enumerate([1, 65537, 16 << 20], start=1):
        _, payload = await rpc_client.call(rpc_server.address, lend, rpc_pb2.EchoRequest(data=b"%d" % size))
        assert payload is not None and bytes(payload) == lend_pattern(size)
        await poll(lambda calls=calls: handlers.lent_done == calls, what="done called once")  # type: ignore[misc]
    # several at once, their payloads in one write
    sizes = [4096 * i + 1 for i in range(1, 9)]
    replies = await asyncio.gather(
        *(rpc_client.call(rpc_server.address, lend, rpc_pb2.EchoRequest(data=b"%d" % n)) for n in sizes)
    )
    assert [bytes(p) for _, p in replies] == [lend_pattern(n) for n in sizes]
    await poll(lambda: handlers.lent_done == 3 + len(sizes), what="done called for each")
    # a reply over the payload limit fails, and its memory goes back at once
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, lend, rpc_pb2.EchoRequest(data=b"%d" % ((32 << 20) + 1)))
    assert e.value.code == StatusCode.RPC_FRAME_TOO_LARGE
    assert handlers.lent_done == 4 + len(sizes)


async def test_payload_crc_end_to_end() -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, payload_crc=True)
    address = await server.start()
    try:
        async with RpcClient(SECRET, limits=TEST_LIMITS, payload_crc=True) as client:
            data = os.urandom(1 << 20)
            _, payload = await client.call(address, ECHO, rpc_pb2.EchoRequest(), payload=data)
            assert bytes(payload) == data
    finally:
        await server.stop()


async def test_many_concurrent_calls_share_one_connection(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    async def one(i: int) -> None:
        data = i.to_bytes(4, "little")
        response, payload = await rpc_client.call(
            rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=data), payload=data * (i % 50)
        )
        assert response.data == data
        assert bytes(payload or b"") == data * (i % 50)

    await asyncio.gather(*(one(i) for i in range(2000)))
    assert rpc_server.connection_count == 1


async def test_calls_spread_over_a_pool_of_connections(rpc_server: RpcServer) -> None:
    async with RpcClient(SECRET, limits=TEST_LIMITS, connections_per_peer=3) as client:
        for _ in range(3):
            await client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
        await asyncio.gather(
            *(client.call(rpc_server.address, PING, rpc_pb2.PingRequest()) for _ in range(100))
        )
        await poll(lambda: rpc_server.connection_count == 3, what="three connections")


@pytest.mark.parametrize("handler", ["Block", "InlineBlock"])
async def test_deadline_exceeded_and_late_reply_dropped(
    rpc_server: RpcServer, rpc_client: RpcClient, handler: str
) -> None:
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    block = TEST_SERVICE[handler]
    await rpc_client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, block, rpc_pb2.EchoRequest(data=b"late"), timeout=0.2)
    assert e.value.code == StatusCode.DEADLINE_EXCEEDED
    assert handlers.blocked == 1
    # other calls on the same connection are unaffected, before and after the late reply
    response, _ = await rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=b"a"))
    assert response.data == b"a"
    handlers.gate.set()
    await poll(lambda: handlers.finished == 1, what="the blocked handler to finish")
    response, _ = await rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=b"b"))
    assert response.data == b"b"
    assert rpc_server.connection_count == 1


async def test_deadlines_of_different_lengths_expire_in_order(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    block = TEST_SERVICE["Block"]
    await rpc_client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def timed(seconds: float) -> float:
        with pytest.raises(FS3Error) as e:
            await rpc_client.call(rpc_server.address, block, rpc_pb2.EchoRequest(), timeout=seconds)
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
        return loop.time() - start

    long_, short = await asyncio.gather(timed(0.6), timed(0.1))
    # never early (give or take the loop clock's 1 ms granularity), and in deadline order
    assert short >= 0.098 and long_ >= 0.598 and short < long_
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, PING, rpc_pb2.PingRequest(), timeout=0)
    assert e.value.code == StatusCode.DEADLINE_EXCEEDED


async def test_a_handler_sees_that_its_callers_connection_closed(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    """``CallContext.closed``: a handler that waited (a storage daemon's forwarded update, for the
    chunk's lock) can tell that its caller can no longer have the reply, and may have gone on."""
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    task = asyncio.ensure_future(
        rpc_client.call(rpc_server.address, TEST_SERVICE["Block"], rpc_pb2.EchoRequest(), timeout=10)
    )
    await poll(lambda: handlers.blocked == 1, what="the call to reach the handler")
    ctx = handlers.contexts[-1]
    assert not ctx.closed()
    await rpc_client.close()
    with pytest.raises(FS3Error):
        await task
    await poll(ctx.closed, what="the handler to see the connection closed")
    handlers.gate.set()
    await poll(lambda: handlers.finished == 1, what="the handler to finish")


@pytest.mark.parametrize("handler", ["Block", "InlineBlock"])
async def test_cancelled_call_leaves_the_connection_usable(
    rpc_server: RpcServer, rpc_client: RpcClient, handler: str
) -> None:
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    task = asyncio.ensure_future(
        rpc_client.call(rpc_server.address, TEST_SERVICE[handler], rpc_pb2.EchoRequest(), timeout=10)
    )
    await poll(lambda: handlers.blocked == 1, what="the call to reach the handler")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    handlers.gate.set()
    await poll(lambda: handlers.finished == 1, what="the handler to finish")
    response, _ = await rpc_client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=b"ok"))
    assert response.data == b"ok"


async def test_deadline_while_reply_streams_into_callers_buffer() -> None:
    # A reply payload still arriving when the deadline passes must not go on writing into the
    # caller's buffer once the call has returned; the rest is read and dropped, and the connection
    # stays in step. A fake server sends half a reply, stalls, then sends the rest.
    size = 100_000
    stalled, proceed = asyncio.Event(), asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await rpcwire.accept_handshake(reader, writer)
        hdr, _, _ = await rpcwire.read_frame_async(reader)
        data = b"A" * size
        writer.write(encode_header(F_RESPONSE, hdr[1], 0, SOURCE.id, 0, size) + data[: size // 2])
        await writer.drain()
        stalled.set()
        await proceed.wait()
        writer.write(data[size // 2 :])
        hdr, _, _ = await rpcwire.read_frame_async(reader)
        pong = rpc_pb2.PingResponse(identity="fake").SerializeToString()
        writer.write(rpcwire.frame(F_RESPONSE, hdr[1], 0, PING.id, pong))
        await writer.drain()
        await reader.read()
        writer.close()

    fake = await asyncio.start_server(serve, "127.0.0.1", 0)
    address = fake.sockets[0].getsockname()[:2]
    buf = bytearray(size)
    try:
        # (a frame timeout well beyond the call's deadline, so that the stall does not end the connection)
        async with RpcClient(SECRET, limits=RpcLimits(frame_timeout_s=30)) as client:
            call = asyncio.ensure_future(
                client.call(address, SOURCE, rpc_pb2.SourceRequest(length=size), into=buf, timeout=0.3)
            )
            await stalled.wait()
            await poll(lambda: buf[size // 2 - 1] == ord("A"), what="the first half to land in buf")
            with pytest.raises(FS3Error) as e:
                await call
            assert e.value.code == StatusCode.DEADLINE_EXCEEDED
            proceed.set()
            response, _ = await client.call(address, PING, rpc_pb2.PingRequest())
            assert response.identity == "fake"  # the second half was consumed, in step
            assert buf == b"A" * (size // 2) + bytes(size - size // 2)  # and not into buf
    finally:
        proceed.set()
        fake.close()


async def test_error_codes_propagate(rpc_server: RpcServer, rpc_client: RpcClient) -> None:
    fail = TEST_SERVICE["Fail"]
    for code in (StatusCode.NOT_FOUND, StatusCode.META_NOT_EMPTY, StatusCode.STORAGE_NOT_HEAD):
        with pytest.raises(FS3Error) as e:
            await rpc_client.call(rpc_server.address, fail, common_pb2.Status(code=code, message="why not"))
        assert e.value.code == code and e.value.message == "why not"
    # a code this side does not know decodes to UNKNOWN, keeping the number
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, fail, common_pb2.Status(code=9999, message="new"))
    assert e.value.code == StatusCode.UNKNOWN and "9999" in e.value.message


async def test_long_and_undecodable_error_messages_reach_the_caller(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    """A long message is cut in the middle, keeping the reason at its end; one holding text that is
    not UTF-8 can still be sent."""
    quoted = "x" * 5000
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(
            rpc_server.address,
            TEST_SERVICE["Fail"],
            common_pb2.Status(code=StatusCode.NOT_FOUND, message=f"start '{quoted}' is not there"),
        )
    message = e.value.message
    assert e.value.code == StatusCode.NOT_FOUND
    assert message.startswith("start 'xxx") and message.endswith("xxx' is not there")
    assert "bytes cut" in message and len(message.encode()) <= MAX_ERROR_MESSAGE_BYTES
    # an error reply for a message with text that is not UTF-8 (a lone surrogate, as undecodable
    # bytes of a name come out of surrogateescape) is made; its encoding raised, and the caller
    # heard nothing until its deadline
    sent = common_pb2.Status.FromString(error_message(StatusCode.INTERNAL, "boom-\udce9-"))
    assert sent.message == "boom-\\udce9-"


async def test_a_failed_calls_error_holds_no_cycle_keeping_its_payload(
    rpc_server: RpcServer, rpc_client: RpcClient
) -> None:
    """The error a call raises takes the call's frame into its traceback; that frame must not
    hold the future holding the error, a cycle that kept the payload (a retried 1 MiB write's)
    until the cyclic collector happened to run."""
    payload = os.urandom(1 << 20)
    base = sys.getrefcount(payload)
    gc.collect()
    gc.disable()
    try:
        try:
            await rpc_client.call(
                rpc_server.address,
                TEST_SERVICE["Fail"],
                common_pb2.Status(code=StatusCode.NOT_FOUND),
                payload=payload,
            )
        except FS3Error as e:
            assert e.code == StatusCode.NOT_FOUND
        else:
            pytest.fail("the call did not fail")
        await asyncio.sleep(0)  # the reply's future wakes its waiters in a callback of the loop
        assert sys.getrefcount(payload) == base
    finally:
        gc.enable()


async def test_handlers_run_in_tasks_by_default(rpc_server: RpcServer, rpc_client: RpcClient) -> None:
    # so asyncio.timeout (which needs a current task) works anywhere in an ordinary handler
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, TEST_SERVICE["Timeout"], rpc_pb2.EchoRequest())
    assert e.value.code == StatusCode.DEADLINE_EXCEEDED and e.value.message == "handler gave up"


async def test_handler_bugs_become_internal_errors(
    rpc_server: RpcServer, rpc_client: RpcClient, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, TEST_SERVICE["Crash"], rpc_pb2.EchoRequest())
    assert e.value.code == StatusCode.INTERNAL and "ZeroDivisionError" in e.value.message
    assert any("handler failed" in r.message and "test.Crash" in r.getMessage() for r in caplog.records)
    for name in ("WrongType", "BadPayload"):
        with pytest.raises(FS3Error) as e:
            await rpc_client.call(rpc_server.address, TEST_SERVICE[name], rpc_pb2.EchoRequest())
        assert e.value.code == StatusCode.INTERNAL
    # a caller passing the wrong message class is stopped before anything is sent
    with pytest.raises(TypeError):
        await rpc_client.call(rpc_server.address, PING, rpc_pb2.EchoRequest())
    # the connection carries on
    await rpc_client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    assert rpc_server.connection_count == 1


async def test_unknown_service_and_method(rpc_server: RpcServer, rpc_client: RpcClient) -> None:
    ghost = ServiceDef(77, "ghost", {1: ("Boo", rpc_pb2.PingRequest, rpc_pb2.PingResponse)})
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(rpc_server.address, ghost["Boo"], rpc_pb2.PingRequest())
    assert e.value.code == StatusCode.RPC_UNKNOWN_SERVICE
    extended = ServiceDef(0, "system", {99: ("Future", rpc_pb2.PingRequest, rpc_pb2.PingResponse)})
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(
            rpc_server.address, extended["Future"], rpc_pb2.PingRequest(), payload=b"p" * 10000
        )
    assert e.value.code == StatusCode.RPC_UNKNOWN_METHOD
    await rpc_client.call(rpc_server.address, PING, rpc_pb2.PingRequest())


async def test_payload_limits(rpc_server: RpcServer) -> None:
    # the client refuses to send more than its own limit...
    async with RpcClient(SECRET, limits=TEST_LIMITS) as client:
        with pytest.raises(FS3Error) as e:
            await client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(), payload=bytes((32 << 20) + 1))
        assert e.value.code == StatusCode.RPC_FRAME_TOO_LARGE
        with pytest.raises(FS3Error) as e:
            await client.call(rpc_server.address, SOURCE, rpc_pb2.SourceRequest(length=1 << 40))
        assert e.value.code == StatusCode.INVALID_ARGUMENT
    # ...and a server with a smaller limit than its client answers RPC_FRAME_TOO_LARGE and hangs up
    small = RpcServer(SECRET, limits=RpcLimits(max_payload_bytes=1 << 20, frame_timeout_s=0.5))
    address = await small.start()
    try:
        async with RpcClient(SECRET, limits=TEST_LIMITS) as client:
            with pytest.raises(FS3Error) as e:
                await client.call(address, ECHO, rpc_pb2.EchoRequest(), payload=bytes(2 << 20))
            assert e.value.code == StatusCode.RPC_FRAME_TOO_LARGE
            # the next call reconnects
            _, payload = await client.call(address, ECHO, rpc_pb2.EchoRequest(), payload=b"fits")
            assert bytes(payload) == b"fits"
    finally:
        await small.stop()


async def test_connect_failure_and_reconnect_after_server_restart(
    rpc_client: RpcClient, transports: tuple[Transport, Transport]
) -> None:
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=transports[0])
    address = await server.start(("127.0.0.1", 0))
    await rpc_client.call(address, PING, rpc_pb2.PingRequest())
    await server.stop()
    with pytest.raises(FS3Error) as e:
        await rpc_client.call(address, PING, rpc_pb2.PingRequest())
    assert e.value.code in (StatusCode.RPC_CONNECT_FAILED, StatusCode.RPC_CONNECTION_CLOSED)
    assert e.value.retryable
    server = RpcServer(SECRET, limits=TEST_LIMITS, identity="second", transport=transports[0])
    await server.start(address)
    try:
        response, _ = await rpc_client.call(address, PING, rpc_pb2.PingRequest())
        assert response.identity == "second"
    finally:
        await server.stop()


@pytest.mark.parametrize("handler", ["Block", "InlineBlock"])
async def test_calls_in_flight_fail_when_the_server_stops(
    rpc_server: RpcServer, rpc_client: RpcClient, handler: str
) -> None:
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    task = asyncio.ensure_future(
        rpc_client.call(rpc_server.address, TEST_SERVICE[handler], rpc_pb2.EchoRequest(), timeout=10)
    )
    await poll(lambda: handlers.blocked == 1, what="the call to reach the handler")
    await rpc_server.stop()
    with pytest.raises(FS3Error) as e:
        await task
    # "server shutting down", or the connection's end: either way a client retries (not CANCELLED)
    assert e.value.code in (StatusCode.UNAVAILABLE, StatusCode.RPC_CONNECTION_CLOSED)
    assert e.value.retryable


async def test_registration_is_checked() -> None:
    server = RpcServer(SECRET)
    with pytest.raises(ValueError, match="no handler"):
        server.add_service(TEST_SERVICE, {})

    def not_async(request, payload, ctx):  # noqa: ANN001, ANN202
        return None

    with pytest.raises(TypeError):
        server.add_service(
            ServiceDef(5, "x", {1: ("A", rpc_pb2.PingRequest, rpc_pb2.PingResponse)}), {"A": not_async}
        )
    with pytest.raises(ValueError):
        ServiceDef(
            5,
            "x",
            {
                1: ("A", rpc_pb2.PingRequest, rpc_pb2.PingResponse),
                2: ("A", rpc_pb2.PingRequest, rpc_pb2.PingResponse),
            },
        )
    with pytest.raises(ValueError):
        ServiceDef(1 << 16, "x", {})


async def test_server_stops_reading_from_a_connection_with_too_much_in_progress() -> None:
    limits = RpcLimits(max_inflight_calls=4, frame_timeout_s=0.5)
    server = RpcServer(SECRET, limits=limits)
    handlers = ServiceUnderTest()
    server.add_service(TEST_SERVICE, handlers)
    address = await server.start()
    try:
        async with RpcClient(SECRET, limits=limits) as client:
            calls = [
                asyncio.ensure_future(
                    client.call(
                        address, TEST_SERVICE["Block"], rpc_pb2.EchoRequest(data=b"%d" % i), timeout=20
                    )
                )
                for i in range(50)
            ]
            await poll(lambda: handlers.blocked == 4, what="four calls in progress")
            # the rest wait, unread, for longer than the frame timeout without being cut off
            await asyncio.sleep(1.0)  # observing that nothing happens, not synchronising
            assert handlers.blocked == 4
            handlers.gate.set()
            results = await asyncio.gather(*calls)
            assert [r.data for r, _ in results] == [b"%d" % i for i in range(50)]
            assert handlers.finished == 50
    finally:
        await server.stop()


async def test_a_frame_begun_while_the_server_was_not_reading_gets_a_whole_frame_timeout_after() -> None:
    """The server stops reading a connection with too much in progress; a frame begun meanwhile is
    not cut off for the time the server was the one not reading: its sender gets a whole frame
    timeout from the moment the server reads again. (The timer kept while paused used to fire
    just after the server resumed, and close the connection if that frame had not completed.)"""
    t = 2.0
    server = RpcServer(SECRET, limits=RpcLimits(max_inflight_calls=1, frame_timeout_s=t))
    handlers = ServiceUnderTest()
    server.add_service(TEST_SERVICE, handlers)
    address = await server.start()
    block = TEST_SERVICE["Block"]
    blocked = rpcwire.frame(
        F_REQUEST, 1, block.service_id, block.id, rpc_pb2.EchoRequest(data=b"b").SerializeToString()
    )
    second = rpcwire.frame(F_REQUEST, 2, 0, ECHO.id, rpc_pb2.EchoRequest(data=b"second").SerializeToString())
    try:
        with rpcwire.connect(address) as sock:
            await asyncio.to_thread(rpcwire.handshake, sock)
            await asyncio.to_thread(sock.sendall, blocked + second[: HEADER_SIZE + 2])
            await poll(lambda: handlers.blocked == 1, what="the call in progress")
            # the server's timer of the begun frame runs out at t and 2t while it does not read
            # (and is set again); it reads again at 2.5t, and the rest comes 0.75t later
            await asyncio.sleep(2.5 * t)
            handlers.gate.set()
            await asyncio.sleep(0.75 * t)
            await asyncio.to_thread(sock.sendall, second[HEADER_SIZE + 2 :])
            replies = [await asyncio.to_thread(rpcwire.read_frame, sock) for _ in range(2)]
            # (flags, request id, ...): both answered, neither an error
            assert [(hdr[:2], msg) for hdr, msg, _ in replies] == [
                ((F_RESPONSE, 1), rpc_pb2.EchoResponse(data=b"b").SerializeToString()),
                ((F_RESPONSE, 2), rpc_pb2.EchoResponse(data=b"second").SerializeToString()),
            ]
    finally:
        await server.stop()


def _source_requests(count: int, length: int) -> bytes:
    return b"".join(
        rpcwire.frame(
            F_REQUEST, i + 1, 0, SOURCE.id, rpc_pb2.SourceRequest(length=length).SerializeToString()
        )
        for i in range(count)
    )


async def test_a_peer_that_stops_reading_its_replies_is_disconnected() -> None:
    """A client that sends requests and never reads the replies would hold its connection, and the
    server the replies it could not send, for ever (the server stops reading from it, so does not
    even see it go away): after write_stall_timeout_s without taking a byte, it is cut off."""
    server = RpcServer(SECRET, limits=RpcLimits(write_stall_timeout_s=1.0))
    address = await server.start()
    try:
        with rpcwire.connect(address) as sock:
            await asyncio.to_thread(rpcwire.handshake, sock)
            await asyncio.to_thread(sock.sendall, _source_requests(32, 1 << 20))
            await poll(lambda: server.connection_count == 0, within=10, what="the server to drop the peer")
            # what the socket still holds arrives, then the connection ends (a reset: the server
            # aborted it with data unsent)
            data = await asyncio.to_thread(rpcwire.wait_closed, sock)
            assert len(data) < 32 << 20
    finally:
        await server.stop()


async def test_a_slow_reader_is_not_taken_for_a_stalled_one() -> None:
    """A peer that takes our replies slowly, but some within every write_stall_timeout_s, keeps its
    connection and gets every reply whole."""
    server = RpcServer(SECRET, limits=RpcLimits(write_stall_timeout_s=1.0))
    address = await server.start()
    count, length = 16, 1 << 20
    try:
        with rpcwire.connect(address, timeout=10) as sock:
            await asyncio.to_thread(rpcwire.handshake, sock)
            await asyncio.to_thread(sock.sendall, _source_requests(count, length))
            got = bytearray()
            for _ in range(12):  # 256 KiB every 0.3 s: 3 MiB in 3.6 s, three stall timeouts
                await asyncio.sleep(0.3)
                got += await asyncio.to_thread(rpcwire.recv_exact, sock, 256 << 10)
            assert server.connection_count == 1
            rest = count * (HEADER_SIZE + length) - len(got)
            got += await asyncio.to_thread(rpcwire.recv_exact, sock, rest)
            replies = rpcwire.parse_frames(bytes(got))
            assert [hdr[:2] for hdr, _ in replies] == [(F_RESPONSE, i + 1) for i in range(count)]
            pattern = source_pattern(length)
            pos = 0
            for _ in range(count):
                pos += HEADER_SIZE
                assert got[pos : pos + length] == pattern
                pos += length
    finally:
        await server.stop()


async def test_closing_the_client_fails_calls_in_flight(rpc_server: RpcServer) -> None:
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    client = RpcClient(SECRET, limits=TEST_LIMITS)
    call = asyncio.ensure_future(
        client.call(rpc_server.address, TEST_SERVICE["Block"], rpc_pb2.EchoRequest(), timeout=10)
    )
    await poll(lambda: handlers.blocked == 1, what="the call to reach the handler")
    await client.close()
    with pytest.raises(FS3Error) as e:
        await call
    assert e.value.code == StatusCode.RPC_CONNECTION_CLOSED
    with pytest.raises(FS3Error) as e:
        await client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    assert e.value.code == StatusCode.CANCELLED
    await poll(lambda: rpc_server.connection_count == 0, what="the server to see the connection go")


async def test_retired_connections_finish_their_calls_then_close(rpc_server: RpcServer) -> None:
    """After a credential change later calls go over new connections, while the calls in flight
    on the old ones end as usual; the old ones close once they have (nothing is aborted)."""
    handlers = rpc_server.handlers  # type: ignore[attr-defined]
    async with RpcClient(SECRET, limits=TEST_LIMITS, connections_per_peer=2) as client:
        for _ in range(2):
            await client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
        await asyncio.gather(
            *(client.call(rpc_server.address, PING, rpc_pb2.PingRequest()) for _ in range(20))
        )
        await poll(lambda: rpc_server.connection_count == 2, what="two connections")
        blocked = asyncio.ensure_future(
            client.call(rpc_server.address, TEST_SERVICE["Block"], rpc_pb2.EchoRequest(data=b"b"), timeout=10)
        )
        await poll(lambda: handlers.blocked == 1, what="the call to reach the handler")
        assert client.retire_connections() == 2
        assert client.retire_connections() == 0  # retiring already
        # the idle one closes at once, the busy one stays open for its call
        await poll(lambda: rpc_server.connection_count == 1, what="the idle retired connection to close")
        response, _ = await client.call(rpc_server.address, ECHO, rpc_pb2.EchoRequest(data=b"new"))
        assert response.data == b"new"
        assert rpc_server.connection_count == 2  # a new one, and the busy old one
        handlers.gate.set()
        assert (await blocked)[0].data == b"b"
        await poll(lambda: rpc_server.connection_count == 1, what="the busy retired connection to close")
        await poll(lambda: not client._retiring, what="the retirements to end")


@pytest.mark.skipif(not socket.has_ipv6, reason="this host has no IPv6")
async def test_a_server_on_the_ipv6_wildcard_takes_ipv4_too() -> None:
    """asyncio makes a TCP listener on :: IPv6 only, while a daemon on a wildcard advertises its
    host name, which resolves to an IPv4 address: no client or peer could reach it."""
    server = RpcServer(SECRET, limits=TEST_LIMITS)
    _, port = await server.start(("::", 0))
    try:
        async with RpcClient(SECRET, limits=TEST_LIMITS) as client:
            for host in ("127.0.0.1", "::1"):
                response, _ = await client.call((host, port), PING, rpc_pb2.PingRequest())
                assert response.identity
    finally:
        await server.stop()
