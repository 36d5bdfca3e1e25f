"""The TCP transport: frames over a stream socket, on uvloop (or any asyncio loop).

Receiving uses :class:`asyncio.BufferedProtocol`, so the loop reads straight into memory we own:
small frames land in the connection's receive buffer and are handed up as views into it, and once a
frame's header says a payload follows, the rest of that payload is read directly into the buffer
the receiver supplied (pooled, or a caller's destination), with no intermediate copy. Sending
gathers every frame queued during one loop iteration into a single write (``writelines`` when
payloads are involved, so payloads are never concatenated or copied), except that on a connection
whose writes have been carrying one frame each, a turn's first frame is written at once (see
``send_frame``). A large write goes to the socket with ``os.writev`` when the transport has
nothing queued: the event loop's own write holds the GIL while the kernel copies a megabyte (39% of
a storage daemon's GIL-holding samples while serving 1 MiB reads), ``writev`` releases it, so the
daemon's I/O threads run meanwhile; what does not fit goes to the transport as before.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
import struct
import termios
from collections import deque
from collections.abc import Callable

from crc32c import crc32c

from fs3.errors import FS3Error, StatusCode
from fs3.net.frame import (
    DEFAULT_LIMITS,
    F_PAYLOAD_CRC,
    H_FLAGS,
    H_MESSAGE_LEN,
    H_PAYLOAD_CRC,
    H_PAYLOAD_LEN,
    H_REQUEST_ID,
    HEADER_SIZE,
    FrameError,
    RpcLimits,
    check_header,
    encode_header,
)
from fs3.net.transport import (
    Address,
    Buffer,
    Connection,
    DrainWaiters,
    FrameReceiver,
    Listener,
    ReceiverFactory,
    Transport,
    bind_socket,
)

log = logging.getLogger(__name__)

# Every connection has a receive buffer (idle clients included), so it starts small and grows once a
# read fills it (a busy connection with many small frames in flight); payloads bypass it anyway.
_RECV_BUF_START = 16 << 10
_RECV_BUF_MAX = 128 << 10
# Messages up to this size are assembled in the receive buffer; larger ones get their own buffer.
_INLINE_MESSAGE_MAX = _RECV_BUF_START // 2
# Compact the receive buffer when less than this is free at its end.
_COMPACT_BELOW = 4 << 10
# Queued writes smaller than this in total are joined into one bytes object (cheaper for the loop
# than many tiny buffers); anything with a large payload goes out with writelines, uncopied.
_JOIN_BELOW = 64 << 10
# Large writes go to the socket with os.writev while the transport has nothing queued (see
# TcpConnection._write_direct), in at most this many pieces (Linux's IOV_MAX is 1024).
_WRITEV_MAX = 512
# The server stops reading from a peer whose unsent replies exceed this, until they drain; a
# client's calls wait (Connection.drain) while its unsent requests exceed it.
_BACKPRESSURE_BYTES = 16 << 20
# Callers waiting for room to send go on once no more than this is unsent: enough still queued to
# keep the socket busy while they add theirs, where waiting for an empty queue would stall it.
_DRAIN_LOW_BYTES = 4 << 20

# Probe an idle connection after 30 s, every 10 s, and give up after 3 unanswered probes (Linux).
_KEEPALIVE = [
    (getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
]


def _nbytes(buf: Buffer) -> int:
    """Length in bytes of a buffer (``len`` counts items for arrays and cast views)."""
    t = type(buf)
    return len(buf) if t is bytes or t is bytearray else memoryview(buf).nbytes


def tune_socket(sock: socket.socket | None) -> None:
    """No Nagle delay, and TCP keepalive that finds a peer which vanished without a FIN (power
    loss, partition) within about a minute, so connections to it do not linger forever. Best
    effort: a socket that refuses an option keeps its defaults."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in _KEEPALIVE:
            sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    except OSError:
        pass


# How long a connection closed for bad input keeps discarding what the peer still sends.
_LINGER_S = 1.0

_HDR, _MSG, _DIRECT_MSG, _DIRECT_PAYLOAD, _DEAD = range(5)


class TcpConnection(asyncio.BufferedProtocol, Connection):
    """One TCP connection: an asyncio protocol and an fs3 :class:`Connection` in one object."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limits: RpcLimits,
        receiver_factory: ReceiverFactory,
        server_side: bool,
    ) -> None:
        self.limits = limits
        self.peer = "?"
        self._loop = loop
        self._receiver_factory = receiver_factory
        self._receiver: FrameReceiver | None = None
        self._server_side = server_side
        self._transport: asyncio.Transport | None = None
        # receive state
        self._rbuf = bytearray(_RECV_BUF_START)
        self._rview = memoryview(self._rbuf)
        self._offered = 0  # free space get_buffer last handed out
        self._grow = False
        self._rstart = 0
        self._rend = 0
        self._state = _HDR
        self._hdr: tuple[int, ...] = (0,) * 12  # check_header's fields of the frame being received
        self._direct: memoryview | None = None  # where the next bytes go when reading a body directly
        self._dpos = 0
        self._msg: memoryview | bytes = b""
        self._direct_msg: memoryview | bytes = b""
        self._payload: memoryview | None = None
        self._frames = 0  # completed frames, to tell a stalled frame from a new one
        self._partial_timer: asyncio.TimerHandle | None = None
        # send state
        self._wq: list[Buffer] = []
        self._wq_bytes = 0
        self._flush_scheduled = False
        self._wq_frames = 0  # frames in _wq
        self._alone = True  # whether this connection's last write carried one frame (send_frame)
        self._in_receive = False
        # on_sent callbacks, each with the stream position where its frame ends: those of frames
        # still in _wq, and those of frames handed to the transport, called once the kernel has
        # taken the stream up to there (see _settle_sent)
        self._queued_pos = 0  # stream bytes ever queued
        self._cb_queued: list[tuple[int, Callable[[], None]]] = []
        self._cb_in_transport: deque[tuple[int, Callable[[], None]]] = deque()
        self._fd = -1  # the socket's descriptor, for writes that release the GIL (_write_direct)
        self._paused = False
        # Watches a peer that takes none of our queued bytes (see RpcLimits.write_stall_timeout_s).
        self._stall_timer: asyncio.TimerHandle | None = None
        # Reading stops while either holds: our replies are not being read (server side), or the
        # receiver has asked for a pause (too much work in progress).
        self._paused_for_writes = False
        self._paused_by_receiver = False
        self._reading_stopped = False
        # Callers of drain(), woken when the queue is low again or the connection ends.
        self._drain_waiters = DrainWaiters()
        self._closing = False
        self._closed: asyncio.Future[None] = loop.create_future()

    # ---- asyncio protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        sock = transport.get_extra_info("socket")
        tune_socket(sock)
        self._fd = sock.fileno() if sock is not None else -1
        # high-water 0: we hear (resume_writing) exactly when everything queued has left, which is
        # when payload buffers may be reused. Backpressure uses our own threshold below.
        transport.set_write_buffer_limits(high=0, low=0)
        self._receiver = self._receiver_factory(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        d = self._direct
        if d is not None:
            return d[self._dpos :]
        if self._state == _DEAD:
            self._rstart = self._rend = 0
            return self._rview
        if self._grow:
            self._grow = False
            n = self._rend - self._rstart
            bigger = bytearray(min(len(self._rbuf) * 4, _RECV_BUF_MAX))
            bigger[:n] = self._rview[self._rstart : self._rend]
            self._rbuf, self._rview = bigger, memoryview(bigger)
            self._rstart, self._rend = 0, n
        elif len(self._rbuf) - self._rend < _COMPACT_BELOW:
            n = self._rend - self._rstart
            if n:
                self._rview[:n] = self._rview[self._rstart : self._rend]
            self._rstart = 0
            self._rend = n
        self._offered = len(self._rbuf) - self._rend
        return self._rview[self._rend :]

    def buffer_updated(self, nbytes: int) -> None:
        # Frames sent while we parse this read (replies of inline handlers, mostly) are written in
        # one go at the end of it, rather than an event loop iteration later.
        self._in_receive = True
        try:
            self._received(nbytes)
        finally:
            self._in_receive = False
            if self._wq:
                self._flush()
            elif self._cb_in_transport:
                # the peer is making progress, so our bytes probably are too
                self._settle_sent()
            if self._drain_waiters:
                self._check_room()

    def _received(self, nbytes: int) -> None:
        state = self._state
        if state == _DEAD:
            return
        if self._direct is not None:
            self._dpos += nbytes
            if self._dpos < len(self._direct):
                self._arm_partial_timer()
                return
            self._direct = None
            if state == _DIRECT_MSG:
                self._msg = self._direct_msg
                self._direct_msg = b""
                # rbuf is empty (everything went into the message buffer), so the payload, if any,
                # starts with the next read.
                if not self._start_payload(0):
                    self._arm_partial_timer()
                    return
            else:
                self._finish_payload()
            if self._state == _DEAD:
                return
        else:
            self._rend += nbytes
            if nbytes == self._offered and len(self._rbuf) < _RECV_BUF_MAX:
                self._grow = True  # the read filled the buffer: more was probably waiting
        self._process()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._state != _DEAD and self._mid_frame():
            log.debug("connection lost mid-frame peer=%s", self.peer)
        self._state = _DEAD
        self._closing = True
        self._direct = None
        if self._partial_timer is not None:
            self._partial_timer.cancel()
            self._partial_timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._wq.clear()
        self._cb_queued.clear()
        self._cb_in_transport.clear()
        self._drain_waiters.wake()
        if not self._closed.done():
            self._closed.set_result(None)
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            receiver.connection_lost(exc)

    def pause_writing(self) -> None:
        self._paused = True
        if self._stall_timer is None:
            # Armed once per pause at most, and not cancelled by a resume: it looks again itself.
            self._stall_timer = self._loop.call_later(
                self.limits.write_stall_timeout_s, self._check_stall, self._taken()
            )

    def _taken(self) -> int:
        """Stream bytes the peer has acknowledged so far: those the kernel took from us less those
        still in the socket's send queue. (What the kernel takes alone would not do: its buffers at
        both ends hold megabytes, and a peer reading slowly frees room there long before the kernel
        takes more from us.)"""
        t = self._transport
        taken = self._queued_pos - self._wq_bytes - (t.get_write_buffer_size() if t is not None else 0)
        if self._fd >= 0:
            try:
                taken -= struct.unpack("i", fcntl.ioctl(self._fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
            except OSError:
                pass
        return taken

    def _check_stall(self, taken_when_armed: int) -> None:
        """Abort the connection if the peer took none of our bytes since the timer was armed and
        some are still waiting. A close would not do: it waits for the unsent bytes to leave, which
        from a peer that does not read they never do (a lingering close after bad input included)."""
        self._stall_timer = None
        transport = self._transport
        if transport is None or not transport.get_write_buffer_size():
            return  # everything left; the next pause arms the timer again
        taken = self._taken()
        if taken != taken_when_armed:
            self._stall_timer = self._loop.call_later(
                self.limits.write_stall_timeout_s, self._check_stall, taken
            )
            return
        log.warning(
            "peer took none of our data for %ss, disconnecting peer=%s unsent=%d",
            self.limits.write_stall_timeout_s,
            self.peer,
            transport.get_write_buffer_size(),
        )
        self.abort()

    def resume_writing(self) -> None:
        self._paused = False
        callbacks, self._cb_in_transport = self._cb_in_transport, deque()
        for _, cb in callbacks:
            cb()
        self._drain_waiters.wake()
        if self._paused_for_writes:
            self._paused_for_writes = False
            self._update_reading()

    # ---- receive path -----------------------------------------------------------------------

    def _process(self) -> None:
        rv = self._rview
        while True:
            avail = self._rend - self._rstart
            if self._state == _HDR:
                if avail < HEADER_SIZE or self._paused_by_receiver:
                    break
                try:
                    # self.limits, not a local: a frame just delivered may have changed them
                    hdr = check_header(rv, self._rstart, self.limits)
                except FrameError as e:
                    self._fail(e)
                    return
                self._hdr = hdr
                self._rstart += HEADER_SIZE
                avail -= HEADER_SIZE
                mlen = hdr[H_MESSAGE_LEN]
                if mlen > _INLINE_MESSAGE_MAX:
                    buf = memoryview(bytearray(mlen))
                    n = min(avail, mlen)
                    buf[:n] = rv[self._rstart : self._rstart + n]
                    self._rstart += n
                    if n < mlen:
                        self._direct_msg = buf
                        self._direct = buf
                        self._dpos = n
                        self._state = _DIRECT_MSG
                        break
                    self._msg = buf
                    if not self._start_payload(avail - n):
                        break
                    continue
                self._state = _MSG
            # _MSG: the message is assembled inline
            hdr = self._hdr
            mlen = hdr[H_MESSAGE_LEN]
            if avail < mlen:
                break
            start = self._rstart
            self._rstart = start + mlen
            if hdr[H_PAYLOAD_LEN] == 0:
                # the common small frame: deliver a view into the receive buffer, no copy at all
                self._state = _HDR
                self._frames += 1
                self._deliver(rv[start : start + mlen], None)
                if self._state == _DEAD:
                    return
                continue
            self._msg = rv[start : start + mlen]
            if not self._start_payload(avail - mlen):
                break
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
        if self._mid_frame():
            self._arm_partial_timer()

    def _start_payload(self, avail: int) -> bool:
        """Begin the payload of the current frame; True if it completed from buffered bytes."""
        hdr = self._hdr
        plen = hdr[H_PAYLOAD_LEN]
        if plen == 0:
            self._state = _HDR
            self._frames += 1
            msg, self._msg = self._msg, b""
            self._deliver(msg, None)
            return self._state != _DEAD
        assert self._receiver is not None
        try:
            pview = self._receiver.alloc_payload(hdr[H_FLAGS], hdr[H_REQUEST_ID], plen)
            if len(pview) != plen:
                raise ValueError(f"alloc_payload gave {len(pview)} bytes for a {plen}-byte payload")
        except Exception:
            log.exception("payload allocation failed peer=%s request_id=%d", self.peer, hdr[H_REQUEST_ID])
            self._fail(FrameError(StatusCode.INTERNAL, "payload allocation failed", hdr[H_REQUEST_ID]))
            return False
        n = min(avail, plen)
        if n:
            pview[:n] = self._rview[self._rstart : self._rstart + n]
            self._rstart += n
        self._payload = pview
        if n == plen:
            self._finish_payload()
            return self._state != _DEAD
        # The rest of the payload goes straight from the socket into pview. The message view
        # points into the receive buffer, which is not written while reading directly, but keep a
        # copy anyway: it is small, and it frees the receive buffer to be compacted.
        if isinstance(self._msg, memoryview) and self._msg.obj is self._rbuf:
            self._msg = bytes(self._msg)
        self._direct = pview
        self._dpos = n
        self._state = _DIRECT_PAYLOAD
        return False

    def _finish_payload(self) -> None:
        hdr = self._hdr
        payload = self._payload
        msg, self._msg = self._msg, b""
        self._payload = None
        self._state = _HDR
        self._frames += 1
        if hdr[H_FLAGS] & F_PAYLOAD_CRC and crc32c(payload) != hdr[H_PAYLOAD_CRC]:
            # The frame boundaries are intact, so only this call fails; the stream goes on.
            self._report(
                FrameError(StatusCode.RPC_MALFORMED_FRAME, "payload crc mismatch", hdr[H_REQUEST_ID], False)
            )
            return
        self._deliver(msg, payload)

    def _deliver(self, msg: memoryview | bytes, payload: memoryview | None) -> None:
        hdr = self._hdr
        receiver = self._receiver
        if receiver is None:
            return
        try:
            # flags, request id, service, method, timeout (the H_* indices, spelled out on this hot path)
            receiver.frame_received(hdr[2], hdr[6], hdr[3], hdr[4], hdr[7], msg, payload)
            if self._closing:
                self._state = _DEAD  # the receiver closed us: ignore whatever else is buffered
        except Exception:
            # A receiver bug must not leave the stream half-parsed; drop this connection only.
            log.exception("frame receiver failed peer=%s request_id=%d", self.peer, hdr[H_REQUEST_ID])
            self._fail(FrameError(StatusCode.INTERNAL, "receiver failed", hdr[H_REQUEST_ID]))

    def redirect_payload(self, replacement: memoryview) -> None:
        if self._state == _DIRECT_PAYLOAD and self._payload is not None:
            if len(replacement) != len(self._payload):
                raise ValueError("replacement buffer has the wrong size")
            self._payload = replacement
            self._direct = replacement

    def _mid_frame(self) -> bool:
        return self._state != _HDR or self._rend != self._rstart

    def _arm_partial_timer(self) -> None:
        if self._partial_timer is None and self._state != _DEAD:
            self._partial_timer = self._loop.call_later(
                self.limits.frame_timeout_s, self._partial_timeout, self._frames
            )

    def _partial_timeout(self, frames_when_armed: int) -> None:
        self._partial_timer = None
        if self._state == _DEAD or not self._mid_frame():
            return
        if self._frames != frames_when_armed or self._paused_by_receiver or self._reading_stopped:
            # progress was made, or we are the ones not reading: watch the frame now in progress
            self._arm_partial_timer()
            return
        self._fail(
            FrameError(
                StatusCode.DEADLINE_EXCEEDED,
                f"frame incomplete after {self.limits.frame_timeout_s}s",
                self._hdr[H_REQUEST_ID] if self._state != _HDR else 0,
            )
        )

    def _report(self, error: FrameError) -> None:
        if self._receiver is not None:
            try:
                self._receiver.frame_error(error)
            except Exception:
                log.exception("frame_error handler failed peer=%s", self.peer)

    def _fail(self, error: FrameError) -> None:
        """Report a fatal frame error and close this connection (queued replies still go out)."""
        self._report(error)
        self._state = _DEAD
        self._direct = None
        self._payload = None
        if self._closing or self._transport is None:
            return
        # Lingering close: closing a socket with unread input makes the kernel send a reset, which
        # can overtake the error frame we just queued. So send it, shut our side down, and discard
        # input until the peer closes too or the linger time runs out.
        self._closing = True
        self._flush()
        transport = self._transport
        if transport.can_write_eof():
            transport.write_eof()
            self._loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()

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
        reply_into: int = 0,  # TCP reads a reply's payload straight into the buffer anyway
    ) -> None:
        if self._closing:
            raise FS3Error(StatusCode.RPC_CONNECTION_CLOSED, f"connection to {self.peer} is closed")
        wq = self._wq
        if payload is None:
            hdr = encode_header(flags, request_id, service_id, method_id, len(message), 0, timeout_ms)
            wq.append(hdr + message)
            size = HEADER_SIZE + len(message)
        else:
            plen = _nbytes(payload)
            pcrc = crc32c(payload) if flags & F_PAYLOAD_CRC else 0
            hdr = encode_header(
                flags, request_id, service_id, method_id, len(message), plen, timeout_ms, pcrc
            )
            wq.append(hdr + message)
            if plen:
                wq.append(payload)
            size = HEADER_SIZE + len(message) + plen
        self._wq_bytes += size
        self._wq_frames += 1
        self._queued_pos += size
        if on_sent is not None:
            self._cb_queued.append((self._queued_pos, on_sent))
        if not self._flush_scheduled and not self._in_receive:
            if self._alone:
                # This connection's frames have not been sharing writes (one caller on it at a
                # time), so waiting for the loop's next turn would only make this one wait for
                # every other task ready to run (a meta server's 16 replies, and its clients' next
                # requests: 324 us of a 2.1 ms round). bench/meta_bench.py, 16 clients with a
                # connection each: 9,200-9,400 creates/s against 8,100-8,200. Those sent in this
                # turn after it still share the next write, and a write carrying several frames
                # makes the next frame wait for its turn's others again (two shared connections:
                # no change).
                self._flush()
            # Frames queued by other tasks in this loop iteration join this write.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        wq = self._wq
        if not wq or transport is None or transport.is_closing():
            return
        self._wq = []
        self._alone = self._wq_frames <= 1
        self._wq_frames = 0
        if self._wq_bytes < _JOIN_BELOW:
            transport.write(wq[0] if len(wq) == 1 else b"".join(wq))
        elif self._fd >= 0 and len(wq) <= _WRITEV_MAX and not transport.get_write_buffer_size():
            rest = self._write_direct(wq)
            if rest:
                transport.writelines(rest)
        else:
            transport.writelines(wq)
        self._wq_bytes = 0
        if self._cb_queued:
            self._cb_in_transport.extend(self._cb_queued)
            self._cb_queued.clear()
        pending = transport.get_write_buffer_size()
        if self._cb_in_transport:
            self._settle_sent(pending)
        if self._server_side and pending > _BACKPRESSURE_BYTES and not self._paused_for_writes:
            # A peer that does not read its replies must not make us buffer without bound.
            self._paused_for_writes = True
            self._update_reading()

    def _settle_sent(self, pending: int = -1) -> None:
        """Call the on_sent callbacks of the frames the kernel has taken whole: a payload is free
        once its last byte has left the transport's buffer, not only once all of that buffer has
        (which, under steady load, may take long; the RPC client drops a connection on which a call
        ends with its payload unsent). ``pending``: the transport's unsent bytes, if known."""
        transport = self._transport
        if transport is None:
            return
        if pending < 0:
            pending = transport.get_write_buffer_size()
        taken = self._queued_pos - self._wq_bytes - pending
        callbacks = self._cb_in_transport
        while callbacks and callbacks[0][0] <= taken:
            callbacks.popleft()[1]()

    def _write_direct(self, wq: list[Buffer]) -> list[Buffer]:
        """Write ``wq`` to the socket with one writev, which releases the GIL while the kernel
        copies (the event loop's own write holds it); returns what did not fit, for the
        transport. Only while the transport has nothing queued, so the order stays."""
        try:
            n = os.writev(self._fd, wq)
        except OSError:  # EAGAIN, or an error the transport then meets and reports itself
            return wq
        for i, buf in enumerate(wq):
            size = _nbytes(buf)
            if n < size:
                rest = wq[i:]
                if n:
                    rest[0] = memoryview(buf).cast("B")[n:]
                return rest
            n -= size
        return []

    def pause_receiving(self, paused: bool) -> None:
        was = self._paused_by_receiver
        self._paused_by_receiver = paused
        self._update_reading()
        if was and not paused and self._rend > self._rstart:
            # frames that arrived before the pause are still buffered: take them up (not from
            # inside this call, which may come from a receiver callback)
            self._loop.call_soon(self._resume_processing)

    def _resume_processing(self) -> None:
        if self._state == _DEAD or self._paused_by_receiver or self._direct is not None:
            return
        self.buffer_updated(0)

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        want_paused = self._paused_for_writes or self._paused_by_receiver
        if want_paused != self._reading_stopped:
            self._reading_stopped = want_paused
            if want_paused:
                transport.pause_reading()
            else:
                transport.resume_reading()
                # the time we did not read is not the peer's: a frame begun gets a whole frame
                # timeout from now (a timer due a moment from now would cut it off before the
                # buffered frames are even taken up, from a call_soon)
                if self._partial_timer is not None:
                    self._partial_timer.cancel()
                    self._partial_timer = None
                    self._arm_partial_timer()

    @property
    def is_closing(self) -> bool:
        return self._closing

    @property
    def write_paused(self) -> bool:
        t = self._transport
        if not self._paused or t is None:
            return False
        # While others wait for room, a newcomer waits too: sending past them would keep the
        # queue from ever draining to where they go on (they would starve under steady load).
        return bool(self._drain_waiters) or t.get_write_buffer_size() > _BACKPRESSURE_BYTES

    async def drain(self) -> None:
        """Wait until at most ``_DRAIN_LOW_BYTES`` are unsent or the connection ends. The
        transport tells us only when its buffer is empty (see connection_made), so the low-water
        mark is checked as replies come in, which is when the peer is making progress; a peer
        that reads but does not answer makes the waiters go on once everything has left.
        Cancelling a waiter (a caller's deadline) leaves the others waiting."""
        if self._closing or not self._paused:
            return
        await self._drain_waiters.wait()

    def _check_room(self) -> None:
        t = self._transport
        if t is None or t.get_write_buffer_size() <= _DRAIN_LOW_BYTES:
            self._drain_waiters.wake()

    def close(self) -> None:
        # Also ends a lingering close (see _fail) early.
        self._closing = True
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._wq:
            self._flush()
        transport.close()

    def abort(self) -> None:
        self._closing = True
        self._wq.clear()
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)


class TcpListener(Listener):
    """A listening TCP socket accepting fs3 RPC connections."""

    def __init__(self, server: asyncio.AbstractServer, address: Address) -> None:
        self._server = server
        self.address = address

    def close(self) -> None:
        self._server.close()

    async def wait_closed(self) -> None:
        # Server.wait_closed waits for accepted connections too; those are the RPC layer's to close.
        self._server.close()


class TcpTransport(Transport):
    """fs3 RPC over TCP (the fallback everywhere, the only transport without an RDMA device)."""

    name = "tcp"

    async def connect(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
        connect_timeout: float = 10.0,
    ) -> TcpConnection:
        loop = asyncio.get_running_loop()
        host, port = address
        try:
            async with asyncio.timeout(connect_timeout):
                _, proto = await loop.create_connection(
                    lambda: TcpConnection(loop, limits, receiver_factory, server_side=False), host, port
                )
        except (OSError, TimeoutError) as e:
            raise FS3Error(
                StatusCode.RPC_CONNECT_FAILED, f"connect to {host}:{port}: {e or 'timed out'}"
            ) from e
        return proto

    async def listen(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
    ) -> TcpListener:
        loop = asyncio.get_running_loop()
        host, port = address

        def protocol() -> TcpConnection:
            return TcpConnection(loop, limits, receiver_factory, server_side=True)

        if host == "::":  # asyncio would make it IPv6 only: see bind_socket
            server = await loop.create_server(protocol, sock=bind_socket(host, port), backlog=1024)
        else:
            server = await loop.create_server(protocol, host, port, reuse_address=True, backlog=1024)
        bound = server.sockets[0].getsockname()
        return TcpListener(server, (bound[0], bound[1]))
