"""The RDMA transport: RC queue pairs set up over the service's TCP port.

Connection setup (:mod:`fs3.net.rdma.wire` has the bytes)::

    client                                   server (listening on the service's TCP port)
    create QP (INIT) on a NIC picked round-robin for this peer
    TCP connect, CONNECT{qpn, psn, lid, gid, mtu, buffers}  ->
                                             first 4 bytes "FS3V": an RDMA handshake ("FS3R": a TCP
                                             client, served by the TCP transport on the same socket)
                                             create QP, move it to RTS, post receive buffers
                                         <-  ACCEPT{its parameters}     (or FALLBACK{reason}: no usable
                                                                         device; the socket goes on as TCP)
    QP to RTS, post receive buffers, READY (1 byte) ->
                                             start taking completions
    ... fs3 RPC frames over SEND/RECV: the fs3 authentication handshake first; only once it has
        succeeded does either side accept RDMA READ/WRITE from the other (see
        :mod:`fs3.net.rdma.connection`) ...

The TCP connection stays open for the connection's life: its end (close, or the peer process dying)
ends the RDMA connection, and closing the RDMA connection closes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fs3 import metrics
from fs3.config import RdmaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.net.frame import DEFAULT_LIMITS, RpcLimits
from fs3.net.rdma.connection import QueuePairOps, RdmaConnection
from fs3.net.rdma.discovery import Inventory, Nic, discover
from fs3.net.rdma.memory import Exposure, PoolBuffer, Region, RegisteredPool, SlotArena
from fs3.net.rdma.nics import NicSelector, OneSidedLimiter
from fs3.net.rdma.wire import (
    FEATURE_REPLY_BUFFERS,
    MAGIC,
    PREFIX_SIZE,
    ConnectParams,
    HandshakeError,
    Kind,
    pack_fallback,
    parse_message,
    parse_prefix,
)
from fs3.net.tcp import TcpConnection, TcpTransport, tune_socket
from fs3.net.transport import Address, Connection, Listener, ReceiverFactory, Transport

log = logging.getLogger(__name__)

TCP_MAGIC = b"FS3R"
_READY = b"\x01"
# Bytes a listener holds while it tells an RDMA handshake from a TCP client (normally a few hundred).
_SNIFF_MAX = 1 << 20


class PendingQueuePair(QueuePairOps, Protocol):
    """A queue pair before it is connected (INIT)."""

    def local_params(self, recv_buffers: int, buffer_size: int, inline_max: int) -> ConnectParams: ...

    def connect(self, remote: ConnectParams, *, timeout: int, retry_cnt: int, rnr_retry: int) -> None: ...


class DeviceOps(Protocol):
    """An opened NIC: registers memory and makes queue pairs (:class:`fs3.net.rdma.verbs.Device`)."""

    name: str

    def register(self, nbytes: int) -> Region: ...

    def deregister(self, region: Region) -> None: ...

    def expose(self, region: Region, offset: int, length: int, *, write: bool = False) -> Exposure: ...

    def withdraw(self, exposure: Exposure) -> None: ...

    def queue_pair(self, max_send_wr: int, max_recv_wr: int) -> PendingQueuePair: ...

    def close(self) -> None: ...


DeviceOpener = Callable[[Nic, RdmaConfig], DeviceOps]


def _open_verbs(nic: Nic, cfg: RdmaConfig) -> DeviceOps:
    from fs3.net.rdma.verbs import Device

    return Device(nic, traffic_class=cfg.traffic_class, service_level=cfg.service_level)  # type: ignore[return-value]


#: what :meth:`RdmaTransport.counts` adds up per NIC (keys of :meth:`RdmaConnection.stats`)
_COUNTS = ("sends", "reads", "read_bytes", "writes", "write_bytes")


def _counts(conn: RdmaConnection) -> dict[str, int]:
    stats = conn.stats()
    return {key: stats[key] for key in _COUNTS}


class RdmaMetrics:
    """``fs3_net_rdma_*``, per NIC, read from the transports when scraped: SENDs posted, one-sided
    operations completed and their bytes (``op``: ``read``, payloads pulled from the peer;
    ``write``, reply payloads written into the peer's buffers), open connections, and the
    registered staging pool (registered and lent bytes). ``transports`` gives those to report."""

    def __init__(
        self, transports: Callable[[], Iterable[RdmaTransport]], reg: CollectorRegistry | None = None
    ):
        self._transports = transports
        (reg or metrics.registry()).register(self)

    def collect(self) -> Iterator[Metric]:
        sends = CounterMetricFamily("fs3_net_rdma_sends", "SENDs posted", labels=["nic"])
        ops = CounterMetricFamily(
            "fs3_net_rdma_one_sided", "one-sided operations completed", labels=["nic", "op"]
        )
        moved = CounterMetricFamily(
            "fs3_net_rdma_one_sided_bytes", "bytes moved by one-sided operations", labels=["nic", "op"]
        )
        conns = GaugeMetricFamily("fs3_net_rdma_connections", "open RDMA connections", labels=["nic"])
        registered = GaugeMetricFamily(
            "fs3_net_rdma_pool_registered_bytes", "registered staging memory", labels=["nic"]
        )
        lent = GaugeMetricFamily("fs3_net_rdma_pool_in_use_bytes", "staging memory in use", labels=["nic"])
        # summed per NIC over the transports (a process normally has one; tests have several)
        per_nic: dict[str, dict[str, int]] = {}
        for t in self._transports():
            for name, counts in t.counts().items():
                agg = per_nic.setdefault(
                    name, dict.fromkeys((*_COUNTS, "connections", "registered", "lent"), 0)
                )
                for key, value in counts.items():
                    agg[key] += value
            for conn in list(t.connections):
                per_nic[conn.nic]["connections"] += 1  # type: ignore[attr-defined]
            for nic in t.nics:
                per_nic[nic.name]["registered"] += nic.pool.registered_bytes
                per_nic[nic.name]["lent"] += nic.pool.in_use_bytes
        for name, c in per_nic.items():
            sends.add_metric([name], c["sends"])
            ops.add_metric([name, "read"], c["reads"])
            ops.add_metric([name, "write"], c["writes"])
            moved.add_metric([name, "read"], c["read_bytes"])
            moved.add_metric([name, "write"], c["write_bytes"])
            conns.add_metric([name], c["connections"])
            registered.add_metric([name], c["registered"])
            lent.add_metric([name], c["lent"])
        yield from (sends, ops, moved, conns, registered, lent)


_TRACKED: weakref.WeakSet[RdmaTransport] = weakref.WeakSet()
_TRACKED_LOCK = threading.Lock()  # transports are made, and /metrics scraped, on several threads


def _tracked() -> list[RdmaTransport]:
    with _TRACKED_LOCK:
        return list(_TRACKED)


def track(transport: RdmaTransport) -> None:
    """Report ``transport`` in the process registry's ``fs3_net_rdma_*`` (what a daemon's /metrics
    serves); the collector is registered once, with the first transport."""
    with _TRACKED_LOCK:
        _TRACKED.add(transport)
    metrics.process_wide("fs3_net_rdma", lambda: RdmaMetrics(_tracked))


class NicRuntime:
    """One NIC in use: the opened device, its registered staging pool and its one-sided cap."""

    def __init__(self, device: DeviceOps, cfg: RdmaConfig, max_payload: int) -> None:
        self.device = device
        self.name = device.name
        self.pool = RegisteredPool(
            device, max_bytes=max(cfg.pool_bytes, max_payload), max_buffer_bytes=max(max_payload, 4096)
        )
        self.limiter = OneSidedLimiter(cfg.max_onesided_per_nic)

    def close(self) -> None:
        self.pool.close()
        self.device.close()


class _Side(asyncio.BufferedProtocol):
    """The TCP socket of one connection: handshake bytes first, then only its end matters."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_open: Callable[[_Side], None] | None = None
    ) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray(4096)
        self.n = 0
        self.want = 0
        self.waiter: asyncio.Future[None] | None = None
        self.lost = False
        self.conn: RdmaConnection | None = None
        self._on_open = on_open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # this socket's end is the RDMA connection's end: its keepalive notices a vanished host
        tune_socket(transport.get_extra_info("socket"))
        if self._on_open is not None:
            self._on_open(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.n >= len(self.buf):
            if self.conn is None and len(self.buf) < _SNIFF_MAX:
                # still deciding what this socket is: keep everything for the TCP transport
                self.buf.extend(bytes(len(self.buf)))
            else:
                self.n = 0  # an RDMA connection's socket: nothing more is expected, discard
        return memoryview(self.buf)[self.n :]

    def buffer_updated(self, nbytes: int) -> None:
        self.n += nbytes
        self._check()

    def _check(self) -> None:
        w = self.waiter
        if w is not None and not w.done() and (self.n >= self.want or self.lost):
            w.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        self._check()
        if self.conn is not None:
            self.conn.peer_gone()

    async def wait_for(self, n: int) -> None:
        """Until ``n`` bytes are buffered or the socket has ended."""
        while self.n < n and not self.lost:
            self.want = n
            self.waiter = self.loop.create_future()
            await self.waiter

    async def read(self, n: int) -> bytes:
        """Exactly ``n`` more bytes (raises HandshakeError if the socket ends first)."""
        while self.n < n:
            if self.lost:
                raise HandshakeError("peer closed the connection during the handshake")
            self.want = n
            self.waiter = self.loop.create_future()
            await self.waiter
        data = bytes(self.buf[:n])
        del self.buf[:n]
        self.buf.extend(bytes(n))
        self.n -= n
        return data

    def leftover(self) -> bytes:
        return bytes(self.buf[: self.n])

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _hand_to_tcp(
    side: _Side, limits: RpcLimits, receiver_factory: ReceiverFactory, server_side: bool
) -> TcpConnection:
    """Go on with plain TCP framing on this socket (a TCP client, or an RDMA offer refused)."""
    assert side.transport is not None
    loop = side.loop
    conn = TcpConnection(loop, limits, receiver_factory, server_side=server_side)
    rest = side.leftover()
    side.transport.set_protocol(conn)
    conn.connection_made(side.transport)
    view_of_rest = memoryview(rest)
    while view_of_rest and not conn.is_closing:
        view = conn.get_buffer(len(view_of_rest))
        k = min(len(view), len(view_of_rest))
        view[:k] = view_of_rest[:k]
        conn.buffer_updated(k)
        view_of_rest = view_of_rest[k:]
    return conn


class RdmaListener(Listener):
    """The service's TCP port, taking RDMA handshakes and plain TCP clients alike."""

    def __init__(
        self, server: asyncio.AbstractServer, address: Address, handshakes: set[asyncio.Task[None]]
    ) -> None:
        self._server = server
        self.address = address
        self._handshakes = handshakes

    def close(self) -> None:
        self._server.close()
        for task in list(self._handshakes):
            task.cancel()

    async def wait_closed(self) -> None:
        # like the TCP listener: accepted connections belong to the RPC layer
        self.close()
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)


class RdmaTransport(Transport):
    """fs3 RPC over RDMA verbs (RC queue pairs, pyverbs).

    ``config`` holds the device filter, GID index, traffic class, service level, MTU and buffer
    sizes. ``inventory`` (default: probe the devices) and ``opener`` (default: pyverbs) exist for
    tests. With ``tcp_fallback`` (the ``auto`` mode) a peer that has no RDMA gets TCP on the same
    socket instead of an error. Raises FS3Error(UNAVAILABLE) when no NIC is usable.
    """

    name = "rdma"

    def __init__(
        self,
        config: RdmaConfig | None = None,
        *,
        inventory: Inventory | None = None,
        opener: DeviceOpener | None = None,
        limits: RpcLimits = DEFAULT_LIMITS,
        tcp_fallback: bool = False,
        on_choice: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.config = cfg = config or RdmaConfig()
        inv = inventory if inventory is not None else discover(cfg.device_filter, cfg.gid_index, cfg.mtu)
        if not inv.usable:
            raise FS3Error(StatusCode.UNAVAILABLE, f"no usable RDMA device: {inv.reason()}")
        self.inventory = inv
        self.tcp_fallback = tcp_fallback
        self._on_choice = on_choice
        open_device = opener or _open_verbs
        self.nics: list[NicRuntime] = []
        failed: list[str] = []
        for nic in inv.nics:
            try:
                self.nics.append(NicRuntime(open_device(nic, cfg), cfg, limits.max_payload_bytes))
            except Exception as e:  # one bad NIC must not take the others down
                log.warning("rdma nic unusable nic=%s error=%s", nic.name, e)
                failed.append(f"{nic.name}: {e}")
        if not self.nics:
            raise FS3Error(StatusCode.UNAVAILABLE, f"no RDMA device could be opened: {'; '.join(failed)}")
        self.selector: NicSelector[NicRuntime] = NicSelector(self.nics)
        self.connections: set[RdmaConnection] = set()
        self._closed_counts: dict[str, dict[str, int]] = {}  # per NIC: counters of ended connections
        self._tcp = TcpTransport()
        log.info("rdma transport ready nics=%s", ",".join(n.name for n in self.nics))

    # ---- shared set-up --------------------------------------------------------------------------

    def _new_qp(self, nic: NicRuntime) -> tuple[PendingQueuePair, ConnectParams]:
        cfg = self.config
        qp = nic.device.queue_pair(cfg.send_buffers + cfg.max_onesided_per_nic + 1, cfg.recv_buffers)
        local = qp.local_params(cfg.recv_buffers, cfg.buffer_size, min(cfg.inline_payload_bytes, 1 << 30))
        return qp, dataclasses.replace(local, features=FEATURE_REPLY_BUFFERS)

    def _build(
        self,
        nic: NicRuntime,
        qp: PendingQueuePair,
        local: ConnectParams,
        remote: ConnectParams,
        limits: RpcLimits,
        peer: str,
        side: _Side,
        server_side: bool = False,
    ) -> RdmaConnection:
        cfg = self.config
        qp.connect(remote, timeout=cfg.timeout, retry_cnt=cfg.retry_cnt, rnr_retry=cfg.rnr_retry)
        # Our SENDs fill the peer's receive buffers, so they are cut to the peer's buffer size.
        send_size = remote.buffer_size
        # SEND/RECV buffers are only ever touched by our own NIC (never exposed to the peer).
        region = nic.device.register(send_size * cfg.send_buffers + cfg.buffer_size * cfg.recv_buffers)
        send_region = dataclasses.replace(region, view=region.view[: send_size * cfg.send_buffers])
        recv_off = send_size * cfg.send_buffers
        recv_region = dataclasses.replace(
            region, view=region.view[recv_off:], addr=region.addr + recv_off, length=region.length - recv_off
        )

        def closed(conn: RdmaConnection) -> None:
            self.connections.discard(conn)
            totals = self._closed_counts.setdefault(nic.name, dict.fromkeys(_COUNTS, 0))
            for key, value in _counts(conn).items():
                totals[key] += value
            side.close()
            nic.device.deregister(region)

        conn = RdmaConnection(
            side.loop,
            qp,
            local,
            remote,
            SlotArena(send_region, send_size, cfg.send_buffers),
            SlotArena(recv_region, cfg.buffer_size, cfg.recv_buffers),
            nic.pool,
            nic.limiter,
            limits,
            peer,
            on_closed=closed,
            server_side=server_side,
        )
        conn.nic = nic.name  # type: ignore[attr-defined]
        conn.post_receives()
        side.conn = conn
        self.connections.add(conn)
        return conn

    def counts(self) -> dict[str, dict[str, int]]:
        """Per NIC: SENDs posted and one-sided operations completed (with their bytes), over every
        connection this transport has had (``_COUNTS``)."""
        out = {nic.name: dict.fromkeys(_COUNTS, 0) for nic in self.nics}
        for name, totals in self._closed_counts.items():
            for key, value in totals.items():
                out[name][key] += value
        for conn in list(self.connections):
            for key, value in _counts(conn).items():
                out[conn.nic][key] += value  # type: ignore[attr-defined]
        return out

    def _chose(self, peer: str, transport: str, reason: str) -> None:
        log.info("transport chosen peer=%s transport=%s reason=%r", peer, transport, reason)
        if self._on_choice is not None:
            self._on_choice(peer, transport, reason)

    # ---- client side ----------------------------------------------------------------------------

    async def connect(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
        connect_timeout: float = 10.0,
    ) -> Connection:
        loop = asyncio.get_running_loop()
        host, port = address
        peer = f"{host}:{port}"
        nic = self.selector.pick(address)
        try:
            qp, local = self._new_qp(nic)
        except Exception as e:
            raise FS3Error(StatusCode.RPC_CONNECT_FAILED, f"rdma connect to {peer}: {nic.name}: {e}") from e
        side: _Side | None = None
        try:
            async with asyncio.timeout(connect_timeout):
                _, side = await loop.create_connection(lambda: _Side(loop), host, port)
                side.write(local.pack(Kind.CONNECT))
                head = await side.read(4)
                if head == TCP_MAGIC:
                    raise _SpeaksTcp()
                prefix = head + await side.read(PREFIX_SIZE - 4)
                kind, length = parse_prefix(prefix)
                kind, body = parse_message(prefix + await side.read(length))
                if kind == Kind.FALLBACK:
                    raise _Fallback(str(body))
                if kind != Kind.ACCEPT:
                    raise HandshakeError(f"expected ACCEPT, got {kind.name}")
                assert isinstance(body, ConnectParams)
                conn = self._build(nic, qp, local, body, limits, peer, side)
                conn.start(receiver_factory)
                side.write(_READY)
        except _Fallback as fb:
            qp.close()
            assert side is not None
            if not self.tcp_fallback:
                side.close()
                raise FS3Error(StatusCode.RPC_CONNECT_FAILED, f"{peer} does not offer RDMA: {fb}") from None
            self._chose(peer, "tcp", f"peer has no usable RDMA device: {fb}")
            return _hand_to_tcp(side, limits, receiver_factory, server_side=False)
        except _SpeaksTcp:
            qp.close()
            assert side is not None
            side.close()
            if not self.tcp_fallback:
                raise FS3Error(StatusCode.RPC_CONNECT_FAILED, f"{peer} speaks TCP only") from None
            conn = await self._tcp.connect(
                address, receiver_factory, limits=limits, connect_timeout=connect_timeout
            )
            self._chose(peer, "tcp", "peer listens for TCP only")  # once connected (see transport_select)
            return conn
        except BaseException as e:
            if side is not None and side.conn is not None:
                side.conn.abort()  # destroys the queue pair too
            else:
                qp.close()
            if side is not None:
                side.close()
            if not isinstance(e, Exception) or (
                isinstance(e, FS3Error) and e.code == StatusCode.RPC_CONNECT_FAILED
            ):
                raise
            raise FS3Error(
                StatusCode.RPC_CONNECT_FAILED, f"rdma connect to {peer}: {e or 'timed out'}"
            ) from e
        self._chose(peer, "rdma", f"nic {nic.name}")
        return conn

    # ---- server side ----------------------------------------------------------------------------

    async def listen(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
    ) -> RdmaListener:
        return await listen_sniffing(address, receiver_factory, limits, self._accept_rdma)

    async def _accept_rdma(
        self,
        side: _Side,
        remote: ConnectParams,
        peer: str,
        receiver_factory: ReceiverFactory,
        limits: RpcLimits,
    ) -> None:
        host = peer.rpartition(":")[0]
        nic = self.selector.pick(host)
        qp, local = self._new_qp(nic)
        try:
            conn = self._build(nic, qp, local, remote, limits, peer, side, server_side=True)
        except BaseException:
            qp.close()
            raise
        try:
            side.write(local.pack(Kind.ACCEPT))
            await side.read(1)  # READY: the client's queue pair is in RTS
        except BaseException:
            conn.abort()
            raise
        conn.start(receiver_factory)
        self._chose(peer, "rdma", f"nic {nic.name}")

    # ---- registered memory for callers of the one-sided API -------------------------------------

    async def alloc_buffer(self, conn: RdmaConnection, nbytes: int) -> PoolBuffer:
        """Registered memory usable with ``conn`` (lend it to the peer for one operation with
        ``conn.expose`` and ``conn.withdraw``); give it back with :meth:`free_buffer`."""
        return await conn.pool.acquire(nbytes)

    def free_buffer(self, conn: RdmaConnection, buf: PoolBuffer) -> None:
        """Return a buffer from :meth:`alloc_buffer`."""
        conn.pool.release(buf)

    def close(self) -> None:
        """Abort every connection and release the devices."""
        for conn in list(self.connections):
            conn.abort()
        for nic in self.nics:
            nic.close()


AcceptRdma = Callable[[_Side, ConnectParams, str, ReceiverFactory, RpcLimits], Any]


async def listen_sniffing(
    address: Address,
    receiver_factory: ReceiverFactory,
    limits: RpcLimits,
    accept_rdma: AcceptRdma | None,
    no_rdma_reason: str = "no usable RDMA device",
) -> RdmaListener:
    """Listen on ``address`` for both kinds of client: a connection whose first bytes are an RDMA
    handshake goes to ``accept_rdma`` (or, when that is None, is answered FALLBACK with
    ``no_rdma_reason`` and goes on as TCP); anything else is served by the TCP transport."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    def opened(side: _Side) -> None:
        task = loop.create_task(_sniff(side, receiver_factory, limits, accept_rdma, no_rdma_reason))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    host, port = address
    server = await loop.create_server(
        lambda: _Side(loop, opened), host, port, reuse_address=True, backlog=1024
    )
    bound = server.sockets[0].getsockname()
    return RdmaListener(server, (bound[0], bound[1]), tasks)


async def _sniff(
    side: _Side,
    receiver_factory: ReceiverFactory,
    limits: RpcLimits,
    accept_rdma: AcceptRdma | None,
    no_rdma_reason: str,
) -> None:
    assert side.transport is not None
    peername = side.transport.get_extra_info("peername")
    peer = f"{peername[0]}:{peername[1]}" if peername else "?"
    try:
        async with asyncio.timeout(limits.handshake_timeout_s):
            # A TCP client may send fewer than 4 bytes first; whatever it is, TCP framing judges it.
            await side.wait_for(4)
            if side.lost:
                return
            if bytes(side.buf[:4]) != MAGIC:
                _hand_to_tcp(side, limits, receiver_factory, server_side=True)
                return
            prefix = await side.read(PREFIX_SIZE)
            _, length = parse_prefix(prefix)
            kind, remote = parse_message(prefix + await side.read(length))
            if kind != Kind.CONNECT:
                raise HandshakeError(f"expected CONNECT, got {kind.name}")
            assert isinstance(remote, ConnectParams)
            if accept_rdma is None:
                side.write(pack_fallback(no_rdma_reason))
                log.info("transport chosen peer=%s transport=tcp reason=%r", peer, no_rdma_reason)
                _hand_to_tcp(side, limits, receiver_factory, server_side=True)
                return
            await accept_rdma(side, remote, peer, receiver_factory, limits)
    except (HandshakeError, TimeoutError) as e:
        log.warning("rdma handshake refused peer=%s reason=%s", peer, e or "timed out")
        side.close()
    except asyncio.CancelledError:
        side.close()
        raise
    except Exception:
        log.exception("rdma accept failed peer=%s", peer)
        side.close()


class _Fallback(Exception):
    pass


class _SpeaksTcp(Exception):
    pass
