"""One fs3 RPC connection over an RC queue pair: frames by SEND/RECV with credits, large payloads
pulled by RDMA READ, and an explicit one-sided API (:meth:`RdmaConnection.rdma_read` /
:meth:`RdmaConnection.rdma_write`).

Sending: frames are serialised into a byte stream (header, message, then the payload inline or a
descriptor, see :mod:`fs3.net.rdma.stream`) that is cut into SENDs from a ring of registered send
buffers, each starting with a chunk header that returns credits and releases pulled payloads
(:mod:`fs3.net.rdma.wire`). A SEND needs a credit (:mod:`fs3.net.rdma.credits`); without one the
stream waits. Only some SENDs ask for a completion (the last of each burst, and every few in a long
one: :class:`~fs3.net.rdma.workreq.SendSignaling`); a completion gives back its slot and those of the
unsignaled SENDs before it. A payload above the peer's ``inline_max`` stays where it is when it lies
in registered memory, or is copied into a staging buffer of the registered pool (waiting for one
when the pool is at its cap); the peer READs it and releases it with the token.

Remote access: nothing of ours is reachable by a peer before it has authenticated (the RPC layer's
handshake, :meth:`RdmaConnection.peer_authenticated`): the queue pair is created without remote
access flags, registered memory is registered for local access only, and no rkey is handed out.
Afterwards a peer reaches exactly the bytes of one operation and only while it lasts: a pulled
payload is exposed (:meth:`~fs3.net.rdma.memory.Registrar.expose`, a memory region of just those
bytes) when its descriptor goes into the stream and withdrawn (deregistered) when the peer releases
its token; a buffer lent with :meth:`RdmaConnection.expose` is withdrawn by
:meth:`RdmaConnection.withdraw`; whatever is still exposed when the connection ends is withdrawn once
its queue pair is destroyed. Registering per operation costs a system call and pinning the pages
once more, paid only by payloads above ``inline_max`` and by lent buffers; it buys exact bounds and
a dead rkey after each operation with nothing but ``ibv_reg_mr``, which every device has. (The
rkey of a live exposure works from any queue pair of the same NIC whose peer has authenticated;
memory windows bound to one queue pair would narrow that further, where a device supports them.)
At most ``_MAX_LENT`` pulled payloads are lent to a peer at once.

Reply payloads pushed: a request whose caller receives the reply's payload into a buffer (``reply_into``
of :meth:`RdmaConnection.send_frame`: the RPC client's ``into=``) and whose reply would be pulled
(larger than our ``inline_max``) names a staging buffer of ours, exposed for writing (Flag.SINK, see
:mod:`fs3.net.rdma.stream`). The server RDMA WRITEs the reply's payload there and, once the WRITE has
completed, sends the reply with the WRITTEN descriptor: one one-sided operation the server starts as
soon as its data is ready, no READ round trip, no release token. The client withdraws the buffer's
registration as the reply arrives (any reply: a small or failed one leaves it unused), before it
copies the bytes out; a reply pulled instead frees the buffer before its READ needs staging. Only
``_MAX_SINKS`` buffers, and a quarter of the registered pool's bytes, are named at once; beyond that,
or when the pool has no buffer free right now, a request names none and its reply is pulled.

Receiving: every receive buffer is posted at start; a RECV completion's chunk is parsed, its stream
bytes appended to the :class:`~fs3.net.rdma.stream.StreamAssembler`, the buffer reposted (owing the
peer a credit), and whole frames handed to the :class:`~fs3.net.transport.FrameReceiver` in order;
a frame with a pulled payload holds back the frames after it until its READ has completed.

Completions reach the event loop through the completion channel's file descriptor: on readiness the
connection takes and acknowledges the channel's events, re-arms the CQ, then polls until it is empty
(re-arming first, so a completion that lands meanwhile still wakes us). Nothing spins.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from crc32c import crc32c

from fs3.errors import FS3Error, StatusCode
from fs3.net import auth
from fs3.net.frame import (
    F_ERROR,
    F_HANDSHAKE,
    F_PAYLOAD_CRC,
    F_REQUEST,
    F_RESPONSE,
    F_SINK,
    H_FLAGS,
    H_METHOD,
    H_PAYLOAD_CRC,
    H_PAYLOAD_LEN,
    H_REQUEST_ID,
    H_SERVICE,
    H_TIMEOUT,
    FrameError,
    RpcLimits,
    encode_header,
)
from fs3.net.rdma.credits import CreditWindow
from fs3.net.rdma.memory import Exposure, PoolBuffer, Region, RegisteredPool, SlotArena
from fs3.net.rdma.nics import OneSidedLimiter
from fs3.net.rdma.stream import StreamAssembler
from fs3.net.rdma.wire import (
    CHUNK_HEADER_SIZE,
    FEATURE_REPLY_BUFFERS,
    TOKEN_SIZE,
    WRITTEN,
    ConnectParams,
    RemoteBuffer,
    pack_chunk_header,
    pack_sink,
    parse_chunk,
    unpack_sink,
)
from fs3.net.rdma.workreq import (
    WC_SUCCESS,
    Completion,
    OneSidedTable,
    SendSignaling,
    WrKind,
    decode_wr_id,
    encode_wr_id,
    status_name,
)
from fs3.net.transport import Buffer, Connection, DrainWaiters, FrameReceiver, ReceiverFactory

log = logging.getLogger(__name__)

# Queued, unsent stream bytes above which callers are asked to wait (drain), and below which they resume.
_HIGH_WATER = 16 << 20
_LOW_WATER = 4 << 20
# Frames waiting to enter the stream above which callers are asked to wait (drain), and below which
# they resume.
_FRAMES_HIGH = 1024
_FRAMES_LOW = 256
# Pulled payloads lent to the peer at once: each holds a memory registration until the peer releases
# it, so a peer that never does cannot make us register without bound (later frames wait their turn).
_MAX_LENT = 256
# Reply buffers our requests name at once (each a staging buffer and a registration until its reply
# arrives), their share of the registered pool (1/_SINK_POOL_SHARE), and the reply buffers of the
# peer's requests we remember at once (the rest are not written into: their replies are pulled).
_MAX_SINKS = 256
_SINK_POOL_SHARE = 4
_MAX_PEER_SINKS = 4096
# Released tokens carried by one SEND at most (the rest go in the next).
_MAX_TOKENS_PER_SEND = 64
# Completions taken per poll call.
_POLL_BATCH = 64


class QueuePairOps(Protocol):
    """What a connection needs from the verbs layer (:mod:`fs3.net.rdma.verbs`, or a test fake)."""

    def fileno(self) -> int:
        """The completion channel's file descriptor (non-blocking)."""

    def allow_remote_access(self) -> None:
        """Let the peer RDMA-READ/WRITE through this queue pair (created without remote access)."""

    def post_recv(self, wr_id: int, region: Region, offset: int, length: int) -> None: ...

    def post_send(self, wr_id: int, region: Region, offset: int, length: int, signaled: bool = True) -> None:
        """Post a SEND; without ``signaled`` it completes silently (vouched for by a later completion)."""

    def post_read(
        self, wr_id: int, region: Region, offset: int, length: int, remote: RemoteBuffer
    ) -> None: ...

    def post_write(
        self, wr_id: int, region: Region, offset: int, length: int, remote: RemoteBuffer
    ) -> None: ...

    def take_events(self) -> None:
        """Take and acknowledge every pending completion-channel event without blocking."""

    def arm(self) -> None:
        """Request a channel event for the next completion (``ibv_req_notify_cq``)."""

    def poll(self, n: int) -> list[Completion]:
        """Up to ``n`` completions, oldest first (empty when none)."""

    def close(self) -> None:
        """Destroy the queue pair, its CQ and channel (work requests are flushed)."""


class _OutFrame:
    __slots__ = ("head", "payload", "pulled", "plen", "on_sent", "staged", "ready", "pushed", "sink")

    def __init__(
        self,
        head: bytes,
        payload: Buffer | None,
        pulled: bool,
        plen: int,
        on_sent: Callable[[], None] | None,
    ) -> None:
        self.head = head  # frame header + message
        self.payload = payload
        self.pulled = pulled
        self.plen = plen
        self.on_sent = on_sent
        self.staged: PoolBuffer | None = None
        self.ready = not pulled  # a pulled payload is ready once it lies in registered memory
        self.pushed = False  # the payload is RDMA-written into the peer's buffer (ready when done)
        self.sink: bytes | None = None  # the descriptor of our reply buffer (a request)


class RdmaConnection(Connection):
    """An established RC connection carrying fs3 RPC frames. Built by :class:`RdmaTransport`."""

    exposes_memory = True  # see the module docstring: a live exposure's key works NIC-wide

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        qp: QueuePairOps,
        local: ConnectParams,
        remote: ConnectParams,
        send_arena: SlotArena,
        recv_arena: SlotArena,
        pool: RegisteredPool,
        limiter: OneSidedLimiter,
        limits: RpcLimits,
        peer: str,
        on_closed: Callable[[RdmaConnection], None] | None = None,
        server_side: bool = False,
    ) -> None:
        self.limits = limits
        self.peer = peer
        self._loop = loop
        self._qp = qp
        self.local = local
        self.remote = remote
        self._send = send_arena
        self._recv = recv_arena
        self.pool = pool
        self.limiter = limiter
        self._on_closed = on_closed
        self.credits = CreditWindow(remote.recv_buffers, local.recv_buffers)
        self._receiver: FrameReceiver | None = None
        self._onesided = OneSidedTable()
        # send state
        self._frames: deque[_OutFrame] = deque()  # not yet in the stream (waiting for staging)
        self._out: deque[memoryview] = deque()  # stream bytes not yet in a SEND
        self._out_bytes = 0
        self._queued_pos = 0  # stream bytes ever queued / put in SENDs / whose SENDs completed
        self._sent_pos = 0
        self._done_pos = 0
        self._slot_end: dict[int, int] = {}
        self._signaling = SendSignaling(max(1, send_arena.count // 4))
        self._on_stream_done: deque[tuple[int, Callable[[], None]]] = deque()
        self._next_token = 1
        # pulled payloads the peer has not released yet: token -> (staging buffer, on_sent, exposure)
        self._lent: dict[int, tuple[PoolBuffer | None, Callable[[], None] | None, Exposure]] = {}
        self._remote_ok = False  # the peer has authenticated: its rkeys may be honoured
        self._exposed: dict[int, Exposure] = {}  # lent with expose(), by rkey
        self._release_tokens: list[int] = []
        # our requests' reply buffers, by request id (see the module docstring), and their bytes
        self._sinks: dict[int, tuple[PoolBuffer, Exposure]] = {}
        self._sink_bytes = 0
        self._peer_sinks: dict[int, RemoteBuffer] = {}  # reply buffers the peer's requests named
        self.pushed = 0  # reply payloads written into the peer's buffers
        self.received_written = 0  # reply payloads the peer wrote into ours
        # one-sided operations this side completed, and their bytes: READs (pulled payloads and
        # rdma_read) and WRITEs (pushed reply payloads and rdma_write)
        self.reads = self.read_bytes = self.writes = self.write_bytes = 0
        self._pump_scheduled = False
        self._drain_waiters = DrainWaiters()
        # receive state
        self._assembler = StreamAssembler(local.inline_max)
        self._paused = False  # by the receiver (too much work in progress)
        # A server stops taking requests from a peer whose replies it cannot get rid of, as the TCP
        # transport does, so an unresponsive client cannot make it queue replies without bound.
        self._server_side = server_side
        self._paused_for_writes = False
        self._held: list[int] = []  # receive slots not reposted while paused
        self._frames_in = 0  # frames delivered, to tell a stalled frame from a new one
        self._partial_timer: asyncio.TimerHandle | None = None
        # Watches a peer that takes none of our queued bytes (see RpcLimits.write_stall_timeout_s).
        self._stall_timer: asyncio.TimerHandle | None = None
        self._pulling = False  # a frame waits for its payload's READ
        self._pull_dest: memoryview | None = None
        # lifecycle
        self._closing = False
        self._dead = False
        self._finished = False
        self._close_exc: BaseException | None = None
        self._closed: asyncio.Future[None] = loop.create_future()

    # ---- start and completion handling ------------------------------------------------------

    def post_receives(self) -> None:
        """Post every receive buffer: done before this side tells the peer it may send."""
        for slot in range(self._recv.count):
            self._post_recv(slot)

    def start(self, receiver_factory: ReceiverFactory) -> None:
        """Watch the completion channel and attach the receiver (receives must be posted already)."""
        self._loop.add_reader(self._qp.fileno(), self._on_channel)
        self._qp.arm()
        self._receiver = receiver_factory(self)
        self._poll()

    def _post_recv(self, slot: int) -> None:
        try:
            self._qp.post_recv(
                encode_wr_id(WrKind.RECV, slot), self._recv.region, self._recv.offset(slot), self._recv.size
            )
        except Exception as e:
            self._broken(f"posting a receive failed: {e}")

    def _on_channel(self) -> None:
        try:
            self._qp.take_events()
            self._qp.arm()
        except Exception as e:  # the device went away
            self._broken(f"completion channel failed: {e}")
            return
        self._poll()

    def _poll(self) -> None:
        while not self._finished:
            wcs = self._qp.poll(_POLL_BATCH)
            if not wcs:
                break
            for wc in wcs:
                self._complete(wc)
                if self._finished:  # the rest of the batch is for a connection that is over
                    break
        if self._closing and not self._finished:
            self._maybe_finish()

    def _complete(self, wc: Completion) -> None:
        kind, index = decode_wr_id(wc.wr_id)
        if kind is WrKind.RECV:
            if wc.status != WC_SUCCESS:
                self._broken(f"receive failed: {status_name(wc.status)}")
            else:
                self._on_recv(index, wc.byte_len)
        elif kind is WrKind.SEND:
            if wc.status != WC_SUCCESS:
                self._broken(f"send failed: {status_name(wc.status)}")
            else:
                self._on_send_done(index)
        else:
            self._onesided.complete(wc)

    def _broken(self, reason: str) -> None:
        if self._finished:
            return
        if not self._closing:
            log.warning("rdma connection broken peer=%s reason=%s", self.peer, reason)
        self._close_exc = FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"{self.peer}: {reason}")
        self._finish()

    # ---- receive path -----------------------------------------------------------------------

    def _on_recv(self, slot: int, length: int) -> None:
        try:
            returned, tokens, data = parse_chunk(self._recv.view(slot), length)
            self.credits.on_receive(returned)
        except (FS3Error, ValueError) as e:
            self._fail(FrameError(StatusCode.RPC_MALFORMED_FRAME, str(e)))
            return
        for t in tokens:
            self._release_lent(t)  # also while closing: a flush waits for these
        if self._dead:
            return  # no more frames are taken after a fatal error
        if data.nbytes:
            self._assembler.feed(data)
        # While paused, keep the peer's buffers (so it stops sending), but never the last two: the peer
        # needs them for credit returns, without which our own replies would stall.
        if self._stopped and len(self._held) < self._recv.count - 2:
            self._held.append(slot)
        else:
            self._post_recv(slot)
            self.credits.on_reposted()
        self._deliver()
        self._schedule_pump()

    @property
    def _stopped(self) -> bool:
        return self._paused or self._paused_for_writes

    def _deliver(self) -> None:
        receiver = self._receiver
        while not self._stopped and not self._pulling and not self._dead and receiver is not None:
            try:
                frame = self._assembler.next_frame(self.limits)
            except FrameError as e:
                self._fail(e)
                return
            if frame is None:
                if self._assembler.mid_frame:
                    self._arm_partial_timer()
                return
            hdr = frame.header
            if frame.sink is not None and not self._remember_sink(hdr, frame.sink):
                return
            if frame.descriptor == WRITTEN:
                if not self._take_written(hdr, frame.message):
                    return
                continue
            if self._sinks and hdr[H_FLAGS] & F_RESPONSE:
                self._drop_sink(hdr[H_REQUEST_ID])  # not written into: free it (before a pull's staging)
            if frame.descriptor is not None:
                self._start_pull(hdr, frame.message, frame.descriptor)
                return
            payload = None
            if frame.payload is not None:
                payload = self._alloc(hdr, len(frame.payload))
                if payload is None:
                    return
                payload[:] = frame.payload
            self._hand_up(hdr, frame.message, payload)

    def _remember_sink(self, hdr: tuple[int, ...], descriptor: bytes) -> bool:
        """A request named its reply buffer: remember it for the reply (False: malformed, failed)."""
        try:
            remote = unpack_sink(descriptor)
        except FS3Error as e:
            self._fail(FrameError(StatusCode.RPC_MALFORMED_FRAME, e.message, hdr[H_REQUEST_ID]))
            return False
        if len(self._peer_sinks) < _MAX_PEER_SINKS:
            self._peer_sinks[hdr[H_REQUEST_ID]] = remote
        return True

    def _take_written(self, hdr: tuple[int, ...], message: bytes) -> bool:
        """A reply whose payload the peer wrote into the buffer its request named: hand it up from
        there (False: the connection failed)."""
        rid, plen = hdr[H_REQUEST_ID], hdr[H_PAYLOAD_LEN]
        entry = self._pop_sink(rid)
        if entry is None or not hdr[H_FLAGS] & F_RESPONSE or plen > entry[0].size:
            if entry is not None:
                self._free_sink(entry)
            self._fail(
                FrameError(
                    StatusCode.RPC_MALFORMED_FRAME, "payload written where the request named no buffer", rid
                )
            )
            return False
        buf, exposure = entry
        self._withdraw(exposure)  # nothing writes there any more
        dest = self._alloc(hdr, plen)
        if dest is None:
            self.pool.release(buf)
            return False
        dest[:] = buf.view[:plen]
        self.pool.release(buf)
        self.received_written += 1
        self._hand_up(hdr, message, dest)
        return True

    def _pop_sink(self, request_id: int) -> tuple[PoolBuffer, Exposure] | None:
        entry = self._sinks.pop(request_id, None)
        if entry is not None:
            self._sink_bytes -= entry[0].size
        return entry

    def _drop_sink(self, request_id: int) -> None:
        entry = self._pop_sink(request_id)
        if entry is not None:
            self._free_sink(entry)

    def _free_sink(self, entry: tuple[PoolBuffer, Exposure]) -> None:
        self._withdraw(entry[1])
        self.pool.release(entry[0])

    def _attach_sink(self, request_id: int, size: int) -> bytes | None:
        """Expose a staging buffer of ``size`` bytes for the peer to write a request's reply payload
        into, and return its descriptor; None where none is lent now (see the module docstring)."""
        pool = self.pool
        if (
            not self._remote_ok
            or not self.remote.features & FEATURE_REPLY_BUFFERS
            or len(self._sinks) >= _MAX_SINKS
            or size > pool.max_buffer_bytes
            or self._sink_bytes + size > pool.max_bytes // _SINK_POOL_SHARE
        ):
            return None
        buf = pool.try_acquire(size)
        if buf is None:
            return None
        try:
            exposure = pool.registrar.expose(buf.region, 0, size, write=True)
        except Exception:
            log.exception("exposing a reply buffer failed peer=%s", self.peer)
            pool.release(buf)
            return None
        self._sinks[request_id] = (buf, exposure)
        self._sink_bytes += buf.size
        return pack_sink(RemoteBuffer(exposure.addr, exposure.rkey, size))

    def _alloc(self, hdr: tuple[int, ...], length: int) -> memoryview | None:
        assert self._receiver is not None
        try:
            view = self._receiver.alloc_payload(hdr[H_FLAGS], hdr[H_REQUEST_ID], length)
            if len(view) != length:
                raise ValueError(f"alloc_payload gave {len(view)} bytes for a {length}-byte payload")
            return view
        except Exception:
            log.exception("payload allocation failed peer=%s request_id=%d", self.peer, hdr[H_REQUEST_ID])
            self._fail(FrameError(StatusCode.INTERNAL, "payload allocation failed", hdr[H_REQUEST_ID]))
            return None

    def _hand_up(self, hdr: tuple[int, ...], message: bytes, payload: memoryview | None) -> None:
        receiver = self._receiver
        assert receiver is not None
        if payload is not None and hdr[H_FLAGS] & F_PAYLOAD_CRC and crc32c(payload) != hdr[H_PAYLOAD_CRC]:
            self._report(
                FrameError(StatusCode.RPC_MALFORMED_FRAME, "payload crc mismatch", hdr[H_REQUEST_ID], False)
            )
            return
        self._frames_in += 1
        try:
            receiver.frame_received(
                hdr[H_FLAGS],
                hdr[H_REQUEST_ID],
                hdr[H_SERVICE],
                hdr[H_METHOD],
                hdr[H_TIMEOUT],
                message,
                payload,
            )
        except Exception:
            log.exception("frame receiver failed peer=%s request_id=%d", self.peer, hdr[H_REQUEST_ID])
            self._fail(FrameError(StatusCode.INTERNAL, "receiver failed", hdr[H_REQUEST_ID]))

    def _start_pull(self, hdr: tuple[int, ...], message: bytes, descriptor: bytes) -> None:
        plen = hdr[H_PAYLOAD_LEN]
        try:
            remote = RemoteBuffer.unpack(descriptor, plen)
        except FS3Error as e:
            self._fail(FrameError(StatusCode.RPC_MALFORMED_FRAME, e.message, hdr[H_REQUEST_ID]))
            return
        dest = self._alloc(hdr, plen)
        if dest is None:
            return
        self._pulling = True
        self._pull_dest = dest

        # The READ lands in a staging buffer, never directly in ``dest``: the receiver may redirect
        # the payload (its caller gave up), and a READ in flight cannot be stopped.
        def staged(buf: PoolBuffer) -> None:
            if self._dead:
                self.pool.release(buf)
                return

            def post() -> None:
                def done(status: int, error: str) -> None:
                    self.limiter.release()
                    self._pull_done(hdr, message, remote, buf, error)

                wr_id = self._onesided.add(WrKind.READ, done)
                try:
                    self._qp.post_read(wr_id, buf.region, 0, plen, remote)
                except Exception as e:
                    self._onesided.discard(wr_id)
                    done(-1, f"posting a read failed: {e}")

            self.limiter.submit(post)

        try:
            self.pool.acquire_cb(plen, staged)
        except FS3Error as e:
            self._pulling = False
            self._fail(FrameError(e.code, e.message, hdr[H_REQUEST_ID]))

    def _pull_done(
        self, hdr: tuple[int, ...], message: bytes, remote: RemoteBuffer, buf: PoolBuffer, error: str
    ) -> None:
        dest, self._pull_dest = self._pull_dest, None
        self._pulling = False
        if error:
            self.pool.release(buf)
            self._broken(f"reading a {remote.length}-byte payload failed: {error}")
            return
        self.reads += 1
        self.read_bytes += remote.length
        if dest is not None:
            dest[:] = buf.view
        self.pool.release(buf)
        self._release_tokens.append(remote.token)
        self._schedule_pump()
        if self._dead:
            return
        self._hand_up(hdr, message, dest)
        self._deliver()

    def redirect_payload(self, replacement: memoryview) -> None:
        if self._pulling and self._pull_dest is not None:
            if len(replacement) != len(self._pull_dest):
                raise ValueError("replacement buffer has the wrong size")
            self._pull_dest = replacement

    def _arm_partial_timer(self) -> None:
        if self._partial_timer is None and not self._dead:
            self._partial_timer = self._loop.call_later(
                self.limits.frame_timeout_s, self._partial_timeout, self._frames_in
            )

    def _partial_timeout(self, frames_when_armed: int) -> None:
        # A peer that starts a frame and never finishes it must not pin the connection: as on TCP,
        # it is disconnected after frame_timeout_s without progress (our own pauses do not count).
        self._partial_timer = None
        if self._dead or not self._assembler.mid_frame:
            return
        if self._frames_in != frames_when_armed or self._stopped or self._pulling:
            self._arm_partial_timer()
            return
        self._fail(
            FrameError(StatusCode.DEADLINE_EXCEEDED, f"frame incomplete after {self.limits.frame_timeout_s}s")
        )

    def pause_receiving(self, paused: bool) -> None:
        if paused == self._paused:
            return
        self._paused = paused
        if not paused:
            self._resume()

    def _resume(self) -> None:
        if not self._stopped:
            # the time we did not take frames up is not the peer's: a frame begun gets a whole
            # frame timeout from now (a timer due a moment from now would cut it off before the
            # _deliver below runs)
            if self._partial_timer is not None:
                self._partial_timer.cancel()
                self._partial_timer = None
                self._arm_partial_timer()
            held, self._held = self._held, []
            for slot in held:
                self._post_recv(slot)
            if held:
                self.credits.on_reposted(len(held))
                self._schedule_pump()
            # frames that arrived meanwhile: not from inside this call (it may come from a receiver)
            self._loop.call_soon(self._deliver)

    # ---- errors -----------------------------------------------------------------------------

    def _report(self, error: FrameError) -> None:
        if self._receiver is not None:
            try:
                self._receiver.frame_error(error)
            except Exception:
                log.exception("frame_error handler failed peer=%s", self.peer)

    def _fail(self, error: FrameError) -> None:
        """A fatal frame error: tell the receiver, stop taking frames, flush what it sent, close."""
        self._report(error)
        self._dead = True
        self.close()

    # ---- send path --------------------------------------------------------------------------

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
        if self._closing:
            raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"connection to {self.peer} is closed")
        if (
            flags & F_HANDSHAKE
            and not flags & F_ERROR
            and method_id == (auth.AUTH_OK if self._server_side else auth.CLIENT_PROOF)
        ):
            # Our side sends this step only once the peer has proven the cluster secret (a server
            # after checking the client's proof, a client after checking the server's).
            self.peer_authenticated()
        plen = 0
        if payload is not None:
            t = type(payload)
            plen = len(payload) if t is bytes or t is bytearray else memoryview(payload).nbytes
        pcrc = crc32c(payload) if payload is not None and flags & F_PAYLOAD_CRC else 0
        pulled = plen > self.remote.inline_max
        sink = None
        if reply_into > self.local.inline_max and flags & F_REQUEST:
            sink = self._attach_sink(request_id, reply_into)
            if sink is not None:
                flags |= F_SINK
        into = self._peer_sinks.pop(request_id, None) if self._peer_sinks and flags & F_RESPONSE else None
        push = into is not None and pulled and plen <= into.length and self._remote_ok
        if pulled and not push and not self._remote_ok:
            raise FS3Error(
                StatusCode.PERMISSION_DENIED,
                f"a {plen}-byte payload is pulled by the peer, which has not authenticated",
            )
        head = encode_header(flags, request_id, service_id, method_id, len(message), plen, timeout_ms, pcrc)
        frame = _OutFrame(head + message, payload if plen else None, pulled and not push, plen, on_sent)
        frame.sink = sink
        self._frames.append(frame)
        if push:
            assert into is not None
            frame.pushed = True
            frame.ready = False
            self._push(frame, into)
        elif pulled:
            self._prepare_pull(frame)
        self._schedule_pump()

    def _push(self, frame: _OutFrame, remote: RemoteBuffer) -> None:
        """RDMA WRITE ``frame``'s payload into the peer's reply buffer ``remote``; the frame (with
        the WRITTEN descriptor) is ready once the WRITE has completed."""
        assert frame.payload is not None
        payload = frame.payload
        n = frame.plen
        target = RemoteBuffer(remote.addr, remote.rkey, n)

        def write(region: Region, offset: int, staged: PoolBuffer | None) -> None:
            def post() -> None:
                def done(status: int, error: str) -> None:
                    self.limiter.release()
                    if staged is not None:
                        self.pool.release(staged)
                    if error:
                        self._broken(f"writing a {n}-byte reply payload failed: {error}")
                        return
                    self.pushed += 1
                    self.writes += 1
                    self.write_bytes += n
                    frame.payload = None
                    frame.ready = True
                    if frame.on_sent is not None:
                        self._call(frame.on_sent)  # the payload is no longer needed
                    self._schedule_pump()

                wr_id = self._onesided.add(WrKind.WRITE, done)
                try:
                    self._qp.post_write(wr_id, region, offset, n, target)
                except Exception as e:
                    self._onesided.discard(wr_id)
                    done(-1, f"posting a write failed: {e}")

            self.limiter.submit(post)

        found = self.pool.directory.find(payload)
        if found is not None:
            write(found[0], found[1], None)
            return

        def staged(buf: PoolBuffer) -> None:
            if self._finished:
                self.pool.release(buf)
                return
            buf.view[:] = memoryview(payload).cast("B")  # type: ignore[arg-type]
            write(buf.region, 0, buf)

        self.pool.acquire_cb(n, staged)

    def _prepare_pull(self, frame: _OutFrame) -> None:
        assert frame.payload is not None
        if self.pool.directory.find(frame.payload) is not None:
            frame.ready = True  # registered already: the peer reads it where it is
            return

        def staged(buf: PoolBuffer) -> None:
            if self._finished:
                self.pool.release(buf)
                return
            buf.view[:] = memoryview(frame.payload).cast("B")  # type: ignore[arg-type]
            frame.staged = buf
            frame.ready = True
            self._schedule_pump()

        self.pool.acquire_cb(frame.plen, staged)

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled and not self._finished:
            # Frames queued by other tasks in this loop iteration share SENDs.
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _serialise(self) -> None:
        """Move frames whose payload is ready into the byte stream, in order."""
        frames = self._frames
        while frames and frames[0].ready:
            if frames[0].pulled and len(self._lent) >= _MAX_LENT:
                break  # the peer's releases make room (and schedule a pump)
            f = frames.popleft()
            pieces: list[memoryview] = [memoryview(f.head)]
            if f.pushed:
                pieces.append(memoryview(WRITTEN))
            elif f.pulled:
                if f.staged is not None:
                    region, off = f.staged.region, 0
                else:
                    found = self.pool.directory.find(f.payload)
                    assert found is not None
                    region, off = found
                try:
                    exposure = self.pool.registrar.expose(region, off, f.plen)
                except Exception as e:
                    if f.staged is not None:
                        self.pool.release(f.staged)
                    self._broken(f"exposing a {f.plen}-byte payload failed: {e}")
                    return
                token = self._next_token
                self._next_token = (token % 0xFFFFFFFF) + 1
                self._lent[token] = (f.staged, f.on_sent, exposure)
                pieces.append(memoryview(RemoteBuffer(exposure.addr, exposure.rkey, f.plen, token).pack()))
            elif f.payload is not None:
                pieces.append(memoryview(f.payload).cast("B"))
            if f.sink is not None:
                pieces.append(memoryview(f.sink))
            for p in pieces:
                self._out.append(p)
                self._out_bytes += p.nbytes
                self._queued_pos += p.nbytes
            if not f.pulled and not f.pushed and f.on_sent is not None:
                self._on_stream_done.append((self._queued_pos, f.on_sent))

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self._finished:
            return
        self._serialise()
        if self._finished:
            return
        credits = self.credits
        arena = self._send
        while (self._out or self._release_tokens) and credits.can_send_data():
            slot = arena.acquire()
            if slot is None:
                break
            buf = arena.view(slot)
            tokens = self._release_tokens[:_MAX_TOKENS_PER_SEND]
            del self._release_tokens[: len(tokens)]
            start = CHUNK_HEADER_SIZE + TOKEN_SIZE * len(tokens)
            n = self._fill(buf, start)
            pack_chunk_header(buf, credits.take_send(), tokens, n)
            self._sent_pos += n
            # the last SEND of this pump asks for a completion (see SendSignaling)
            more = (self._out or self._release_tokens) and credits.can_send_data()
            follows = more or credits.should_send_credits()
            self._post_send(slot, start + n, last=not (follows and arena.available))
        if credits.should_send_credits():
            slot = arena.acquire()
            if slot is not None:
                buf = arena.view(slot)
                pack_chunk_header(buf, credits.take_send(), [], 0)
                self._post_send(slot, CHUNK_HEADER_SIZE, last=True)
        # (Only queued bytes pause a server, not frames waiting for the peer to release lent payloads:
        # the releases come in the peer's SENDs, which a paused server would stop taking.)
        if self._out and self._stall_timer is None:
            # Armed once at most per timeout, and not cancelled when the queue empties: it looks itself.
            self._stall_timer = self._loop.call_later(
                self.limits.write_stall_timeout_s, self._check_stall, self._done_pos
            )
        if self._server_side and not self._paused_for_writes and self._out_bytes > _HIGH_WATER:
            self._paused_for_writes = True
            log.info(
                "peer not taking replies, pausing its requests peer=%s queued=%d", self.peer, self._out_bytes
            )
        if self._closing:
            self._maybe_finish()

    def _check_stall(self, done_when_armed: int) -> None:
        """Break the connection if bytes wait for the peer and none of our SENDs has completed since
        the timer was armed: the peer posts no receives, so returns no credits (a server would
        otherwise hold the replies it queued, and stop reading from that peer, for ever)."""
        self._stall_timer = None
        if self._finished or not self._out:
            return
        if self._done_pos != done_when_armed:
            self._stall_timer = self._loop.call_later(
                self.limits.write_stall_timeout_s, self._check_stall, self._done_pos
            )
            return
        self._broken(f"peer took none of our data for {self.limits.write_stall_timeout_s}s")

    def _fill(self, buf: memoryview, start: int) -> int:
        out = self._out
        pos = start
        end = len(buf)
        while out and pos < end:
            piece = out[0]
            n = min(piece.nbytes, end - pos)
            buf[pos : pos + n] = piece[:n]
            pos += n
            if n == piece.nbytes:
                out.popleft()
            else:
                out[0] = piece[n:]
        self._out_bytes -= pos - start
        return pos - start

    def _post_send(self, slot: int, length: int, last: bool) -> None:
        self._slot_end[slot] = self._sent_pos
        signaled = self._signaling.post(slot, last)
        try:
            self._qp.post_send(
                encode_wr_id(WrKind.SEND, slot), self._send.region, self._send.offset(slot), length, signaled
            )
        except Exception as e:
            self._send.release(slot)
            self._broken(f"posting a send failed: {e}")

    def _on_send_done(self, slot: int) -> None:
        end = self._done_pos
        for done in self._signaling.completed(slot):
            end = max(end, self._slot_end.pop(done, end))
            self._send.release(done)
        # SEND completions of one queue pair arrive in posting order, so this is the stream's progress.
        self._done_pos = max(self._done_pos, end)
        waiting = self._on_stream_done
        while waiting and waiting[0][0] <= self._done_pos:
            _, cb = waiting.popleft()
            self._call(cb)
        if self._out_bytes <= _LOW_WATER:
            if self._drain_waiters and len(self._frames) <= _FRAMES_LOW:
                self._drain_waiters.wake()
            if self._paused_for_writes:
                self._paused_for_writes = False
                self._resume()
        self._schedule_pump()

    def _release_lent(self, token: int) -> None:
        entry = self._lent.pop(token, None)
        if entry is None:
            log.warning("peer released an unknown payload token peer=%s token=%d", self.peer, token)
            return
        buf, cb, exposure = entry
        self._withdraw(exposure)  # before the buffer can be lent again
        if buf is not None:
            self.pool.release(buf)
        if cb is not None:
            self._call(cb)

    def _withdraw(self, exposure: Exposure) -> None:
        try:
            self.pool.registrar.withdraw(exposure)
        except Exception:
            log.exception("withdrawing remote access failed peer=%s", self.peer)

    def _call(self, cb: Callable[[], None]) -> None:
        try:
            cb()
        except Exception:
            log.exception("on_sent callback failed peer=%s", self.peer)

    # ---- one-sided operations ---------------------------------------------------------------

    def peer_authenticated(self) -> None:
        """The peer has proven the cluster secret: from now on its RDMA READ and WRITE are honoured
        for what it is given (pulled payloads, :meth:`expose`). Before this, the queue pair refuses
        every remote access and no rkey is handed out. Idempotent."""
        if self._remote_ok or self._finished:
            return
        try:
            self._qp.allow_remote_access()
        except Exception as e:
            self._broken(f"enabling remote access failed: {e}")
            return
        self._remote_ok = True

    def expose(self, buf: Buffer, *, write: bool = False) -> RemoteBuffer:
        """Lend ``buf`` (which must lie in registered memory, e.g. from
        :meth:`RdmaTransport.alloc_buffer`) to the peer for one operation: it may RDMA-READ it (and,
        with ``write``, RDMA-WRITE it), those bytes only, until :meth:`withdraw` (or the end of the
        connection). Put the descriptor in a request message. Raises PERMISSION_DENIED before the
        peer has authenticated."""
        if self._closing:
            raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"connection to {self.peer} is closed")
        if not self._remote_ok:
            raise FS3Error(StatusCode.PERMISSION_DENIED, f"{self.peer} has not authenticated")
        found = self.pool.directory.find(buf)
        if found is None:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "buffer is not registered memory")
        region, off = found
        exposure = self.pool.registrar.expose(region, off, memoryview(buf).nbytes, write=write)
        self._exposed[exposure.rkey] = exposure
        return RemoteBuffer(exposure.addr, exposure.rkey, exposure.length)

    def withdraw(self, remote: RemoteBuffer) -> None:
        """End what :meth:`expose` lent: the peer's rkey for it reaches nothing from now on. Call it
        once the operation is over (its reply has arrived, or it was abandoned)."""
        exposure = self._exposed.pop(remote.rkey, None)
        if exposure is not None:
            self._withdraw(exposure)

    async def rdma_read(self, dest: memoryview, remote: RemoteBuffer) -> None:
        """Copy ``remote`` (a peer's registered memory) into ``dest`` with one RDMA READ (a write
        payload at the head, a chain successor pulling from its predecessor). A failed READ ends
        the connection, as the queue pair's error state does on a device."""
        if dest.nbytes != remote.length:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "read destination and remote buffer differ in size")
        found = self.pool.directory.find(dest)
        staged = None if found is not None else await self.pool.acquire(remote.length)
        region, off = found if found is not None else (staged.region, 0)  # type: ignore[union-attr]
        copy = (lambda: dest.__setitem__(slice(None), staged.view)) if staged is not None else None
        await self._one_sided(WrKind.READ, region, off, remote, staged, copy)

    async def rdma_write(self, src: Buffer, remote: RemoteBuffer) -> None:
        """Copy ``src`` into ``remote`` with one RDMA WRITE (a read's data into the client's buffer);
        send the reply only after this returns. A failed WRITE ends the connection."""
        view = memoryview(src).cast("B")
        if view.nbytes != remote.length:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, "write source and remote buffer differ in size")
        found = self.pool.directory.find(view)
        staged = None
        if found is None:
            staged = await self.pool.acquire(remote.length)
            staged.view[:] = view
        region, off = found if found is not None else (staged.region, 0)  # type: ignore[union-attr]
        await self._one_sided(WrKind.WRITE, region, off, remote, staged)

    async def _one_sided(
        self,
        kind: WrKind,
        region: Region,
        offset: int,
        remote: RemoteBuffer,
        staged: PoolBuffer | None,
        copy_out: Callable[[], None] | None = None,
    ) -> None:
        """Post one READ or WRITE and wait for its completion; then ``copy_out`` (for a caller
        still waiting) and give ``staged`` back to the pool. The memory the work request names,
        and its limiter slot, stay taken until the completion arrives, whatever the caller does:
        a caller cancelled before then leaves them to the completion (the NIC may still move
        bytes into or out of them; the pool handing ``staged`` on, or the caller reusing its own
        registered buffer, would see them change)."""
        try:
            if self._closing:
                raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"connection to {self.peer} is closed")
            await self.limiter.acquire()
        except BaseException:
            if staged is not None:
                self.pool.release(staged)
            raise

        def over() -> None:  # the work request is over: its memory and its slot are free again
            self.limiter.release()
            if staged is not None:
                self.pool.release(staged)

        fut: asyncio.Future[None] = self._loop.create_future()

        def done(status: int, error: str) -> None:
            if error:
                # the queue pair is in the error state on a device: every later work request
                # would be flushed, so the connection ends now, and every call on it fails
                self._broken(f"rdma {kind.name.lower()} failed: {error}")
                fut.set_exception(
                    FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"rdma {kind.name.lower()} failed: {error}")
                )
            else:
                fut.set_result(None)

        wr_id = self._onesided.add(kind, done)
        post = self._qp.post_read if kind is WrKind.READ else self._qp.post_write
        try:
            post(wr_id, region, offset, remote.length, remote)
        except Exception as e:
            self._onesided.discard(wr_id)
            over()
            raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"posting rdma {kind.name}: {e}") from e
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.done():
                fut.cancelled() or fut.exception()  # retrieved: no "never retrieved" warning
                over()
            else:
                fut.add_done_callback(lambda f: (f.cancelled() or f.exception(), over()))
            raise
        except BaseException:
            over()
            raise
        try:
            if kind is WrKind.READ:
                self.reads += 1
                self.read_bytes += remote.length
            else:
                self.writes += 1
                self.write_bytes += remote.length
            if copy_out is not None:
                copy_out()
        finally:
            over()

    # ---- flow control and closing -----------------------------------------------------------

    @property
    def is_closing(self) -> bool:
        return self._closing

    @property
    def write_paused(self) -> bool:
        # While others wait for room, a newcomer waits too (see DrainWaiters).
        return bool(self._drain_waiters) or self._out_bytes > _HIGH_WATER or len(self._frames) > _FRAMES_HIGH

    async def drain(self) -> None:
        if self._closing or not self.write_paused:
            return
        await self._drain_waiters.wait()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._schedule_pump()
        self._maybe_finish()
        if not self._finished:
            # A peer that never completes what we flush (or never releases a payload it pulls)
            # must not keep the connection half-closed forever.
            self._loop.call_later(self.limits.frame_timeout_s, self._finish)

    def _maybe_finish(self) -> None:
        # Done flushing when every queued frame is in a completed SEND and the peer has finished
        # reading what it pulls from us.
        if (
            not self._frames
            and not self._out
            and not self._release_tokens
            and self._send.available == self._send.count
            and not self._lent
        ):
            self._finish()

    def abort(self) -> None:
        self._closing = True
        self._finish()

    def peer_gone(self) -> None:
        """The bootstrap TCP connection ended: the peer closed or died. Take what already arrived, then close."""
        if self._finished:
            return
        self._closing = True
        self._poll()
        self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._closing = True
        self._dead = True
        for timer in (self._partial_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self._partial_timer = self._stall_timer = None
        try:
            self._loop.remove_reader(self._qp.fileno())
        except Exception:
            pass
        try:
            self._qp.close()  # flushes outstanding work requests: no DMA into our memory after this
        except Exception:
            log.exception("destroying queue pair failed peer=%s", self.peer)
        self._onesided.fail_all("connection closed")
        for buf, _, exposure in self._lent.values():
            self._withdraw(exposure)
            if buf is not None:
                self.pool.release(buf)
        self._lent.clear()
        for exposure in self._exposed.values():
            self._withdraw(exposure)
        self._exposed.clear()
        for entry in self._sinks.values():
            self._free_sink(entry)
        self._sinks.clear()
        self._sink_bytes = 0
        self._peer_sinks.clear()
        for f in self._frames:
            if f.staged is not None:
                self.pool.release(f.staged)
        self._frames.clear()
        self._out.clear()
        self._drain_waiters.wake()
        if self._on_closed is not None:
            self._on_closed(self)
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            try:
                receiver.connection_lost(self._close_exc)
            except Exception:
                log.exception("connection_lost handler failed peer=%s", self.peer)
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    # ---- introspection for tests and metrics ------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of this connection (credits, queued bytes, outstanding one-sided operations)."""
        return {
            "credits": self.credits.credits,
            "owed": self.credits.owed,
            "sends": self.credits.sent,
            "receives": self.credits.received,
            "queued_bytes": self._out_bytes,
            "one_sided": len(self._onesided),
            "lent_payloads": len(self._lent),
            "exposed": len(self._exposed),
            "reply_buffers": len(self._sinks),
            "pushed": self.pushed,
            "received_written": self.received_written,
            "reads": self.reads,
            "read_bytes": self.read_bytes,
            "writes": self.writes,
            "write_bytes": self.write_bytes,
        }
