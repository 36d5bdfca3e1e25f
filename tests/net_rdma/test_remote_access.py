"""What a peer can reach with RDMA READ and WRITE: nothing before it has authenticated, and afterwards
exactly the bytes it was lent for one operation, for as long as that operation lasts.

The fake fabric checks what an HCA checks (the responder queue pair's access flags, then the rkey's
memory region: its protection domain, bounds and permissions), so each attempt below is one a peer
holding those keys could make on a real network.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from fakeverbs import Fabric
from test_transport_fake import LIMITS, Recorder, _pair, poll

from fs3.config import RdmaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.net.rdma.connection import RdmaConnection
from fs3.net.rdma.transport import RdmaListener, RdmaTransport
from fs3.net.rdma.wire import RemoteBuffer
from fs3.net.system import ECHO
from fs3.net.transport import Connection
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)


@dataclass
class Peers:
    """One server transport and one client transport on a fake fabric, connected twice: (c1, s1)
    and (c2, s2) are the two ends of each connection. Nothing is authenticated yet."""

    fabric: Fabric
    st: RdmaTransport
    ct: RdmaTransport
    listener: RdmaListener
    c1: RdmaConnection
    s1: RdmaConnection
    c2: RdmaConnection
    s2: RdmaConnection
    accepted: list[Recorder]
    extra: list[RdmaConnection]

    async def connect(self, side: str, authenticated: bool) -> tuple[RdmaConnection, RdmaConnection]:
        """One more connection between the two transports: (its ``side`` end, the other end)."""
        n = len(self.accepted)
        c = await self.ct.connect(self.listener.address, Recorder, limits=LIMITS)
        await poll(lambda: len(self.accepted) == n + 1, what="accept")
        s = self.accepted[-1].conn
        assert isinstance(c, RdmaConnection) and isinstance(s, RdmaConnection)
        self.extra.append(c)
        if authenticated:
            c.peer_authenticated()
            s.peer_authenticated()
        return (c, s) if side == "client" else (s, c)


@pytest.fixture
async def peers() -> AsyncIterator[Peers]:
    fabric = Fabric()
    cfg = RdmaConfig(inline_payload_bytes=1000)
    st = RdmaTransport(cfg, inventory=fabric.inventory(1), opener=fabric.opener)
    ct = RdmaTransport(cfg, inventory=fabric.inventory(1), opener=fabric.opener)
    accepted: list[Recorder] = []

    def server_side(conn: Connection) -> Recorder:
        accepted.append(Recorder(conn))
        return accepted[-1]

    listener = await st.listen(("127.0.0.1", 0), server_side, limits=LIMITS)
    c1 = await ct.connect(listener.address, Recorder, limits=LIMITS)
    await poll(lambda: len(accepted) == 1, what="first accept")
    c2 = await ct.connect(listener.address, Recorder, limits=LIMITS)
    await poll(lambda: len(accepted) == 2, what="second accept")
    s1, s2 = (r.conn for r in accepted)
    assert all(isinstance(c, RdmaConnection) for c in (c1, c2, s1, s2))
    p = Peers(fabric, st, ct, listener, c1, s1, c2, s2, accepted, [])  # type: ignore[arg-type]
    try:
        yield p
    finally:
        listener.close()
        for c in (c1, c2, *p.extra):
            c.close()
            await c.wait_closed()
        st.close()
        ct.close()
    # every exposure was withdrawn by the end, whatever the test did
    assert not fabric.exposures


Connect = Callable[[], Awaitable[tuple[RdmaConnection, "RdmaConnection | None"]]]


async def _refused(connect: Connect, remote: RemoteBuffer) -> None:
    """A READ of ``remote``, and a WRITE of it, each from a new connection ``connect`` makes,
    fail at the responder; each failure ends that connection, at both ends (the queue pairs'
    error state, as on a device): a peer's bad key costs it its connection, and nothing else."""
    for op in ("read", "write"):
        conn, other = await connect()
        with pytest.raises(FS3Error, match="remote access error"):
            if op == "read":
                await conn.rdma_read(memoryview(bytearray(remote.length)), remote)
            else:
                await conn.rdma_write(b"\xee" * remote.length, remote)
        for end in (conn, other):
            if end is not None:
                await asyncio.wait_for(end.wait_closed(), 10)


async def _denied(p: Peers, side: str, remote: RemoteBuffer, authenticated: bool = True) -> None:
    """``remote`` is out of reach of the ``side`` end of a new connection between the peers."""
    await _refused(lambda: p.connect(side, authenticated), remote)


async def test_nothing_is_reachable_before_the_peer_authenticates(peers: Peers) -> None:
    p = peers
    buf = await p.st.alloc_buffer(p.s1, 8192)
    secret = os.urandom(8192)
    buf.view[:] = secret
    # before authentication nothing is lent, neither explicitly nor as a pulled payload
    with pytest.raises(FS3Error) as exc:
        p.s1.expose(buf.view)
    assert exc.value.code == StatusCode.PERMISSION_DENIED
    with pytest.raises(FS3Error) as exc:
        p.s1.send_frame(1, 7, 1, 1, b"m", os.urandom(5000))
    assert exc.value.code == StatusCode.PERMISSION_DENIED
    # and the registration's own key opens nothing to a peer that has not authenticated
    region, off = p.st.nics[0].pool.directory.find(buf.view)  # type: ignore[misc]
    await _denied(p, "client", RemoteBuffer(region.addr + off, region.rkey, 64), authenticated=False)

    # the first connection authenticates (both ways); the second does not
    p.c1.peer_authenticated()
    p.s1.peer_authenticated()
    lent = p.s1.expose(buf.view, write=True)
    got = memoryview(bytearray(8192))
    await p.c1.rdma_read(got, lent)
    assert bytes(got) == secret  # the peer it was lent to reaches it
    # a peer that only completed the RDMA handshake gets nothing with the same keys: its queue pair
    # has no remote access, although the memory is exposed in the same protection domain
    await _denied(p, "client", lent, authenticated=False)
    await _denied(p, "client", RemoteBuffer(region.addr + off, region.rkey, 64), authenticated=False)
    assert bytes(buf.view) == secret
    # the registration itself stays closed to an authenticated peer too
    await _denied(p, "client", RemoteBuffer(region.addr + off, region.rkey, 64))
    p.s1.withdraw(lent)
    p.st.free_buffer(p.s1, buf)
    # the lending connection still works after the others' failed attempts
    p.c1.send_frame(1, 9, 1, 1, b"still fine")
    rx: Recorder = p.s1._receiver  # type: ignore[assignment]
    await poll(lambda: bool(rx.frames), what="frame after the refused attempts")


async def test_a_peer_reaches_exactly_the_bytes_it_was_lent_while_lent(peers: Peers) -> None:
    p = peers
    for c, s in ((p.c1, p.s1), (p.c2, p.s2)):
        c.peer_authenticated()
        s.peer_authenticated()
    buf = await p.ct.alloc_buffer(p.c1, 5000)  # a 8 KiB registration behind a 5000-byte buffer
    before = os.urandom(5000)
    buf.view[:] = before
    window = buf.view[1000:3000]
    lent = p.c1.expose(window, write=True)
    assert lent.length == 2000
    data = os.urandom(2000)
    await p.s1.rdma_write(data, lent)
    # one byte either side of the window, and the rest of the registration, are out of reach
    await _denied(p, "server", RemoteBuffer(lent.addr, lent.rkey, 2001))
    await _denied(p, "server", RemoteBuffer(lent.addr - 1, lent.rkey, 1))
    await _denied(p, "server", RemoteBuffer(lent.addr + 2000, lent.rkey, 1))
    await _denied(p, "server", RemoteBuffer(lent.addr + 3000, lent.rkey, 4096))
    assert bytes(buf.view) == before[:1000] + data + before[3000:]
    # read-only lending refuses writes
    ro = p.c1.expose(window)
    writer, _ = await p.connect("server", True)
    with pytest.raises(FS3Error, match="remote access error"):
        await writer.rdma_write(b"x" * 2000, ro)
    got = memoryview(bytearray(2000))
    await p.s1.rdma_read(got, ro)
    assert bytes(got) == data
    p.c1.withdraw(ro)
    # once withdrawn, the keys reach nothing
    p.c1.withdraw(lent)
    await _denied(p, "server", lent)
    await _denied(p, "server", ro)
    assert bytes(buf.view) == before[:1000] + data + before[3000:]
    p.ct.free_buffer(p.c1, buf)
    # exposures still lent when a connection ends are withdrawn with it
    buf2 = await p.ct.alloc_buffer(p.c2, 4096)
    left = p.c2.expose(buf2.view, write=True)
    assert left.rkey in p.fabric.exposures
    p.c2.close()
    await p.c2.wait_closed()
    assert left.rkey not in p.fabric.exposures
    p.ct.free_buffer(p.c2, buf2)


async def test_a_pulled_payload_is_exposed_alone_until_its_reader_releases_it(peers: Peers) -> None:
    p = peers
    p.c1.peer_authenticated()
    p.s1.peer_authenticated()
    sent = []
    for i in range(1, 20):
        payload = os.urandom(1001 + i * 613)
        sent.append((i, b"m%d" % i, payload))
        p.c1.send_frame(1, i, 1, 1, b"m%d" % i, payload)
    rx: Recorder = p.s1._receiver  # type: ignore[assignment]
    await poll(lambda: len(rx.frames) == len(sent), what="all frames")
    assert rx.frames == sent
    await poll(lambda: p.c1.stats()["lent_payloads"] == 0, what="payloads released")
    # each payload was lent with exactly its own length, and none of those keys works any more
    assert sorted(e.length for e in p.fabric.exposure_log) == sorted(len(s[2]) for s in sent)
    assert not p.fabric.exposures
    for e in p.fabric.exposure_log:
        await _denied(p, "server", RemoteBuffer(e.addr, e.rkey, e.length))


async def test_an_rpc_peer_that_skips_authentication_reaches_nothing() -> None:
    """Over the real RPC server and client: the fs3 handshake opens remote access on both ends of
    the authenticated connection, and peers that complete only the RDMA handshake (one on each of
    the server's NICs) reach nothing with any key there is, while the server has memory lent out."""
    p = await _pair()
    intruders: list[RdmaConnection] = []
    try:
        data = os.urandom(3 << 20)
        _, payload = await p.client.call(p.address, ECHO, rpc_pb2.EchoRequest(), payload=data)
        assert payload is not None and bytes(payload) == data  # pulled both ways: access was granted
        assert p.fabric.exposure_log  # rkeys went out with the pulled payloads ...
        await poll(lambda: not p.fabric.exposures, what="payloads released")  # ... and died after use
        (legit_server,) = p.st.connections
        (legit_client,) = p.ct.connections

        async def intruder() -> tuple[RdmaConnection, None]:
            conn = await p.ct.connect(p.address, Recorder, limits=LIMITS)
            assert isinstance(conn, RdmaConnection)
            intruders.append(conn)
            return conn, None

        for _ in range(2):  # connections rotate over the server's two NICs
            await intruder()
        assert {c.nic for c in p.st.connections} == {n.name for n in p.st.nics}  # type: ignore[attr-defined]
        # the server lends a buffer to its authenticated client (as a chain predecessor does)
        buf = await p.st.alloc_buffer(legit_server, 4096)
        buf.view[:] = os.urandom(4096)
        lent = legit_server.expose(buf.view)
        keys = [(r.addr, r.rkey) for r in p.fabric.local_only.values()]
        keys += [(e.addr, e.rkey) for e in p.fabric.exposure_log]
        for _ in p.st.nics:  # type: ignore[attr-defined]
            for addr, rkey in keys:  # each attempt on a new connection: a failed one ends its own
                await _refused(intruder, RemoteBuffer(addr, rkey, 256))
        got = memoryview(bytearray(4096))
        await legit_client.rdma_read(got, lent)  # the peer it was lent to still reaches it
        assert bytes(got) == bytes(buf.view)
        legit_server.withdraw(lent)
        p.st.free_buffer(legit_server, buf)
        _, payload = await p.client.call(p.address, ECHO, rpc_pb2.EchoRequest(), payload=data)
        assert payload is not None and bytes(payload) == data
    finally:
        for conn in intruders:
            conn.abort()
        await p.client.close()
        await p.server.stop()
        p.st.close()
        p.ct.close()


async def test_a_peer_that_holds_on_to_pulled_payloads_gets_a_bounded_number(peers: Peers) -> None:
    """Each lent payload is a memory registration until the peer releases it: a peer that stops
    pulling (here: its receiver paused) holds at most 256 at once; the rest wait, in order."""
    p = peers
    p.c1.peer_authenticated()
    p.s1.peer_authenticated()
    p.s1.pause_receiving(True)
    sent = []
    for i in range(1, 601):
        payload = os.urandom(1001 + i)
        sent.append((i, b"m%d" % i, payload))
        p.c1.send_frame(1, i, 1, 1, b"m%d" % i, payload)
    # the sender settles with 256 lent, the other 344 queued, and nothing in flight
    await poll(
        lambda: len(p.c1._frames) == 344 and p.c1._send.available == p.c1._send.count,
        what="the sender to settle at the cap",
    )
    assert p.c1.stats()["lent_payloads"] == 256 and len(p.fabric.exposures) == 256
    assert p.c1.write_paused is False  # 344 frames wait: below the 1024 that asks callers to drain
    p.s1.pause_receiving(False)
    rx: Recorder = p.s1._receiver  # type: ignore[assignment]
    await poll(lambda: len(rx.frames) == len(sent), what="all frames")
    assert rx.frames == sent
    await poll(lambda: not p.fabric.exposures, what="every payload released")
    assert len(p.fabric.exposure_log) == 600
