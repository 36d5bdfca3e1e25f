"""The transport interface under fs3 RPC.

A transport moves frames (header fields, a protobuf message, an optional raw payload) between two
endpoints and nothing else: it parses and validates frames (:mod:`fs3.net.frame`), puts payloads
where the receiver asks, applies flow control, and reports broken input. Everything that gives
frames meaning — the authentication handshake, request ids and the pending-call table, deadlines,
dispatch to services — lives above it in :mod:`fs3.net.client` and :mod:`fs3.net.server`, so the TCP
transport (:mod:`fs3.net.tcp`) and the RDMA transport (later, pyverbs) are interchangeable.

An RDMA transport implements the same three classes: ``connect``/``listen`` set up queue pairs (the
exchange going over the TCP port), ``send_frame`` posts SENDs, ``alloc_payload`` is where a bulk
payload is RDMA-READ into or answered from, and ``FrameReceiver`` is called as completions arrive.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TypeAlias

from fs3.errors import FS3Error, StatusCode
from fs3.net.frame import DEFAULT_LIMITS, FrameError, RpcLimits

log = logging.getLogger(__name__)

Address: TypeAlias = tuple[str, int]
Buffer: TypeAlias = bytes | bytearray | memoryview


def parse_address(address: str | Address) -> Address:
    """``"host:port"`` or ``(host, port)`` -> ``(host, port)``; IPv6 hosts may be ``[::1]:port``."""
    if isinstance(address, tuple):
        host, port = address
        return str(host), int(port)
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def format_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets (``[::1]:8000``): the form gRPC (mgmtd) dials and
    :func:`parse_address` and the config checks take."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def advertised_host(listen_host: str, advertise_host: str = "") -> str:
    """The host others dial to reach a daemon listening on ``listen_host``: ``advertise_host`` if
    set, else the listen address, unless that is a wildcard (no address to dial), then this
    host's name."""
    if advertise_host:
        return advertise_host
    return socket.gethostname() if listen_host in WILDCARDS else listen_host


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` as a listener binds it (SO_REUSEADDR). The IPv6
    wildcard ``::`` takes IPv4 connections too (dual stack), as gRPC's does: a daemon told to
    listen everywhere is reachable at its host name's IPv4 address."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    s = socket.socket(family, kind, proto)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host == "::":
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(address)
    except BaseException:
        s.close()
        raise
    return s


def check_bindable(host: str, port: int) -> None:
    """Fail with one clear message (UNAVAILABLE) when ``port`` cannot be listened on, e.g. taken,
    before a daemon sets anything else up; the real listen can still fail."""
    if port == 0:
        return
    try:
        bind_socket(host, port).close()
    except OSError as e:
        raise FS3Error(
            StatusCode.UNAVAILABLE, f"cannot listen on {format_address(host, port)}: {e.strerror}"
        ) from None


class FrameReceiver(abc.ABC):
    """What a transport calls as frames arrive on one connection (the receive hooks).

    All calls happen on the event loop thread, in stream order. ``message`` views are valid only
    during :meth:`frame_received`; payload buffers come from :meth:`alloc_payload` and belong to
    the receiver.
    """

    @abc.abstractmethod
    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        """Return a writable view of exactly ``length`` bytes for the payload of the frame being
        received (a pooled buffer, or a caller's destination buffer). ``length`` > 0."""

    @abc.abstractmethod
    def frame_received(
        self,
        flags: int,
        request_id: int,
        service_id: int,
        method_id: int,
        timeout_ms: int,
        message: memoryview | bytes,
        payload: memoryview | None,
    ) -> None:
        """A complete, validated frame (payload CRC already checked when flagged)."""

    @abc.abstractmethod
    def frame_error(self, error: FrameError) -> None:
        """Input that is not a valid frame. When ``error.fatal`` the transport closes the
        connection right after this returns (after flushing whatever the receiver sent)."""

    @abc.abstractmethod
    def connection_lost(self, exc: BaseException | None) -> None:
        """The connection is closed (by either side); no further calls follow."""


class DrainWaiters:
    """The callers of a connection's :meth:`Connection.drain`, waiting for room in its send queue.

    Both transports follow the same rules with it: the transport wakes the waiters once its queue
    is down to a low-water mark (not only when it is empty: under steady load it never is) or the
    connection ends; while any caller waits, a newcomer waits too (the transport's
    ``write_paused`` is true while this is), since sending past the waiters would keep the queue
    from ever getting down to where they go on; a waiter cancelled by its caller's deadline leaves
    the others waiting."""

    __slots__ = ("_room", "_count")

    def __init__(self) -> None:
        self._room = asyncio.Event()
        self._count = 0  # callers now waiting

    def __bool__(self) -> bool:
        return self._count > 0

    async def wait(self) -> None:
        if not self._count:
            # The first to wait. Otherwise, if the room is set, those waiting are going on (woken,
            # not yet run) and a newcomer goes with them.
            self._room.clear()
        self._count += 1
        try:
            await self._room.wait()
        finally:
            self._count -= 1

    def wake(self) -> None:
        self._room.set()


class Connection(abc.ABC):
    """One established, bidirectional frame stream."""

    peer: str  # "host:port" of the other side, for logs
    # Whether a peer that authenticated may reach memory of ours by key (RDMA: the key of a live
    # exposure works from any queue pair of the NIC): a server takes no user connections over it.
    exposes_memory: bool = False
    # What this connection accepts; the receiver may replace it at any time (the server keeps it
    # tight until the peer has authenticated) and the next frame header is checked against it.
    limits: RpcLimits

    @abc.abstractmethod
    def send_frame(
        self,
        flags: int,
        request_id: int,
        service_id: int,
        method_id: int,
        message: bytes,
        payload: Buffer | None = None,
        timeout_ms: int = 0,
        on_sent: Callable[[], None] | None = None,
        reply_into: int = 0,
    ) -> None:
        """Queue a frame. Never blocks and never copies ``payload``: it must stay unchanged until
        ``on_sent`` is called (or the connection is lost, after which ``on_sent`` is not called).
        Frames queued in one event loop iteration go out together. ``reply_into``: for a request,
        the size of the buffer its reply's payload will be received into (a transport may have the
        peer write it there directly; the RDMA transport does)."""

    @abc.abstractmethod
    def redirect_payload(self, replacement: memoryview) -> None:
        """Stop writing the payload now being received into the buffer ``alloc_payload`` gave;
        read the rest of it into ``replacement`` (same length) and deliver that instead. For a
        receiver whose caller gave up on a reply while its payload streamed into the caller's
        memory."""

    def peer_authenticated(self) -> None:
        """The peer has proven the cluster secret. A transport that lets peers reach our memory
        (RDMA READ/WRITE) opens nothing before this; on TCP it changes nothing. The RDMA transport
        also notices it by itself from the handshake step our side sends after checking the peer's
        proof (AUTH_OK on a server, CLIENT_PROOF on a client)."""
        return None

    @abc.abstractmethod
    def pause_receiving(self, paused: bool) -> None:
        """Stop (True) or resume (False) taking frames from the peer, for flow control: a receiver
        with too much work in progress lets the peer's sends back up instead of buffering them."""

    @property
    @abc.abstractmethod
    def is_closing(self) -> bool:
        """True once close() was called or the connection was lost."""

    @property
    @abc.abstractmethod
    def write_paused(self) -> bool:
        """True while the peer is not keeping up; callers with much to send await :meth:`drain`."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Wait until the send queue is below its low-water mark (returns at once if closed)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush queued frames, then close. Idempotent."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Close at once, dropping queued frames. Idempotent."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Wait until the connection is fully closed."""


#: How long :func:`close_connections` lets queued frames go out before dropping them.
CLOSE_GRACE_S = 2.0


async def close_connections(
    conns: list[Connection], who: str = "peer", grace_s: float = CLOSE_GRACE_S
) -> None:
    """Close ``conns``: what they have queued goes out first, for up to ``grace_s``; a peer not
    reading it by then (a stopped process) would hold the close, and whoever waits on it, for
    ever, so its connection is aborted and the frames dropped (with a warning naming ``who``)."""
    for c in conns:
        c.close()
    if not conns:
        return
    waits = {asyncio.ensure_future(c.wait_closed()): c for c in conns}
    _, stuck = await asyncio.wait(waits, timeout=grace_s)
    for w in stuck:
        log.warning("%s not taking what was sent, dropping it peer=%s", who, waits[w].peer)
        waits[w].abort()
    if stuck:
        await asyncio.wait(stuck)


class Listener(abc.ABC):
    """A bound, accepting server endpoint."""

    address: Address  # the bound address (the real port when 0 was asked for)

    @abc.abstractmethod
    def close(self) -> None:
        """Stop accepting (established connections are not touched)."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Wait until the listener has stopped."""


ReceiverFactory: TypeAlias = Callable[[Connection], FrameReceiver]


class Transport(abc.ABC):
    """A way of reaching peers: TCP today, RDMA verbs later."""

    name: str

    @abc.abstractmethod
    async def connect(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
        connect_timeout: float = 10.0,
    ) -> Connection:
        """Open a connection; ``receiver_factory(conn)`` is called before any frame is delivered.
        Raises FS3Error(RPC_CONNECT_FAILED) when the peer cannot be reached in ``connect_timeout``."""

    @abc.abstractmethod
    async def listen(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
    ) -> Listener:
        """Accept connections on ``address`` (port 0 picks a free port); each accepted
        connection gets its receiver from ``receiver_factory`` before any frame is delivered."""
