"""The fs3 RPC client: pooled, authenticated connections and calls with deadlines.

::

    client = RpcClient(secret, identity="client-7")
    response, payload = await client.call(("10.0.0.5", 8000), META["Stat"], StatRequest(...), timeout=5)
    # bulk read straight into a buffer of the caller's (no copy after the socket):
    response, data = await client.call(addr, STORAGE["Read"], req, into=memoryview(buf))
    await client.close()

One pool of connections per peer address, opened on first use and reopened on the next call after
a failure. Many calls share a connection, matched by request id. Every call has a deadline
(``timeout``, default ``default_timeout``) covering all of it: connecting, waiting for room to
send while the peer is not keeping up, and the reply. When it passes, the call raises
FS3Error(DEADLINE_EXCEEDED) and a reply that turns up later is dropped. A server-side error
raises FS3Error with the server's code and message. Connection failures raise RPC_CONNECT_FAILED
or RPC_CONNECTION_CLOSED (both retryable: the client never retries by itself, since only the caller
knows whether a call is idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from google.protobuf.message import DecodeError, Message

from fs3.errors import FS3Error, StatusCode
from fs3.log import Repeats
from fs3.net import auth
from fs3.net.buffers import BufferPool, default_pool
from fs3.net.frame import (
    DEFAULT_LIMITS,
    F_ERROR,
    F_HANDSHAKE,
    F_PAYLOAD_CRC,
    F_REQUEST,
    F_RESPONSE,
    FrameError,
    RpcLimits,
)
from fs3.net.service import Method, ServiceDef
from fs3.net.tcp import TcpTransport
from fs3.net.transport import (
    Address,
    Buffer,
    Connection,
    FrameReceiver,
    Transport,
    close_connections,
    parse_address,
)
from fs3.proto import common_pb2, rpc_pb2

log = logging.getLogger(__name__)

# How long a retired connection (see RpcClient.retire_connections) waits for its calls in flight,
# each bounded by its own deadline, before it is closed under them.
RETIRE_MAX_S = 120.0
RETIRE_GRACE_S = 0.5

Reply = tuple[Any, memoryview | None]

# pending entry: [future, response class, destination buffer or None, deadline]
_FUT, _RESP, _INTO, _DEADLINE = range(4)


_refusals = Repeats(keep=256)  # handshake refusals said, by (server, error)


class _ClientSession(FrameReceiver):
    """The client's side of one connection: handshake, pending-call table, deadlines."""

    def __init__(self, client: RpcClient, conn: Connection, address: Address) -> None:
        self.client = client
        self.conn = conn
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.ready = False
        self.closed = False
        self.pending: dict[int, list[Any]] = {}
        # requests whose payload the transport may still read (until its on_sent)
        self._unsent: set[int] = set()
        self._next_id = 1
        self._crc_flag = F_PAYLOAD_CRC if client.payload_crc else 0
        self._pool = client.pool
        self._receiving = 0  # request id whose payload is being read into the caller's buffer
        self._receiving_len = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._handshake_waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._close_reason: FS3Error | None = None

    # ---- handshake ----------------------------------------------------------------------------

    async def handshake(self, secret: bytes | None, identity: str, budget_s: float, token: str = "") -> None:
        """Authenticate both ways (raises FS3Error RPC_AUTH_FAILED, or RPC_CONNECT_FAILED on timeout);
        with ``token`` (and no secret), open a user connection: the server checks the token."""
        try:
            async with asyncio.timeout(budget_s):
                nonce = auth.new_nonce()
                hello = rpc_pb2.ClientHello(
                    version=auth.HANDSHAKE_VERSION, nonce=nonce, identity=identity, token=token
                )
                step, msg = await self._handshake_step(auth.CLIENT_HELLO, hello.SerializeToString())
                if token:
                    if step == auth.SERVER_HELLO:  # it answered as to a cluster member: no tokens
                        raise FS3Error(
                            StatusCode.RPC_AUTH_FAILED,
                            f"{self.conn.peer} does not take user tokens (an fs3 older than this client? "
                            "upgrade the servers first, or connect with the cluster secret)",
                        )
                    if step != auth.AUTH_OK:
                        raise FS3Error(StatusCode.RPC_AUTH_FAILED, f"unexpected handshake step {step}")
                    self.conn.peer_authenticated()
                    self.ready = True
                    return
                assert secret is not None
                if step != auth.SERVER_HELLO:
                    raise FS3Error(StatusCode.RPC_AUTH_FAILED, f"unexpected handshake step {step}")
                try:
                    sh = rpc_pb2.ServerHello.FromString(msg)
                except DecodeError as e:
                    raise FS3Error(StatusCode.RPC_AUTH_FAILED, "unparsable server hello") from e
                if len(sh.nonce) != auth.NONCE_BYTES or not auth.verify(
                    auth.server_proof(secret, nonce, sh.nonce, identity), sh.proof
                ):
                    # the proof shows only that the two secrets differ, not whose is wrong
                    log.warning("server failed to prove the cluster secret peer=%s", self.conn.peer)
                    raise FS3Error(
                        StatusCode.RPC_AUTH_FAILED,
                        f"{self.conn.peer} holds a different cluster secret than this process: check the "
                        "secret file given to each (it must be the same file's contents)",
                    )
                self.conn.peer_authenticated()  # RDMA: remote access may open now, not before
                proof = rpc_pb2.ClientProof(proof=auth.client_proof(secret, sh.nonce, nonce, identity))
                step, _ = await self._handshake_step(auth.CLIENT_PROOF, proof.SerializeToString())
                if step != auth.AUTH_OK:
                    raise FS3Error(StatusCode.RPC_AUTH_FAILED, f"unexpected handshake step {step}")
        except TimeoutError:
            self.conn.abort()
            raise FS3Error(
                StatusCode.RPC_CONNECT_FAILED, f"handshake with {self.conn.peer} timed out"
            ) from None
        except BaseException:
            self.conn.abort()
            raise
        self.ready = True

    def _handshake_step(self, step: int, message: bytes) -> asyncio.Future[tuple[int, bytes]]:
        if self.closed:
            raise self._close_error()
        self._handshake_waiter = self.loop.create_future()
        self.conn.send_frame(F_HANDSHAKE, 0, 0, step, message)
        return self._handshake_waiter

    # ---- calls --------------------------------------------------------------------------------

    def start_call(
        self,
        method: Method,
        request: Message,
        payload: Buffer | None,
        timeout: float,
        into: memoryview | None,
    ) -> tuple[int, asyncio.Future[Reply]]:
        rid = self._next_id
        self._next_id = rid + 1
        message = request.SerializeToString()
        if len(message) > self.conn.limits.max_message_bytes:
            raise FS3Error(
                StatusCode.RPC_FRAME_TOO_LARGE, f"request message of {len(message)} bytes is too large"
            )
        on_sent = None
        if payload is not None:
            unsent = self._unsent
            unsent.add(rid)
            on_sent = partial(unsent.discard, rid)
        try:
            self.conn.send_frame(
                F_REQUEST | (self._crc_flag if payload is not None else 0),
                rid,
                method.service_id,
                method.id,
                message,
                payload,
                min(int(timeout * 1000) + 1, 0xFFFFFFFF),
                on_sent,
                len(into) if into is not None else 0,
            )
        except BaseException:
            self._unsent.discard(rid)
            raise
        fut = self.loop.create_future()
        deadline = self.loop.time() + timeout
        self.pending[rid] = [fut, method.response, into, deadline]
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)
        return rid, fut

    def abandon(self, rid: int, fut: asyncio.Future[Reply]) -> None:
        """The caller of request ``rid`` stops waiting without a reply: cancelled, past its
        deadline, or failed. Forget the call, and see that the transport reads nothing more of its
        payload, which the caller may reuse from now on."""
        if fut.cancelled():
            if self.pending.pop(rid, None) is not None and rid == self._receiving:
                self._discard_receiving()
        elif fut.exception() is None:
            return  # answered (its caller cancelled since): the peer had the whole request
        if rid in self._unsent:
            self._drop_unsent(rid)

    def _drop_unsent(self, rid: int) -> None:
        # The payload is still queued, maybe partly written: were it sent on, the peer would take
        # whatever the caller puts in that memory next for this request. Bytes cannot be taken
        # back from the middle of a stream, so the connection goes, with everything queued on it
        # (abort, not close, which would send them first); the calls still on it fail with
        # RPC_CONNECTION_CLOSED, which their callers retry as for any lost connection.
        log.warning(
            "dropping connection: a call ended before its payload was sent peer=%s request_id=%d",
            self.conn.peer,
            rid,
        )
        self._unsent.clear()
        self.ready = False
        self._close_reason = FS3Error(
            StatusCode.RPC_CONNECTION_CLOSED, f"dropped: request {rid} ended before its payload was sent"
        )
        self.conn.abort()

    def _discard_receiving(self) -> None:
        # The reply's payload is streaming into the caller's buffer, which the caller may reuse as
        # soon as we return: send the rest of it to a scratch buffer instead.
        n, self._receiving = self._receiving_len, 0
        self.conn.redirect_payload(memoryview(self._pool.acquire(n))[:n])

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._expire)

    def _expire(self) -> None:
        # One timer per connection, set for the earliest deadline; calls are checked in bulk, so a
        # call costs no timer of its own.
        self._timer = None
        now = self.loop.time()
        earliest = None
        expired = []
        for rid, entry in self.pending.items():
            d = entry[_DEADLINE]
            if d <= now:
                expired.append(rid)
            elif earliest is None or d < earliest:
                earliest = d
        for rid in expired:
            entry = self.pending.pop(rid)
            if rid == self._receiving:
                self._discard_receiving()
            fut = entry[_FUT]
            if not fut.done():
                fut.set_exception(
                    FS3Error(
                        StatusCode.DEADLINE_EXCEEDED,
                        f"no reply from {self.conn.peer} in time (request {rid})",
                    )
                )
        if earliest is not None:
            self._arm(earliest)

    # ---- transport hooks ----------------------------------------------------------------------

    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        entry = self.pending.get(request_id)
        if entry is None:
            return memoryview(self._pool.acquire(length))[:length]  # a late reply: read and drop
        into = entry[_INTO]
        if into is not None and len(into) >= length:
            self._receiving = request_id
            self._receiving_len = length
            return into[:length]
        return memoryview(bytearray(length))

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
        if flags & F_RESPONSE:
            entry = self.pending.pop(request_id, None)
            if entry is None:
                if request_id == 0 and flags & F_ERROR:
                    # the server is closing this connection; stop sending on it
                    self._close_reason = _decode_status(message)
                    log.warning(
                        "server closing connection peer=%s error=%s", self.conn.peer, self._close_reason
                    )
                    self.ready = False
                    self.conn.close()
                else:
                    log.debug("late reply dropped peer=%s request_id=%d", self.conn.peer, request_id)
                if payload is not None:
                    self._pool.release(payload.obj)  # type: ignore[arg-type]
                return
            if self._receiving == request_id:
                self._receiving = 0
            fut = entry[_FUT]
            if fut.done():
                return
            if flags & F_ERROR:
                fut.set_exception(_decode_status(message))
                return
            try:
                response = entry[_RESP].FromString(message)
            except DecodeError:
                fut.set_exception(
                    FS3Error(
                        StatusCode.RPC_BAD_MESSAGE,
                        f"cannot parse {entry[_RESP].__name__} from {self.conn.peer}",
                    )
                )
                return
            into = entry[_INTO]
            if payload is not None and into is not None and payload.obj is not into.obj:
                fut.set_exception(
                    FS3Error(
                        StatusCode.RPC_FRAME_TOO_LARGE,
                        f"reply payload of {payload.nbytes} bytes does not fit the {into.nbytes}-byte buffer",
                    )
                )
                return
            fut.set_result((response, payload))
        elif flags & F_HANDSHAKE:
            waiter = self._handshake_waiter
            self._handshake_waiter = None
            if waiter is None or waiter.done() or self.ready:
                self._protocol_error("unexpected handshake frame")
            elif flags & F_ERROR:
                err = _decode_status(message)
                if self.client.refusal_hint and err.code == StatusCode.RPC_AUTH_FAILED:
                    err = FS3Error(err.code, f"{err.message}: {self.client.refusal_hint}")
                # once a minute per server and error: a client whose token was revoked retries
                # (each caller's call) on and on, and said so three times a second
                if _refusals.due((str(self.conn.peer), str(err))):
                    log.warning(
                        "connection refused by server peer=%s error=%s (said again in 60 s at most)",
                        self.conn.peer,
                        err,
                    )
                waiter.set_exception(err)
            else:
                waiter.set_result((method_id, bytes(message)))
        else:
            self._protocol_error(f"unexpected frame flags=0x{flags:02x}")

    def frame_error(self, error: FrameError) -> None:
        log.warning(
            "bad frame from server peer=%s code=%s request_id=%d fatal=%s reason=%r",
            self.conn.peer,
            error.code.name,
            error.request_id,
            error.fatal,
            error.message,
        )
        self._receiving = 0
        if error.fatal:
            self.ready = False  # the transport closes the connection next
            self._close_reason = FS3Error(error.code, f"{self.conn.peer}: {error.message}")
        else:
            entry = self.pending.pop(error.request_id, None)
            if entry is not None and not entry[_FUT].done():
                entry[_FUT].set_exception(FS3Error(error.code, error.message))

    def _protocol_error(self, reason: str) -> None:
        log.warning("protocol violation by server, closing peer=%s reason=%r", self.conn.peer, reason)
        self._close_reason = FS3Error(StatusCode.RPC_MALFORMED_FRAME, reason)
        self.ready = False
        self.conn.close()

    def _close_error(self) -> FS3Error:
        # Calls caught by a connection's end fail as RPC_CONNECTION_CLOSED (retryable), whatever
        # ended it; the reason goes in the message.
        reason = f": {self._close_reason}" if self._close_reason is not None else ""
        return FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"connection to {self.conn.peer} closed{reason}")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.ready = False
        self._unsent.clear()  # the transport reads no payload any more
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self.pending = self.pending, {}
        for entry in pending.values():
            fut = entry[_FUT]
            if not fut.done():
                fut.set_exception(self._close_error())
        waiter, self._handshake_waiter = self._handshake_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(self._close_error())
        self.client._session_lost(self)
        if pending:
            log.info("connection lost with calls in flight peer=%s calls=%d", self.conn.peer, len(pending))


def _decode_status(message: memoryview | bytes) -> FS3Error:
    try:
        st = common_pb2.Status.FromString(message)
    except DecodeError:
        return FS3Error(StatusCode.RPC_BAD_MESSAGE, "unparsable error status")
    return FS3Error(st.code, st.message)


class _PeerPool:
    """The connections to one peer: ``size`` slots, filled lazily, used round-robin."""

    def __init__(self, size: int) -> None:
        self.slots: list[_ClientSession | None] = [None] * size
        self.connecting: list[asyncio.Future[_ClientSession] | None] = [None] * size
        self.next = 0


class RpcClient:
    """Calls fs3 RPC services on any number of peers.

    ``secret`` is the cluster secret; ``identity`` is who this client says it is (servers log it and
    pass it to handlers). A client not trusted with the secret passes None and its user ``token``:
    its connections are user connections (see :mod:`fs3.net.auth`). ``connections_per_peer`` > 1 spreads calls over several connections;
    ``payload_crc`` adds a CRC32C of every request payload, checked by the server. A client
    belongs to the event loop it is first used on.
    """

    def __init__(
        self,
        secret: bytes | None,
        *,
        token: str = "",
        identity: str = "client",
        transport: Transport | None = None,
        limits: RpcLimits = DEFAULT_LIMITS,
        pool: BufferPool | None = None,
        connect_timeout: float = 5.0,
        default_timeout: float = 30.0,
        connections_per_peer: int = 1,
        payload_crc: bool = False,
    ) -> None:
        if connections_per_peer < 1:
            raise ValueError("connections_per_peer must be at least 1")
        if (secret is None) == (not token):
            raise ValueError("an RpcClient needs either the cluster secret or a user token")
        self._secret = None if secret is None else auth.check_secret(secret)
        self.token = token
        self.refusal_hint = ""  # added to a refusal of this client's credentials (RPC_AUTH_FAILED)
        self.identity = identity
        self.transport = transport or TcpTransport()
        self.limits = limits
        self.pool = pool or default_pool()
        self.connect_timeout = connect_timeout
        self.default_timeout = default_timeout
        self.connections_per_peer = connections_per_peer
        self.payload_crc = payload_crc
        self._peers: dict[Address, _PeerPool] = {}
        # with one connection per peer, the open one, found without the pool's bookkeeping
        self._single: dict[Address, _ClientSession] = {}
        self._closed = False
        self._lost_listeners: list[Callable[[Address], None]] = []
        self._retiring: dict[_ClientSession, asyncio.Task[None]] = {}

    def on_connection_lost(self, listener: Callable[[Address], None]) -> None:
        """Call ``listener(address)`` whenever a connection to ``address`` ends (the peer went
        away, the network failed, or this client dropped it), on the event loop."""
        self._lost_listeners.append(listener)

    def remove_connection_lost(self, listener: Callable[[Address], None]) -> None:
        with contextlib.suppress(ValueError):
            self._lost_listeners.remove(listener)

    async def call(
        self,
        address: str | Address,
        method: Method,
        request: Message,
        *,
        payload: Buffer | None = None,
        # Not asyncio.timeout's job: the deadline travels to the server and drives the pending table.
        timeout: float | None = None,  # noqa: ASYNC109
        into: Buffer | None = None,
    ) -> Reply:
        """Call ``method`` on the server at ``address``; return ``(response, payload)``.

        ``payload`` (bytes-like) travels raw after the message and must not change until the call
        returns; whatever the outcome, nothing reads it after that (a call that ends before its
        payload has been sent, by its deadline or cancelled, drops the connection, and the other
        calls on it fail with RPC_CONNECTION_CLOSED). ``into``, a writable buffer, receives the
        reply's payload directly; the returned payload is then a view of its first bytes (a reply
        payload larger than ``into`` fails with RPC_FRAME_TOO_LARGE). Without ``into`` the returned
        payload is a fresh buffer or None.
        """
        if type(address) is not tuple:
            address = parse_address(address)
        if timeout is None:
            timeout = self.default_timeout
        if timeout <= 0:
            raise FS3Error(StatusCode.DEADLINE_EXCEEDED, "deadline already passed")
        if type(request) is not method.request:
            raise TypeError(
                f"{method.full_name} takes {method.request.__name__}, not {type(request).__name__}"
            )
        if payload is not None:
            if type(payload) is not bytes and type(payload) is not bytearray:
                # any contiguous buffer (array, numpy, mmap...), counted in bytes not items
                payload = memoryview(payload).cast("B")
            size = len(payload)
            if size > self.limits.max_payload_bytes:
                raise FS3Error(
                    StatusCode.RPC_FRAME_TOO_LARGE,
                    f"payload of {size} bytes exceeds the limit of {self.limits.max_payload_bytes}",
                )
        if into is not None and not (isinstance(into, memoryview) and into.format == "B" and into.ndim == 1):
            into = memoryview(into).cast("B")
        session = self._single.get(address)
        if session is None or not session.ready:
            session = self._ready_session(address)
        if session is None:
            start = asyncio.get_running_loop().time()
            session = await self._connect(address, timeout)
            timeout -= asyncio.get_running_loop().time() - start
            if timeout <= 0:
                raise FS3Error(
                    StatusCode.DEADLINE_EXCEEDED, f"connecting to {address[0]}:{address[1]} took too long"
                )
        conn = session.conn
        if conn.write_paused:
            timeout = await self._wait_for_room(session, timeout)
        rid, fut = session.start_call(method, request, payload, timeout, into)
        try:
            return await fut
        except BaseException:
            session.abandon(rid, fut)
            # the error's traceback holds this frame, which would hold the future holding the
            # error: a reference cycle keeping the payload until a cyclic collection
            del fut
            raise

    async def _wait_for_room(self, session: _ClientSession, budget_s: float) -> float:
        """Wait, within the call's deadline, until the connection takes more; return what is left
        of ``budget_s``. A peer that stays connected but stops reading (a stopped process, a frozen
        VM) never makes room, so the wait is part of the call's deadline, and fails the same way."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            async with asyncio.timeout(budget_s):
                await session.conn.drain()
        except TimeoutError:
            raise FS3Error(
                StatusCode.DEADLINE_EXCEEDED,
                f"no room to send to {session.conn.peer} in time (the peer is not reading)",
            ) from None
        if session.closed:
            raise session._close_error()
        budget_s -= loop.time() - start
        if budget_s <= 0:
            raise FS3Error(StatusCode.DEADLINE_EXCEEDED, f"no room to send to {session.conn.peer} in time")
        return budget_s

    def stub(self, address: str | Address, service: ServiceDef) -> ServiceStub:
        """A per-peer, per-service handle: ``await stub.call("Stat", request)``."""
        return ServiceStub(self, parse_address(address), service)

    # ---- connection pool ----------------------------------------------------------------------

    def _ready_session(self, address: Address) -> _ClientSession | None:
        peer = self._peers.get(address)
        if peer is None:
            return None
        slots = peer.slots
        i = peer.next
        peer.next = (i + 1) % len(slots)
        s = slots[i]
        if s is not None and s.ready:
            return s
        # Prefer another open connection over waiting for this slot; fill the slot meanwhile.
        for other in slots:
            if other is not None and other.ready:
                if peer.connecting[i] is None and not self._closed:
                    self._start_open(address, peer, i)
                return other
        return None

    async def _connect(self, address: Address, budget_s: float) -> _ClientSession:
        if self._closed:
            raise FS3Error(StatusCode.CANCELLED, "client is closed")
        peer = self._peers.get(address)
        if peer is None:
            peer = self._peers[address] = _PeerPool(self.connections_per_peer)
        slot = next((i for i, s in enumerate(peer.slots) if s is None or not s.ready), 0)
        fut = peer.connecting[slot] or self._start_open(address, peer, slot)
        try:
            async with asyncio.timeout(budget_s):
                return await asyncio.shield(fut)
        except TimeoutError:
            raise FS3Error(
                StatusCode.DEADLINE_EXCEEDED, f"connecting to {address[0]}:{address[1]} took too long"
            ) from None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if fut.cancelled() and self._closed and task is not None and not task.cancelling():
                # close() cancelled the connecting, not our caller: fail like the calls close()
                # finds in flight (a CancelledError would end the caller's task, past a retry
                # loop catching FS3Error)
                raise FS3Error(
                    StatusCode.RPC_CONNECTION_CLOSED,
                    f"client closed while connecting to {address[0]}:{address[1]}",
                ) from None
            raise
        finally:
            # a failure's traceback holds this frame, which must not hold the future holding the
            # failure: a cycle keeping the caller's frames (a forward's payload) per failed connect
            del fut

    def _start_open(self, address: Address, peer: _PeerPool, slot: int) -> asyncio.Future[_ClientSession]:
        fut = asyncio.ensure_future(self._open(address, peer, slot))
        # waiters may all have given up; the outcome must still count as retrieved
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        peer.connecting[slot] = fut
        return fut

    async def _open(self, address: Address, peer: _PeerPool, slot: int) -> _ClientSession:
        try:
            session: _ClientSession | None = None

            def make(conn: Connection) -> _ClientSession:
                nonlocal session
                session = _ClientSession(self, conn, address)
                return session

            await self.transport.connect(
                address, make, limits=self.limits, connect_timeout=self.connect_timeout
            )
            assert session is not None
            token = self.token
            await session.handshake(self._secret, self.identity, self.connect_timeout, token)
            if self._closed:
                session.conn.abort()
                raise FS3Error(StatusCode.CANCELLED, "client is closed")
            if token != self.token:
                # the token changed during the handshake (retire_connections did not see this
                # connection): it serves the calls waiting for it, and retires with them
                session.ready = False
                self._retiring[session] = asyncio.ensure_future(self._retire(session))
                return session
            peer.slots[slot] = session
            if self.connections_per_peer == 1:
                self._single[address] = session
            log.debug("connected peer=%s:%d slot=%d", address[0], address[1], slot)
            return session
        finally:
            peer.connecting[slot] = None

    def _session_lost(self, session: _ClientSession) -> None:
        if self._single.get(session.address) is session:
            del self._single[session.address]
        peer = self._peers.get(session.address)
        if peer is not None:
            for i, s in enumerate(peer.slots):
                if s is session:
                    peer.slots[i] = None
        for listener in self._lost_listeners:
            try:
                listener(session.address)
            except Exception:
                log.exception("a connection-lost listener failed address=%s", session.address)

    def drop_peer(self, address: Address, reason: str) -> int:
        """Abort the connections to ``address`` now: its calls in flight fail at once with
        RPC_CONNECTION_CLOSED (``reason`` in the message), which callers retry as for any lost
        connection, instead of each waiting out its deadline; later calls connect afresh. For a
        peer known to be gone or hung (see :func:`fs3.client.storage_client.drop_failed_nodes`).
        Returns the number of connections aborted."""
        peer = self._peers.get(address)
        sessions = {s for s in (peer.slots if peer is not None else ()) if s is not None}
        single = self._single.get(address)
        if single is not None:
            sessions.add(single)
        dropped = 0
        for s in sessions:
            if s.closed:
                continue
            s.ready = False
            s._close_reason = FS3Error(StatusCode.RPC_CONNECTION_CLOSED, reason)
            s.conn.abort()
            dropped += 1
        return dropped

    def retire_connections(self) -> int:
        """Have later calls open new connections (with the ``token`` set now: a user connection
        proves its token once, at its handshake), and close each connection open now once its
        calls in flight have ended, which they do as usual. Returns how many were retired."""
        sessions = {s for p in self._peers.values() for s in p.slots if s is not None}
        sessions.update(self._single.values())
        for peer in self._peers.values():
            peer.slots = [None] * len(peer.slots)
        self._single.clear()
        retired = 0
        for s in sessions:
            if s.closed or s in self._retiring:
                continue
            s.ready = False  # not picked again, even through a stale reference
            self._retiring[s] = asyncio.ensure_future(self._retire(s))
            retired += 1
        return retired

    async def _retire(self, session: _ClientSession) -> None:
        try:
            loop = asyncio.get_running_loop()
            until = loop.time() + RETIRE_MAX_S
            while not session.closed and (left := until - loop.time()) > 0:
                if session.pending:
                    # each call in flight ends by its reply, its deadline or the connection's loss
                    await asyncio.wait([e[_FUT] for e in session.pending.values()], timeout=left)
                    continue
                # callers that took this connection before it retired (a connect they waited for,
                # room to send) start their calls on it: a grace without one, then it closes
                started = session._next_id
                await asyncio.sleep(min(RETIRE_GRACE_S, left))
                if session._next_id == started and not session.pending:
                    break
            if not session.closed:
                await close_connections([session.conn], "server")
        finally:
            self._retiring.pop(session, None)

    async def close(self) -> None:
        """Close every connection; calls in flight fail with RPC_CONNECTION_CLOSED. Requests still
        queued go out first, for up to ``CLOSE_GRACE_S``; a peer not reading them by then (a
        stopped process) has its connection aborted and they are dropped."""
        self._closed = True
        retired, retiring = list(self._retiring), list(self._retiring.values())
        for task in retiring:
            task.cancel()  # their connections close below, with the others
        await asyncio.gather(*retiring, return_exceptions=True)
        sessions = [s for p in self._peers.values() for s in p.slots if s is not None]
        sessions += [s for s in retired if not s.closed]
        connecting = [f for p in self._peers.values() for f in p.connecting if f is not None]
        self._peers.clear()
        self._single.clear()
        for f in connecting:
            f.cancel()
        await asyncio.gather(*connecting, return_exceptions=True)
        await close_connections([s.conn for s in sessions], "server")

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class ServiceStub:
    """Calls the methods of one service on one peer by name."""

    def __init__(self, client: RpcClient, address: Address, service: ServiceDef) -> None:
        self.client = client
        self.address = address
        self.service = service

    async def call(
        self,
        method: str,
        request: Message,
        *,
        payload: Buffer | None = None,
        # Not asyncio.timeout's job: the deadline travels to the server and drives the pending table.
        timeout: float | None = None,  # noqa: ASYNC109
        into: Buffer | None = None,
    ) -> Reply:
        """Like :meth:`RpcClient.call`, naming the method."""
        return await self.client.call(
            self.address, self.service[method], request, payload=payload, timeout=timeout, into=into
        )
