"""The RDMA transport end to end — handshake over TCP, SEND/RECV with credits, pulled payloads, the
one-sided API, closing — over the fake verbs fabric of :mod:`fakeverbs` (no device needed). Only
:mod:`fs3.net.rdma.verbs` is not exercised here; ``test_device.py`` runs the same calls on a device."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator, Callable

import pytest
from cluster import wait_until
from fakeverbs import Fabric
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from fs3.config import RdmaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcLimits, RpcServer, ServiceDef
from fs3.net.frame import FrameError, encode_header
from fs3.net.rdma.connection import RdmaConnection
from fs3.net.rdma.transport import RdmaMetrics, RdmaTransport
from fs3.net.rdma.wire import FEATURE_REPLY_BUFFERS, WRITTEN, RemoteBuffer, pack_chunk_header
from fs3.net.rdma.workreq import Completion, WrKind, encode_wr_id
from fs3.net.system import ECHO, PING, SINK, SOURCE, source_pattern
from fs3.net.transport import Connection, FrameReceiver
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)
SECRET = b"rdma-test-secret-0123456789abcdef"
LIMITS = RpcLimits(max_payload_bytes=32 << 20, frame_timeout_s=2.0, handshake_timeout_s=2.0)


async def poll(condition: Callable[[], bool], within: float = 5.0, what: str = "condition") -> None:
    await wait_until(condition, within, what, interval_s=0.005)


class Pair:
    def __init__(
        self, fabric: Fabric, server: RpcServer, client: RpcClient, st: RdmaTransport, ct: RdmaTransport
    ):
        self.fabric, self.server, self.client, self.st, self.ct = fabric, server, client, st, ct

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address


async def _pair(cfg: RdmaConfig | None = None) -> Pair:
    fabric = Fabric()
    cfg = cfg or RdmaConfig()
    st = RdmaTransport(cfg, inventory=fabric.inventory(), opener=fabric.opener, limits=LIMITS)
    ct = RdmaTransport(cfg, inventory=fabric.inventory(), opener=fabric.opener, limits=LIMITS)
    server = RpcServer(SECRET, identity="rdma-server", transport=st, limits=LIMITS)
    await server.start(("127.0.0.1", 0))
    client = RpcClient(SECRET, identity="rdma-client", transport=ct, limits=LIMITS, default_timeout=20)
    return Pair(fabric, server, client, st, ct)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    p = await _pair()
    try:
        yield p
    finally:
        await p.client.close()
        await p.server.stop()
        p.st.close()
        p.ct.close()
    assert p.fabric.rnr_errors == 0


async def test_calls_and_payloads_of_every_size(pair: Pair) -> None:
    response, payload = await pair.client.call(pair.address, PING, rpc_pb2.PingRequest())
    assert response.identity == "rdma-server" and payload is None
    for size in (1, 4095, 65536, 65537, 3 << 20, 16 << 20):
        data = os.urandom(size)
        response, payload = await pair.client.call(pair.address, ECHO, rpc_pb2.EchoRequest(), payload=data)
        assert payload is not None and hashlib.sha256(payload).digest() == hashlib.sha256(data).digest()
    # payloads above inline_payload_bytes went by RDMA READ, both ways (request and reply)
    assert pair.fabric.reads >= 6
    # a message far larger than a receive buffer spans many SENDs
    big = os.urandom(300_000)
    response, _ = await pair.client.call(pair.address, ECHO, rpc_pb2.EchoRequest(data=big))
    assert response.data == big


async def test_into_buffer_and_payload_crc() -> None:
    p = await _pair()
    client = RpcClient(SECRET, transport=p.ct, limits=LIMITS, payload_crc=True)
    try:
        data = os.urandom(200_000)
        dest = bytearray(300_000)
        _, payload = await client.call(p.address, ECHO, rpc_pb2.EchoRequest(), payload=data, into=dest)
        assert payload is not None and payload.obj is dest and bytes(dest[:200_000]) == data
    finally:
        await client.close()
        await p.client.close()
        await p.server.stop()


async def test_credits_with_tiny_windows_under_load() -> None:
    # 4 receive buffers of 1 KiB each way: thousands of SENDs, credit returns on every few
    cfg = RdmaConfig(recv_buffers=4, send_buffers=4, buffer_size=1024, inline_payload_bytes=2048)
    p = await _pair(cfg)
    try:
        calls = [
            p.client.call(
                p.address, ECHO, rpc_pb2.EchoRequest(data=os.urandom(i % 3000)), payload=os.urandom(i % 5000)
            )
            for i in range(400)
        ]
        results = await asyncio.gather(*calls)
        assert len(results) == 400
        assert p.fabric.rnr_errors == 0  # never a SEND without a posted receive buffer
        conns = list(p.ct.connections)
        assert conns and all(0 <= c.credits.credits <= 4 for c in conns)
    finally:
        await p.client.close()
        await p.server.stop()


async def _one_nic(
    cfg: RdmaConfig, limits: RpcLimits
) -> tuple[RdmaTransport, RdmaTransport, RpcServer, RpcClient, Fabric]:
    """A server and a client transport of one NIC each, with ``limits`` everywhere."""
    fabric = Fabric()
    st = RdmaTransport(cfg, inventory=fabric.inventory(1), opener=fabric.opener, limits=limits)
    ct = RdmaTransport(cfg, inventory=fabric.inventory(1), opener=fabric.opener, limits=limits)
    server = RpcServer(SECRET, transport=st, limits=limits)
    await server.start(("127.0.0.1", 0))
    return st, ct, server, RpcClient(SECRET, transport=ct, limits=limits), fabric


async def test_staging_pool_back_pressure() -> None:
    # 1 MiB of staging memory per NIC, 20 concurrent 300 KiB payloads: they wait for each other
    cfg = RdmaConfig(pool_bytes=1 << 20, inline_payload_bytes=1024)
    st, ct, server, client, _ = await _one_nic(cfg, dataclasses.replace(LIMITS, max_payload_bytes=512 << 10))
    try:
        datas = [os.urandom(300 << 10) for _ in range(20)]
        results = await asyncio.gather(
            *(client.call(server.address, SINK, rpc_pb2.SinkRequest(), payload=d) for d in datas)
        )
        assert all(r.received == 300 << 10 for r, _ in results)
        for t in (st, ct):
            assert t.nics[0].pool.registered_bytes <= 1 << 20
            assert t.nics[0].pool.in_use_bytes == 0
    finally:
        await client.close()
        await server.stop()


async def test_connections_rotate_over_nics(pair: Pair) -> None:
    clients = [RpcClient(SECRET, transport=pair.ct, limits=LIMITS) for _ in range(4)]
    try:
        for c in clients:
            await c.call(pair.address, PING, rpc_pb2.PingRequest())
        nics = sorted(c.nic for c in pair.ct.connections)  # type: ignore[attr-defined]
        assert nics == ["fake0:1", "fake0:1", "fake1:1", "fake1:1"]
    finally:
        for c in clients:
            await c.close()


async def test_tcp_clients_share_the_rdma_listener(pair: Pair) -> None:
    async with RpcClient(SECRET, limits=LIMITS) as tcp_client:
        data = os.urandom(100_000)
        _, payload = await tcp_client.call(pair.address, ECHO, rpc_pb2.EchoRequest(), payload=data)
        assert bytes(payload) == data
    # and bad TCP input gets the TCP transport's answer, not a hang
    reader, writer = await asyncio.open_connection(*pair.address)
    writer.write(b"GET / HTTP/1.0\r\n\r\n" + bytes(64))
    assert await asyncio.wait_for(reader.read(), 5) is not None  # the server answers and closes
    writer.close()


@pytest.mark.parametrize(
    "garbage",
    [
        b"FS3V" + bytes(8),  # version 0
        b"FS3V\x01\x00\x01\x00" + (1 << 30).to_bytes(4, "little"),  # oversized body
        b"FS3V\x01\x00\x02\x00" + (40).to_bytes(4, "little") + bytes(40),  # ACCEPT from a client
        b"FS3V\x01\x00\x01\x00" + (40).to_bytes(4, "little") + bytes(40),  # all-zero parameters
        b"FS3V\x01",  # truncated, then silence
    ],
)
async def test_malformed_handshakes_are_refused(pair: Pair, garbage: bytes) -> None:
    reader, writer = await asyncio.open_connection(*pair.address)
    writer.write(garbage)
    # closed by the server: at once for bad input, after handshake_timeout_s for silence
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await pair.client.call(pair.address, PING, rpc_pb2.PingRequest())  # the listener is fine
    assert len(pair.st.connections) == 1


async def test_closing_either_side(pair: Pair) -> None:
    await pair.client.call(pair.address, PING, rpc_pb2.PingRequest())
    assert pair.server.connection_count == 1
    await pair.client.close()
    await poll(lambda: pair.server.connection_count == 0, what="server to see the close")
    await poll(lambda: not pair.st.connections and not pair.ct.connections, what="connections gone")
    assert not pair.fabric.qps  # every queue pair destroyed
    # the server going away fails calls in flight, retryably
    client = RpcClient(SECRET, transport=pair.ct, limits=LIMITS)
    entered = asyncio.Event()

    async def block(request: rpc_pb2.EchoRequest, payload: object, ctx: object) -> rpc_pb2.EchoResponse:
        entered.set()
        await asyncio.Event().wait()  # until the server stops
        return rpc_pb2.EchoResponse()

    svc = ServiceDef(77, "blk", {1: ("Block", rpc_pb2.EchoRequest, rpc_pb2.EchoResponse)})
    pair.server.add_service(svc, {"Block": block})
    call = asyncio.ensure_future(client.call(pair.address, svc["Block"], rpc_pb2.EchoRequest(), timeout=10))
    await asyncio.wait_for(entered.wait(), 5)
    await pair.server.stop()
    with pytest.raises(FS3Error) as info:
        await call
    # the server cancels the call and says so ("shutting down"), or the connection ends first:
    # both are retryable
    assert info.value.code in (StatusCode.RPC_CONNECTION_CLOSED, StatusCode.UNAVAILABLE)
    assert info.value.retryable
    await client.close()


async def test_failed_read_of_a_payload_breaks_only_that_connection(pair: Pair) -> None:
    await pair.client.call(pair.address, PING, rpc_pb2.PingRequest())
    pair.fabric.fail_next_read = True
    with pytest.raises(FS3Error) as info:
        await pair.client.call(pair.address, SINK, rpc_pb2.SinkRequest(), payload=os.urandom(1 << 20))
    assert info.value.code == StatusCode.RPC_CONNECTION_CLOSED
    # the client reconnects on the next call
    response, _ = await pair.client.call(pair.address, PING, rpc_pb2.PingRequest())
    assert response.identity == "rdma-server"


# ---- raw connections: the one-sided API and bad chunks -------------------------------------------


class Recorder(FrameReceiver):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.frames: list[tuple[int, bytes, bytes | None]] = []
        self.errors: list[FrameError] = []
        self.lost = asyncio.Event()
        self.lost_with: BaseException | None = None

    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        return memoryview(bytearray(length))

    def frame_received(self, flags, request_id, service_id, method_id, timeout_ms, message, payload) -> None:  # type: ignore[no-untyped-def]
        self.frames.append((request_id, bytes(message), None if payload is None else bytes(payload)))

    def frame_error(self, error: FrameError) -> None:
        self.errors.append(error)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost_with = exc
        self.lost.set()


async def _raw(
    cfg: RdmaConfig | None = None, limits: RpcLimits = LIMITS, authenticated: bool = True
) -> tuple[Fabric, RdmaTransport, RdmaTransport, list[Recorder], Recorder]:
    """Two RDMA transports connected without the RPC layer; ``authenticated`` stands for the RPC
    handshake having succeeded on both sides (which lets each peer reach what it is lent)."""
    fabric = Fabric()
    cfg = cfg or RdmaConfig()
    st = RdmaTransport(cfg, inventory=fabric.inventory(1), opener=fabric.opener)
    ct = RdmaTransport(cfg, inventory=fabric.inventory(1), opener=fabric.opener)
    accepted: list[Recorder] = []

    def server_side(conn: Connection) -> Recorder:
        r = Recorder(conn)
        accepted.append(r)
        return r

    listener = await st.listen(("127.0.0.1", 0), server_side, limits=limits)
    client_conn = await ct.connect(listener.address, Recorder, limits=limits)
    await poll(lambda: len(accepted) == 1, what="accept")
    assert isinstance(client_conn, RdmaConnection)
    if authenticated:
        client_conn.peer_authenticated()
        accepted[0].conn.peer_authenticated()
    return fabric, st, ct, accepted, client_conn._receiver  # type: ignore[return-value]


async def test_one_sided_write_and_read_between_registered_buffers() -> None:
    fabric, st, ct, accepted, client_rx = await _raw(RdmaConfig(max_onesided_per_nic=2))
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    # the client lends a registered buffer; the server RDMA-WRITEs "read data" into it
    dest = await ct.alloc_buffer(client, 1 << 20)
    desc = client.expose(dest.view, write=True)
    data = os.urandom(1 << 20)
    await asyncio.gather(
        *(
            server.rdma_write(
                data[i << 16 : (i + 1) << 16],
                dataclasses.replace(desc, addr=desc.addr + (i << 16), length=1 << 16),
            )
            for i in range(16)
        )
    )
    assert bytes(dest.view) == data
    assert server.limiter.peak <= 2  # the per-NIC cap held with 16 concurrent writes
    # ... and RDMA-READs "write data" from it, into registered and unregistered memory alike
    staged = await st.alloc_buffer(server, 1 << 20)
    await server.rdma_read(staged.view, desc)
    assert bytes(staged.view) == data
    plain = memoryview(bytearray(4096))
    await server.rdma_read(plain, dataclasses.replace(desc, length=4096))
    assert bytes(plain) == data[:4096]
    # a chain successor pulls from its predecessor's staging buffer the same way
    succ_dest = memoryview(bytearray(1 << 20))
    lent = server.expose(staged.view)
    await client.rdma_read(succ_dest, lent)
    assert bytes(succ_dest) == data
    server.withdraw(lent)
    # refused before the NIC sees them: sizes that differ, memory that is not registered
    with pytest.raises(FS3Error, match="differ in size"):
        await server.rdma_read(memoryview(bytearray(10)), RemoteBuffer(desc.addr, desc.rkey, 11))
    with pytest.raises(FS3Error, match="not registered"):
        client.expose(bytearray(10))
    client.send_frame(1, 9, 1, 1, b"still fine")
    await poll(lambda: accepted[0].frames, what="frame after the refused calls")
    ct.free_buffer(client, dest)
    st.free_buffer(server, staged)
    # a bad rkey puts both queue pairs in the error state (IBTA: the requester's, and the
    # responder's for a remote access violation): the connection ends at both ends at once, and
    # whatever else was under way on it fails, rather than later with flushed work requests
    with pytest.raises(FS3Error, match="remote access error"):
        await server.rdma_write(b"x" * 10, RemoteBuffer(desc.addr, desc.rkey + 999, 10))
    await asyncio.wait_for(client.wait_closed(), 5)
    await asyncio.wait_for(accepted[0].lost.wait(), 5)
    with pytest.raises(FS3Error, match="closed"):
        await server.rdma_read(plain, dataclasses.replace(desc, length=4096))
    assert server.limiter.outstanding == 0 and server.pool.in_use_bytes == 0
    assert fabric.rnr_errors == 0


async def test_receive_buffers_are_not_reachable_by_the_peer() -> None:
    """Receive buffers are registered for local access only: a peer cannot write into them."""
    fabric, st, ct, accepted, client_rx = await _raw()
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    recv = client._recv.region
    with pytest.raises(FS3Error, match="remote access error"):
        await server.rdma_write(b"x" * 10, RemoteBuffer(recv.addr, recv.rkey, 10))
    await asyncio.wait_for(client.wait_closed(), 5)


async def test_a_cancelled_one_sided_call_keeps_its_memory_and_slot_until_the_completion() -> None:
    """The NIC may still move bytes when the caller gives up: the staging buffer (which the pool
    would hand to the next caller) and the per-NIC slot stay taken until the completion."""
    fabric, st, ct, accepted, client_rx = await _raw(RdmaConfig(max_onesided_per_nic=1))
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    src = await ct.alloc_buffer(client, 8192)
    src.view[:] = b"R" * 8192
    desc = client.expose(src.view)
    held: list = []
    server._qp.held = held  # type: ignore[attr-defined]
    dest = memoryview(bytearray(8192))  # not registered: the READ lands in a staging buffer
    reading = asyncio.create_task(server.rdma_read(dest, desc))
    await poll(lambda: len(held) == 1, what="the READ posted")
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert server.pool.in_use_bytes == 8192 and server.limiter.outstanding == 1
    # another call waits for the slot rather than posting past the per-NIC cap
    second = asyncio.create_task(server.rdma_read(memoryview(bytearray(8192)), desc))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(held) == 1 and server.limiter.outstanding == 1
    server._qp.held = None  # type: ignore[attr-defined]
    held.pop()()  # the NIC executes the abandoned READ now, into memory nobody else was given
    await asyncio.wait_for(second, 5)
    assert bytes(dest) == bytes(8192)  # the abandoned caller's buffer is left alone
    assert server.pool.in_use_bytes == 0 and server.limiter.outstanding == 0
    client.close()
    await client.wait_closed()


async def test_completions_after_the_one_that_ended_the_connection_are_not_handled() -> None:
    """One poll batch: a failed receive (the connection ends), then a SEND that completed: its
    on_sent must not run after connection_lost (the Connection contract)."""
    fabric, st, ct, accepted, client_rx = await _raw()
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    qp = client._qp
    held: list = []
    qp.held = held  # type: ignore[attr-defined]
    events: list[str] = []
    lost = client_rx.connection_lost
    client_rx.connection_lost = lambda exc: (events.append("lost"), lost(exc))  # type: ignore[method-assign]
    client.send_frame(1, 5, 1, 1, b"hello", on_sent=lambda: events.append("on_sent"))
    await poll(lambda: len(held) == 1, what="the SEND posted")
    slot = next(iter(client._slot_end))
    qp.cq.extend(  # type: ignore[attr-defined]
        [Completion(encode_wr_id(WrKind.RECV, 0), 12), Completion(encode_wr_id(WrKind.SEND, slot), 0)]
    )
    client._poll()
    assert events == ["lost"]


async def test_sends_of_a_burst_share_completions_and_every_slot_comes_back() -> None:
    cfg = RdmaConfig(send_buffers=16, recv_buffers=16, buffer_size=1024, inline_payload_bytes=1 << 20)
    fabric, st, ct, accepted, client_rx = await _raw(cfg)
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    sent_cb: list[int] = []
    frames = []
    for i in range(1, 41):
        payload = os.urandom(i * 997)  # inline: 1 to 39 receive buffers each
        frames.append((i, b"m%d" % i, payload))
        client.send_frame(1, i, 1, 1, b"m%d" % i, payload, on_sent=lambda i=i: sent_cb.append(i))
    await poll(lambda: len(accepted[0].frames) == len(frames), what="all frames")
    assert accepted[0].frames == frames
    # every slot is given back and every on_sent called: no SEND waits for a completion that never comes
    await poll(lambda: client._send.available == client._send.count, what="send slots back")
    await poll(lambda: len(sent_cb) == len(frames), what="on_sent callbacks")
    assert sent_cb == list(range(1, 41))
    # far fewer completions than SENDs (at most one per four in a long burst, plus each burst's last)
    client_sends = client.credits.sent
    assert client_sends > 400 and fabric.send_completions < fabric.sends // 2
    assert fabric.rnr_errors == 0
    client.close()
    await client.wait_closed()
    await asyncio.wait_for(accepted[0].lost.wait(), 5)


async def test_malformed_chunk_closes_the_connection() -> None:
    fabric, st, ct, accepted, client_rx = await _raw()
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    slot = client._send.acquire()
    assert slot is not None
    buf = client._send.view(slot)
    n = pack_chunk_header(buf, 0, [], 500)  # claims 500 stream bytes, carries 3
    buf[n : n + 3] = b"abc"
    client.credits.take_send()
    client._qp.post_send(
        encode_wr_id(WrKind.SEND, slot), client._send.region, client._send.offset(slot), n + 3
    )
    await asyncio.wait_for(accepted[0].lost.wait(), 5)
    assert accepted[0].errors and accepted[0].errors[0].code == StatusCode.RPC_MALFORMED_FRAME
    await asyncio.wait_for(client_rx.lost.wait(), 5)


async def test_frames_keep_their_order_around_pulled_payloads() -> None:
    fabric, st, ct, accepted, client_rx = await _raw(RdmaConfig(inline_payload_bytes=1000))
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    sent = []
    for i in range(1, 60):
        payload = os.urandom((i * 7919) % 5000) if i % 3 else None
        sent.append((i, b"m%d" % i, payload or None))
        client.send_frame(1, i, 1, 1, b"m%d" % i, payload)
    await poll(lambda: len(accepted[0].frames) == len(sent), what="all frames")
    assert accepted[0].frames == sent
    await poll(lambda: client.stats()["lent_payloads"] == 0, what="payloads released")
    client.close()
    await client.wait_closed()


def _post_raw_chunk(conn: RdmaConnection, stream: bytes) -> None:
    slot = conn._send.acquire()
    assert slot is not None
    buf = conn._send.view(slot)
    n = pack_chunk_header(buf, 0, [], len(stream))
    buf[n : n + len(stream)] = stream
    conn.credits.take_send()
    conn._qp.post_send(
        encode_wr_id(WrKind.SEND, slot), conn._send.region, conn._send.offset(slot), n + len(stream)
    )


async def test_a_frame_left_unfinished_is_cut_off_after_frame_timeout() -> None:
    limits = dataclasses.replace(LIMITS, frame_timeout_s=0.3)
    fabric, st, ct, accepted, client_rx = await _raw(limits=limits)
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    _post_raw_chunk(client, encode_header(1, 5, 1, 1, 1000, 0) + b"only part of it")
    await asyncio.wait_for(accepted[0].lost.wait(), 5)
    assert [e.code for e in accepted[0].errors] == [StatusCode.DEADLINE_EXCEEDED]
    await asyncio.wait_for(client_rx.lost.wait(), 5)


async def test_a_frame_begun_before_a_pause_gets_a_whole_frame_timeout_after_it() -> None:
    """A frame begun, then the receiver pauses for longer than the frame timeout: its sender gets
    a whole frame timeout from the resume (a timer set again while paused, due a moment after the
    resume, used to cut the connection off before the frames were even taken up again)."""
    t = 1.0
    fabric, st, ct, accepted, client_rx = await _raw(limits=dataclasses.replace(LIMITS, frame_timeout_s=t))
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    whole = encode_header(1, 5, 1, 1, 40, 0) + b"y" * 40
    _post_raw_chunk(client, whole[:-30])
    await poll(lambda: server._assembler.mid_frame, what="the frame begun")
    server.pause_receiving(True)
    # the timer runs out at t and 2t while paused (and is set again); the resume comes at 2.5t,
    # the rest of the frame 0.75t after it
    await asyncio.sleep(2.5 * t)
    server.pause_receiving(False)
    await asyncio.sleep(0.75 * t)
    assert not accepted[0].lost.is_set(), accepted[0].errors
    _post_raw_chunk(client, whole[-30:])
    await poll(lambda: len(accepted[0].frames) == 1 or accepted[0].lost.is_set(), what="the frame")
    assert accepted[0].errors == [] and [f[0] for f in accepted[0].frames] == [5]


async def test_paused_receiver_holds_buffers_and_gets_everything_on_resume() -> None:
    cfg = RdmaConfig(recv_buffers=8, send_buffers=8, buffer_size=1024)
    fabric, st, ct, accepted, client_rx = await _raw(cfg)
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    server.pause_receiving(True)
    for i in range(1, 101):
        client.send_frame(1, i, 1, 1, b"x" * 900)
    # the client runs out of credits: the paused side keeps its buffers (all but two)
    await poll(
        lambda: client.credits.credits <= 2 and not client._send.available < client._send.count,
        what="credits exhausted",
    )
    assert len(server._held) == 6 and accepted[0].frames == [] and fabric.rnr_errors == 0
    assert client.write_paused is False and client.stats()["queued_bytes"] > 0
    server.pause_receiving(False)
    await poll(lambda: len(accepted[0].frames) == 100, what="all frames after resume")
    assert [f[0] for f in accepted[0].frames] == list(range(1, 101)) and fabric.rnr_errors == 0


async def test_a_peer_that_takes_none_of_our_data_is_disconnected() -> None:
    """A peer that posts no receives returns no credits: after write_stall_timeout_s without one of
    our SENDs completing, while bytes wait for it, the connection is broken (as on TCP)."""
    cfg = RdmaConfig(recv_buffers=8, send_buffers=8, buffer_size=1024)
    limits = dataclasses.replace(LIMITS, write_stall_timeout_s=0.5)
    fabric, st, ct, accepted, client_rx = await _raw(cfg, limits=limits)
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    server.pause_receiving(True)  # holds the buffers the client's SENDs land in
    for i in range(1, 101):
        client.send_frame(1, i, 1, 1, b"x" * 900)
    await asyncio.wait_for(client_rx.lost.wait(), 5)
    assert "took none of our data" in str(client_rx.lost_with)
    assert len(accepted[0].frames) < 100


async def test_a_peer_taking_our_data_in_bursts_keeps_its_connection() -> None:
    """Progress within every write_stall_timeout_s keeps a connection, however long it has had
    bytes waiting in all."""
    cfg = RdmaConfig(recv_buffers=8, send_buffers=8, buffer_size=1024)
    limits = dataclasses.replace(LIMITS, write_stall_timeout_s=0.6)
    fabric, st, ct, accepted, client_rx = await _raw(cfg, limits=limits)
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    for burst in range(3):  # bytes wait for 1.2 s in all, never 0.6 s without progress
        server.pause_receiving(True)
        for i in range(1, 101):
            client.send_frame(1, burst * 100 + i, 1, 1, b"x" * 900)
        await asyncio.sleep(0.4)
        server.pause_receiving(False)
        want = (burst + 1) * 100
        await poll(lambda: len(accepted[0].frames) == want, what="the burst")  # noqa: B023
    assert not client_rx.lost.is_set() and not accepted[0].lost.is_set()
    assert [f[0] for f in accepted[0].frames] == list(range(1, 301))


async def test_drain_waiters_are_not_overtaken_and_one_giving_up_leaves_the_others() -> None:
    """The rules of fs3.net.transport.DrainWaiters, which the TCP connection follows too: a
    waiter cancelled by its deadline leaves the others waiting; waiters go on at the low-water
    mark, and until then a newcomer waits with them even once the queue is below the mark that
    pauses callers (else steady senders would keep it from ever getting low)."""
    cfg = RdmaConfig(recv_buffers=8, send_buffers=8, buffer_size=4096)
    fabric, st, ct, accepted, client_rx = await _raw(cfg)
    client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    high, low = 16 << 20, 4 << 20  # the connection's marks
    server.pause_receiving(True)
    n = 0
    while not client.write_paused:
        n += 1
        client.send_frame(1, n, 1, 1, b"x" * (256 << 10))
    first = asyncio.ensure_future(client.drain())
    second = asyncio.ensure_future(client.drain())
    await asyncio.sleep(0)
    assert not first.done() and not second.done()
    first.cancel()  # its caller's deadline passed
    await asyncio.sleep(0)
    assert first.cancelled() and not second.done()
    server.pause_receiving(False)
    # one loop iteration at a time, to look at the queue between the two marks
    while client.stats()["queued_bytes"] >= high:  # noqa: ASYNC110
        await asyncio.sleep(0)
    assert client.stats()["queued_bytes"] > low and not second.done()
    assert client.write_paused
    late = asyncio.ensure_future(client.drain())
    await asyncio.sleep(0)
    assert not late.done()
    await asyncio.wait_for(asyncio.gather(second, late), 5)
    assert client.stats()["queued_bytes"] <= low
    await poll(lambda: len(accepted[0].frames) == n, what="all frames")
    assert [f[0] for f in accepted[0].frames] == list(range(1, n + 1))
    assert not client.write_paused


@settings(max_examples=25, deadline=None)
@given(
    recv_buffers=st.integers(3, 8),
    buffer_size=st.sampled_from([1024, 1500, 4096]),
    inline=st.integers(0, 3000),
    frames=st.lists(
        st.tuples(st.integers(0, 5000), st.integers(0, 9000), st.booleans()), min_size=1, max_size=40
    ),
)
def test_random_streams_arrive_whole_and_in_order(
    recv_buffers: int, buffer_size: int, inline: int, frames: list[tuple[int, int, bool]]
) -> None:
    """Any window, buffer size and inline threshold; any mix of message and payload sizes; the
    receiver pausing and resuming at random: every frame arrives once, intact, in order, both ways,
    and no SEND ever meets an empty receive queue."""

    async def run() -> None:
        cfg = RdmaConfig(
            recv_buffers=recv_buffers,
            send_buffers=recv_buffers,
            buffer_size=buffer_size,
            inline_payload_bytes=inline,
        )
        fabric, st_, ct, accepted, client_rx = await _raw(cfg)
        client: RdmaConnection = client_rx.conn  # type: ignore[assignment]
        server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
        expect = []
        for i, (mlen, plen, toggle) in enumerate(frames, 1):
            msg, payload = os.urandom(mlen), (os.urandom(plen) if plen else None)
            expect.append((i, msg, payload))
            client.send_frame(1, i, 1, 1, msg, payload)
            server.send_frame(2, i, 1, 1, msg, payload)
            if toggle:
                server.pause_receiving(not server._paused)
                await asyncio.sleep(0)
        server.pause_receiving(False)
        await poll(
            lambda: len(accepted[0].frames) == len(frames) and len(client_rx.frames) == len(frames), 20
        )
        assert accepted[0].frames == expect and client_rx.frames == expect
        assert fabric.rnr_errors == 0
        client.close()
        await client.wait_closed()
        await asyncio.wait_for(accepted[0].lost.wait(), 5)
        st_.close()
        ct.close()
        assert not fabric.qps and fabric.registered == 0  # every queue pair and registration released

    asyncio.run(run())


async def test_a_tcp_client_s_large_first_burst_is_handed_to_the_tcp_transport(pair: Pair) -> None:
    # 200 KiB may be buffered before the listener has decided what the socket is; all of it goes to
    # the TCP transport, which judges it as it would on its own listener: a request before the
    # handshake, larger than the handshake limits, gets an error frame (magic b"FS3R") and a close.
    reader, writer = await asyncio.open_connection(*pair.address)
    writer.write(encode_header(1, 7, 1, 1, 200_000, 0) + bytes(200_000))
    reply = await asyncio.wait_for(reader.read(), 10)
    assert reply[:4] == b"FS3R"
    writer.close()


def _conns(t: RdmaTransport) -> list[RdmaConnection]:
    return list(t.connections)


def _pools_idle(*transports: RdmaTransport) -> bool:
    return all(n.pool.in_use_bytes == 0 for t in transports for n in t.nics)


@pytest.mark.parametrize("payload_crc", [False, True])
async def test_a_reply_into_the_caller_s_buffer_is_written_there_by_the_server(payload_crc: bool) -> None:
    """A call with ``into=`` names a reply buffer; the server RDMA WRITEs the reply's payload into
    it and sends the reply after: no READ, no release token; the buffer goes back to the pool as
    the reply arrives. A reply too small to be pulled, a failed call and a reply too large for the
    buffer leave it unwritten, and it goes back all the same."""
    p = await _pair(RdmaConfig(inline_payload_bytes=4096))
    client = RpcClient(SECRET, transport=p.ct, limits=LIMITS, payload_crc=payload_crc)
    try:
        for n in (4097, 300_000, 3 << 20):
            dest = bytearray(n + 100)
            reads = p.fabric.reads
            _, payload = await client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=n), into=dest)
            assert payload is not None and payload.obj is dest and bytes(payload) == source_pattern(n)
            assert p.fabric.reads == reads  # nothing pulled
        (cconn,) = _conns(p.ct)
        (sconn,) = _conns(p.st)
        assert sconn.stats()["pushed"] == 3 and cconn.stats()["received_written"] == 3
        assert p.fabric.writes == 3
        await poll(lambda: _pools_idle(p.st, p.ct), what="staging buffers back")
        assert cconn.stats()["reply_buffers"] == 0 and cconn.stats()["exposed"] == 0

        # inline (small), failed, and too large for the buffer: nothing written, buffers back
        dest = bytearray(1 << 20)
        _, payload = await client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=100), into=dest)
        assert bytes(payload) == source_pattern(100)
        with pytest.raises(FS3Error) as err:
            await client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=1 << 40), into=dest)
        assert err.value.code == StatusCode.INVALID_ARGUMENT
        with pytest.raises(FS3Error) as err:
            await client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=2 << 20), into=dest)
        assert err.value.code == StatusCode.RPC_FRAME_TOO_LARGE
        assert p.fabric.writes == 3 and sconn.stats()["pushed"] == 3
        await poll(lambda: _pools_idle(p.st, p.ct), what="staging buffers back")
        assert cconn.stats()["reply_buffers"] == 0 and cconn.stats()["exposed"] == 0
        # the connection is still good
        _, payload = await client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=5000), into=dest)
        assert bytes(payload) == source_pattern(5000) and p.fabric.writes == 4
    finally:
        await client.close()
        await p.client.close()
        await p.server.stop()


async def test_reply_buffers_are_a_share_of_the_pool_and_the_rest_are_pulled() -> None:
    """Concurrent calls name reply buffers only up to a quarter of the staging pool; the others'
    replies are pulled as before. Every reply is right and every buffer comes back."""
    cfg = RdmaConfig(pool_bytes=4 << 20, inline_payload_bytes=1024)
    limits = dataclasses.replace(LIMITS, max_payload_bytes=1 << 20)  # (the pool holds one at least)
    st, ct, server, client, fabric = await _one_nic(cfg, limits)
    try:
        await client.call(server.address, PING, rpc_pb2.PingRequest())
        (sconn,) = _conns(st)
        (cconn,) = _conns(ct)
        sconn.pause_receiving(True)  # all 16 requests are out before any reply comes back
        n = 256 << 10
        dests = [bytearray(n) for _ in range(16)]
        calls = asyncio.gather(
            *(client.call(server.address, SOURCE, rpc_pb2.SourceRequest(length=n), into=d) for d in dests)
        )
        await poll(lambda: cconn.stats()["sends"] >= 2, what="requests sent")
        await asyncio.sleep(0.05)
        assert cconn.stats()["reply_buffers"] == 4  # 1 MiB of the 4 MiB pool
        sconn.pause_receiving(False)
        results = await calls
        assert all(bytes(payload) == source_pattern(n) for _, payload in results)
        assert (fabric.writes, fabric.reads) == (4, 12)
        await poll(lambda: _pools_idle(st, ct), what="staging buffers back")
        assert cconn.stats()["reply_buffers"] == 0
    finally:
        await client.close()
        await server.stop()
        st.close()
        ct.close()


async def test_a_reply_buffer_outlives_a_caller_that_gave_up() -> None:
    """The server may write into the buffer until the reply arrives, whatever the caller does: a
    call that timed out keeps it until then, and the late reply frees it."""
    p = await _pair(RdmaConfig(inline_payload_bytes=1024))
    try:
        await p.client.call(p.address, PING, rpc_pb2.PingRequest())
        (sconn,) = _conns(p.st)
        sconn.pause_receiving(True)  # the server takes nothing for a while
        dest = bytearray(100_000)
        with pytest.raises(FS3Error) as err:
            await p.client.call(
                p.address, SOURCE, rpc_pb2.SourceRequest(length=90_000), into=dest, timeout=0.2
            )
        assert err.value.code == StatusCode.DEADLINE_EXCEEDED
        (cconn,) = _conns(p.ct)
        assert cconn.stats()["reply_buffers"] == 1
        sconn.pause_receiving(False)
        await poll(lambda: cconn.stats()["reply_buffers"] == 0, what="the late reply frees the buffer")
        assert sconn.stats()["pushed"] == 1 and not any(dest)  # written into our buffer, not the caller's
        await poll(lambda: _pools_idle(p.st, p.ct), what="staging buffers back")
    finally:
        await p.client.close()
        await p.server.stop()


async def test_a_reply_written_where_no_request_named_a_buffer_closes_the_connection() -> None:
    fabric, st, ct, accepted, client_rx = await _raw()
    server: RdmaConnection = accepted[0].conn  # type: ignore[assignment]
    head = encode_header(0x02, 7, 1, 1, 0, 1 << 20)  # a RESPONSE with a 1 MiB payload ...
    _post_raw_chunk(server, head + WRITTEN)  # ... "already written" into a buffer never named
    await asyncio.wait_for(client_rx.lost.wait(), 5)
    assert client_rx.errors and client_rx.errors[0].code == StatusCode.RPC_MALFORMED_FRAME
    assert "named no buffer" in client_rx.errors[0].message


async def test_a_peer_that_does_not_announce_reply_buffers_is_named_none(pair: Pair) -> None:
    """A server whose handshake lacks FEATURE_REPLY_BUFFERS (an older build) would refuse Flag.SINK:
    the client names no reply buffer to it, and its replies are pulled as before."""
    await pair.client.call(pair.address, PING, rpc_pb2.PingRequest())
    (cconn,) = _conns(pair.ct)
    assert cconn.remote.features & FEATURE_REPLY_BUFFERS
    cconn.remote = dataclasses.replace(cconn.remote, features=0)
    reads, writes = pair.fabric.reads, pair.fabric.writes
    dest = bytearray(1 << 20)
    _, payload = await pair.client.call(
        pair.address, SOURCE, rpc_pb2.SourceRequest(length=500_000), into=dest
    )
    assert bytes(payload) == source_pattern(500_000)
    assert (pair.fabric.reads - reads, pair.fabric.writes - writes) == (1, 0)


@settings(max_examples=12, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["source", "echo", "fail", "late"]),
            st.integers(0, 600_000),
            st.integers(-100_000, 300_000),
        ),
        min_size=1,
        max_size=24,
    )
)
def test_random_calls_with_and_without_reply_buffers(calls: list[tuple[str, int, int]]) -> None:
    """Calls at once, each with or without a buffer for its reply (of any size, some too small),
    some failing and some given up on: every answer is right or the error it should be, and once
    the late replies are in, no reply buffer, staging buffer or registration is left anywhere."""

    async def run() -> None:
        p = await _pair(RdmaConfig(inline_payload_bytes=2048, pool_bytes=8 << 20))
        limits = dataclasses.replace(LIMITS, max_payload_bytes=1 << 20)
        client = RpcClient(SECRET, transport=p.ct, limits=limits, payload_crc=True)
        try:
            await client.call(p.address, PING, rpc_pb2.PingRequest())

            async def one(kind: str, n: int, extra: int) -> None:
                into = bytearray(max(0, n + extra)) if extra != 0 else None
                if kind == "fail":
                    with pytest.raises(FS3Error) as err:
                        await client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=1 << 40), into=into)
                    assert err.value.code == StatusCode.INVALID_ARGUMENT
                    return
                if kind == "late":  # given up on at once; its reply still comes
                    task = asyncio.ensure_future(
                        client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=n), into=into)
                    )
                    await asyncio.sleep(0)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                    return
                data = os.urandom(n) if kind == "echo" else None
                want = data if data is not None else source_pattern(n)
                request = rpc_pb2.EchoRequest() if kind == "echo" else rpc_pb2.SourceRequest(length=n)
                method = ECHO if kind == "echo" else SOURCE
                if into is not None and len(into) < n:
                    with pytest.raises(FS3Error) as err:
                        await client.call(p.address, method, request, payload=data or None, into=into)
                    assert err.value.code == StatusCode.RPC_FRAME_TOO_LARGE
                    return
                _, payload = await client.call(p.address, method, request, payload=data or None, into=into)
                assert bytes(payload or b"") == want
                if into is not None and payload is not None:
                    assert payload.obj is into

            await asyncio.gather(*(one(*c) for c in calls))
            (cconn,) = _conns(p.ct)
            await poll(lambda: cconn.stats()["reply_buffers"] == 0, what="reply buffers back")
            await poll(lambda: _pools_idle(p.st, p.ct), what="staging buffers back")
            assert cconn.stats()["exposed"] == 0 and cconn.stats()["lent_payloads"] == 0
            _, payload = await client.call(
                p.address, SOURCE, rpc_pb2.SourceRequest(length=70_000), into=bytearray(70_000)
            )
            assert bytes(payload) == source_pattern(70_000)
        finally:
            await client.close()
            await p.client.close()
            await p.server.stop()
            p.st.close()
            p.ct.close()

    asyncio.run(run())


async def test_rdma_metrics_count_sends_and_one_sided_operations_per_nic() -> None:
    """``fs3_net_rdma_*``: payloads pulled count as READs of the side that pulls, replies written
    into the caller's buffer as WRITEs of the server, with their bytes; connections and the staging
    pool are gauges; what ended connections did stays counted."""
    p = await _pair(RdmaConfig(inline_payload_bytes=4096))
    regs = {id(t): CollectorRegistry() for t in (p.st, p.ct)}  # a server and a client process
    for t in (p.st, p.ct):
        RdmaMetrics(lambda t=t: [t], regs[id(t)])  # type: ignore[misc]
    try:
        await p.client.call(p.address, ECHO, rpc_pb2.EchoRequest(), payload=os.urandom(100_000))  # both pull
        await p.client.call(p.address, SOURCE, rpc_pb2.SourceRequest(length=70_000), into=bytearray(70_000))

        def value(name: str, side: RdmaTransport, **labels: str) -> float:
            reg = regs[id(side)]
            return sum(reg.get_sample_value(name, {"nic": nic.name, **labels}) or 0.0 for nic in side.nics)

        assert value("fs3_net_rdma_one_sided_total", p.st, op="read") == 1  # the request's payload
        assert value("fs3_net_rdma_one_sided_bytes_total", p.st, op="read") == 100_000
        assert value("fs3_net_rdma_one_sided_total", p.ct, op="read") == 1  # the echoed reply
        assert value("fs3_net_rdma_one_sided_total", p.st, op="write") == 1  # written into the caller's
        assert value("fs3_net_rdma_one_sided_bytes_total", p.st, op="write") == 70_000
        assert value("fs3_net_rdma_one_sided_total", p.ct, op="write") == 0
        assert value("fs3_net_rdma_sends_total", p.ct) >= 3 and value("fs3_net_rdma_sends_total", p.st) >= 3
        assert value("fs3_net_rdma_connections", p.ct) == 1 == value("fs3_net_rdma_connections", p.st)
        await poll(lambda: value("fs3_net_rdma_pool_in_use_bytes", p.ct) == 0, what="staging back")
        assert value("fs3_net_rdma_pool_registered_bytes", p.ct) > 0
        await p.client.close()
        await poll(lambda: not p.ct.connections and not p.st.connections, what="connections closed")
        assert value("fs3_net_rdma_connections", p.ct) == 0
        assert value("fs3_net_rdma_one_sided_total", p.st, op="write") == 1  # still counted
        assert value("fs3_net_rdma_one_sided_bytes_total", p.ct, op="read") == 100_000
    finally:
        await p.client.close()
        await p.server.stop()
