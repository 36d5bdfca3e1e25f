"""The fs3 RPC server: authenticates connections and dispatches requests to service handlers.

::

    server = RpcServer(secret, identity="meta-1")
    server.add_service(META, handlers)          # before or after start
    address = await server.start(("0.0.0.0", 8000))
    ...
    await server.stop()

Every accepted connection must complete the handshake of :mod:`fs3.net.auth` within
``limits.handshake_timeout_s``. Requests are dispatched by (service id, method id); each handler
runs in a task of its own, except handlers marked :func:`fs3.net.service.inline`, which start
right away in the receive path and get a task only if they actually wait (no task per call: in
the benchmark, Ping at 32 in flight runs about 1.4 times the rate it does with a task per call).
Malformed input fails that one call (unknown method, unparsable message) or closes that one
connection (broken framing, oversized lengths, stalled frames), always with a logged reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import time
import types
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from google.protobuf.message import DecodeError

from fs3.errors import FS3Error, StatusCode, cut_middle
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
from fs3.net.service import INLINE_ATTR, CallContext, Handler, HandlerResult, Method, ServiceDef
from fs3.net.system import SYSTEM_SERVICE, SystemService
from fs3.net.tcp import TcpTransport
from fs3.net.transport import (
    Address,
    Connection,
    FrameReceiver,
    Listener,
    Transport,
    close_connections,
    parse_address,
)
from fs3.proto import common_pb2, rpc_pb2

log = logging.getLogger(__name__)

#: the longest message of an error reply, in bytes of UTF-8 (a handshake's replies must fit in 4 KiB)
MAX_ERROR_MESSAGE_BYTES = 1024
_WARN_REJECTIONS = 10  # per connection
# how often an open user connection's token is checked again while it is used (the verifier's
# own cache may answer for a while longer): a revoked token loses its open connections
USER_RECHECK_S = 30.0
#: how long a user connection's calls wait for that recheck at most: then they are served while it
#: goes on (an unreachable mgmtd changes nothing; a reachable one answers a revocation at once)
USER_RECHECK_HOLD_S = 2.0
#: user connections one uid may hold open to one server (RpcServer.max_user_connections)
MAX_USER_CONNECTIONS = 1024
#: connections not authenticated yet that one server keeps (RpcServer.max_handshaking), and of
#: them from one host (RpcServer.max_handshaking_per_host): one host's stalled connections must not
#: take every place and lock every other client out
MAX_HANDSHAKING = 1024
MAX_HANDSHAKING_PER_HOST = 256
#: the server's loop beats this often (see _Pulse); beats this far apart mean it did not run
PULSE_S = 0.25
STALL_S = 1.0
# The reply to calls that a stopping server cancels or no longer starts: UNAVAILABLE, which every
# client retries (after a backoff, elsewhere where it can), not CANCELLED, which a client takes as
# final (its own RpcClient raises CANCELLED once closed).
_SHUTTING_DOWN = (StatusCode.UNAVAILABLE, "server shutting down")


def _handshake_limits(limits: RpcLimits) -> RpcLimits:
    return dataclasses.replace(
        limits, max_message_bytes=min(limits.max_message_bytes, 4096), max_payload_bytes=0
    )


def error_message(code: int, message: str) -> bytes:
    """The message bytes of an error frame: ``message`` cut in the middle to MAX_ERROR_MESSAGE_BYTES
    if longer, and sent even where it holds text that is not UTF-8 (see fs3.errors.cut_middle)."""
    return common_pb2.Status(
        code=int(code), message=cut_middle(message, MAX_ERROR_MESSAGE_BYTES)
    ).SerializeToString()


@types.coroutine
def _resume(coro: Any, pending: Any) -> Generator[Any, Any, Any]:
    """Continue a coroutine that was started by hand and suspended on ``pending``.

    The server runs :func:`fs3.net.service.inline` handlers synchronously up to their first real
    wait, so calls that never wait cost no task. When one does wait, this generator hands the
    future it waits on to a new task and relays every later step, exception and cancellation, as
    ``await`` would.
    """
    while True:
        try:
            value = yield pending
        except BaseException as exc:  # noqa: B036 - relayed into the handler, like await does
            # this frame is in the error's traceback: it must not hold the future holding the error
            pending = None
            try:
                pending = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                pending = coro.send(value)
            except StopIteration as stop:
                return stop.value


class _Pulse:
    """When a call was received, for its deadline (the client's timeout counted from then).

    Received is when it is read, but for a process that did not run for a while (frozen by
    SIGSTOP, a paused VM): what it reads first after that may have waited in its socket all along,
    and is taken as received when the stall began. A meta server frozen for longer than a call's
    timeout made the call at its thaw, with the whole timeout still before it, after the client had
    given up on it, been told it failed, and gone on (a mkdir the client was told had timed out).
    The loop beats every PULSE_S; a beat STALL_S or more after the one before marks a stall, which
    counts until the next beat (libuv runs its timers before it reads, asyncio after)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.last = loop.time()
        self.stalled_from: float | None = None
        self._handle = loop.call_later(PULSE_S, self._beat)

    def _beat(self) -> None:
        now = self.loop.time()
        self.stalled_from = self.last if now - self.last >= STALL_S else None
        self.last = now
        self._handle = self.loop.call_later(PULSE_S, self._beat)

    def received(self) -> float:
        now = self.loop.time()
        if now - self.last >= STALL_S:  # a stall whose beat has not run yet
            return self.last
        return now if self.stalled_from is None else self.stalled_from

    def stop(self) -> None:
        self._handle.cancel()


class _WarnBudget:
    """Warnings about refused or malformed connections, at most ``burst`` per ``window_s`` per
    server; the rest are counted and said in one line when the next window opens. Anyone who can
    reach the port can cause them, one connection each: unlimited, 10,000 connections a second
    wrote ~400 KiB of log a second."""

    __slots__ = ("burst", "window_s", "_until", "_used", "_suppressed", "repeat_s", "_said")

    def __init__(self, burst: int = 100, window_s: float = 10.0, repeat_s: float = 60.0) -> None:
        self.burst = burst
        self.window_s = window_s
        self._until = 0.0
        self._used = 0
        self._suppressed = 0
        # the same warning about the same peer (a client whose token was revoked, retrying on and
        # on) is said once per repeat_s, the repeats counted with the rest
        self.repeat_s = repeat_s
        self._said = Repeats(repeat_s)

    def allow(self, what: object = None) -> bool:
        if what is not None and not self._said.due(what):
            self._suppressed += 1
            return False
        now = time.monotonic()
        if now >= self._until:
            if self._suppressed:
                log.warning(
                    "%d more warnings about refused or malformed connections in the last %.0f s "
                    "were not logged",
                    self._suppressed,
                    self.window_s,
                )
            self._until = now + self.window_s
            self._used = self._suppressed = 0
        if self._used < self.burst:
            self._used += 1
            return True
        self._suppressed += 1
        return False


class _ServerSession(FrameReceiver):
    """The server's side of one connection: handshake, then dispatch."""

    __slots__ = (
        "server",
        "conn",
        "loop",
        "identity",
        "user",
        "token",
        "ready",
        "_step",
        "_client_nonce",
        "_server_nonce",
        "_handshake_timer",
        "_verifying",
        "_recheck_at",
        "_tasks",
        "_task_key",
        "_handlers",
        "_pool",
        "_crc_flag",
        "_inflight",
        "_inflight_bytes",
        "_throttled",
        "_rejections",
        "_held",
        "_host",
    )

    def __init__(self, server: RpcServer, conn: Connection) -> None:
        self.server = server
        self.conn = conn
        self.loop = asyncio.get_running_loop()
        self.identity = ""
        # a user connection's user (mgmtd_pb2.User) and token; None and "" for a cluster member
        self.user: Any = None
        self.token = ""
        self.lost = False  # the connection ended (CallContext.closed)
        self._verifying: asyncio.Task[None] | None = None
        self._recheck_at = 0.0  # when a user connection's token is next asked about (loop time)
        self.ready = False
        self._step = auth.CLIENT_HELLO
        self._client_nonce = b""
        self._server_nonce = b""
        # calls running in tasks, by a key of ours (request ids may repeat): each call's _finish
        # removes its own entry, which costs less than a done callback (a loop callback per call)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._task_key = 0
        self._handlers = server._handlers
        self._pool = server.pool
        self._crc_flag = F_PAYLOAD_CRC if server.payload_crc else 0
        self._inflight = 0  # calls running in tasks, and the request payload bytes they hold
        self._inflight_bytes = 0
        self._throttled = False
        self._rejections = 0
        # a user connection's calls that wait for its token to be asked about again (see
        # _recheck_user): None while none is being asked about
        self._held: list[tuple[int, int, int, int, bytes, memoryview | None]] | None = None
        self._handshake_timer: asyncio.TimerHandle | None = self.loop.call_later(
            conn.limits.handshake_timeout_s, self._handshake_timeout
        )
        # Until the peer proves the secret, it gets no more than a handshake needs: an anonymous
        # peer must not make us allocate megabytes.
        conn.limits = _handshake_limits(conn.limits)
        server._sessions.add(self)
        self._pending = True  # counted in server._pending until authenticated or gone
        self._host = str(conn.peer).rpartition(":")[0]
        from_host = server._pending_hosts.get(self._host, 0)
        if server._pending >= server.max_handshaking:
            self.loop.call_soon(self._refuse, "too many connections not authenticated yet", True)
        elif from_host >= server.max_handshaking_per_host:
            self.loop.call_soon(
                self._refuse, "too many connections not authenticated yet from this host", True
            )
        server._pending += 1
        server._pending_hosts[self._host] = from_host + 1

    # ---- transport hooks ----------------------------------------------------------------------

    def alloc_payload(self, flags: int, request_id: int, length: int) -> memoryview:
        return memoryview(self._pool.acquire(length))[:length]

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
        if flags & F_REQUEST and self.ready:
            self._dispatch(request_id, service_id, method_id, timeout_ms, message, payload)
            return
        self._release(payload)
        if flags & F_HANDSHAKE and not self.ready and not flags & F_ERROR:
            self._handshake(method_id, message)
        elif not self.ready:
            self._refuse("frame before authentication")
        else:
            log.warning(
                "protocol violation, closing peer=%s reason=unexpected_frame flags=0x%02x",
                self.conn.peer,
                flags,
            )
            self._send_error(0, StatusCode.RPC_MALFORMED_FRAME, "a server accepts only requests")
            self.conn.close()

    def frame_error(self, error: FrameError) -> None:
        if self.server._warn.allow():
            log.warning(
                "bad frame peer=%s identity=%s code=%s request_id=%d fatal=%s reason=%r",
                self.conn.peer,
                self.identity,
                error.code.name,
                error.request_id,
                error.fatal,
                error.message,
            )
        if error.request_id:
            self._send_error(error.request_id, error.code, error.message)
        if error.fatal:
            # request id 0: the connection itself is going away, so the client stops using it now
            self._send_error(0, error.code, error.message)

    def _is_lost(self) -> bool:
        return self.lost

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if self._verifying is not None:
            self._verifying.cancel()
            self._verifying = None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.server._sessions.discard(self)
        self._not_pending()
        if self.user is not None:
            self.server._user_closed(self.user.uid)
        if not self.ready and self._step != -1 and self.server._warn.allow():
            # e.g. a client that found we do not share its secret; refused connections logged already
            log.warning("connection closed during handshake peer=%s error=%s", self.conn.peer, exc)
        log.debug("connection closed peer=%s identity=%s error=%s", self.conn.peer, self.identity, exc)

    # ---- handshake ----------------------------------------------------------------------------

    def _handshake(self, step: int, message: memoryview | bytes) -> None:
        if step != self._step:
            self._refuse(f"handshake step {step} where {self._step} was expected")
            return
        server = self.server
        try:
            if step == auth.CLIENT_HELLO:
                hello = rpc_pb2.ClientHello.FromString(message)
                if hello.version != auth.HANDSHAKE_VERSION:
                    self._refuse(f"handshake version {hello.version}")
                    return
                if (
                    len(hello.nonce) != auth.NONCE_BYTES
                    or len(hello.identity.encode()) > auth.MAX_IDENTITY_BYTES
                ):
                    self._refuse("malformed client hello")
                    return
                self.identity = hello.identity
                if hello.token:
                    self._user_hello(hello.token)
                    return
                self._client_nonce = hello.nonce
                self._server_nonce = auth.new_nonce()
                proof = auth.server_proof(
                    server._secret, self._client_nonce, self._server_nonce, self.identity
                )
                reply = rpc_pb2.ServerHello(
                    version=auth.HANDSHAKE_VERSION,
                    nonce=self._server_nonce,
                    proof=proof,
                    identity=server.identity,
                )
                self.conn.send_frame(F_HANDSHAKE, 0, 0, auth.SERVER_HELLO, reply.SerializeToString())
                self._step = auth.CLIENT_PROOF
            else:
                proof = rpc_pb2.ClientProof.FromString(message).proof
                expected = auth.client_proof(
                    server._secret, self._server_nonce, self._client_nonce, self.identity
                )
                if not auth.verify(expected, proof):
                    self._refuse("wrong cluster secret")
                    return
                self._authenticated()
        except DecodeError:
            self._refuse(f"unparsable handshake step {step}")

    def _not_pending(self) -> None:
        if self._pending:
            self._pending = False
            server = self.server
            server._pending -= 1
            left = server._pending_hosts[self._host] - 1
            if left:
                server._pending_hosts[self._host] = left
            else:
                del server._pending_hosts[self._host]

    def _authenticated(self) -> None:
        self._not_pending()
        self.ready = True
        self._step = 0
        self.conn.limits = self.server.limits
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        self.conn.peer_authenticated()  # RDMA: remote access may open now, not before
        self.conn.send_frame(F_HANDSHAKE, 0, 0, auth.AUTH_OK, b"")
        log.debug("authenticated peer=%s identity=%s", self.conn.peer, self.identity)

    def _user_hello(self, token: str) -> None:
        """A client authenticating with a user token: ask who it belongs to (the handshake timer
        still runs), then answer AUTH_OK or refuse."""
        verify = self.server.verify_user
        if verify is None:
            self._refuse("user token offered to a server that accepts cluster members only")
            return
        if len(token) > auth.MAX_TOKEN_CHARS:
            self._refuse("user token too long")
            return
        if self.conn.exposes_memory:
            # a user could reach other connections' in-flight exposures by guessing their keys
            self._refuse("user connections are taken over TCP only (RDMA keys are valid NIC-wide)")
            return
        server = self.server
        host = self.conn.peer.rpartition(":")[0]
        if server._refused_too_often(host, token):
            # a peer trying made-up tokens: it costs mgmtd nothing more for a while
            # as busy (retried): the host's other users, whose new tokens wait out the flood,
            # were told their token failed
            self._refuse("too many refused user tokens from this host", True)
            return
        if server._user_checks >= server.max_user_checks:
            # each check may cost mgmtd a call (a new token, or one refused over a few seconds
            # ago): a flood of made-up tokens waits on the handshake timeout, not on mgmtd
            self._refuse("too many user tokens being checked", True)
            return
        self._step = -2  # any handshake frame before the answer is a protocol violation
        server._user_checks += 1

        async def check() -> None:
            try:
                user = await verify(token)
            except asyncio.CancelledError:
                raise
            except FS3Error as e:
                self._verifying = None
                uid = token.split(".")[1][:10] if token.count(".") >= 2 else "?"
                if e.code == StatusCode.UNAUTHENTICATED:
                    server._note_refusal(host)
                    self._refuse(f"user token of uid {uid} refused: {e.message}")
                else:
                    # mgmtd did not answer: not the token's fault, and a try later may pass (what
                    # mgmtd's client said is for this server's log, not for whoever connects)
                    self._refuse(
                        f"user token of uid {uid} not verified now: {e.message}",
                        True,
                        told="the user token cannot be verified now (mgmtd does not answer)",
                    )
                return
            except Exception as e:  # a bug in the verifier: refuse, and say so
                self._verifying = None
                log.exception("verifying a user token failed peer=%s", self.conn.peer)
                self._refuse(f"user token not verified: {type(e).__name__}", told="user token not verified")
                return
            self._verifying = None
            if self.conn.is_closing or self._step != -2:
                return
            if not server._user_opened(user.uid):
                self._refuse(
                    f"uid {user.uid} has {server.max_user_connections} connections open to this "
                    "server already (max_user_connections)"
                )
                return
            self.user = user
            self.token = token
            server._note_accepted(token)
            self.identity = f"{self.identity} (uid {user.uid})"
            self._recheck_at = self.loop.time() + server.user_recheck_s
            self._authenticated()

        def checked(_task: asyncio.Task[None]) -> None:
            server._user_checks -= 1

        self._verifying = self.loop.create_task(check())
        self._verifying.add_done_callback(checked)

    def _recheck_user(self) -> bool:
        """Ask again whom a user connection's token belongs to (it may have been revoked or have
        expired since the handshake), and close the connection if it belongs to nobody now. The
        calls that come meanwhile wait for the answer (``_held``), USER_RECHECK_HOLD_S at most;
        an unreachable mgmtd changes nothing. Returns whether a check began (not: one is still
        under way)."""
        verify = self.server.verify_user
        self._recheck_at = self.loop.time() + self.server.user_recheck_s
        if self._verifying is not None or verify is None:
            return False

        async def recheck() -> None:
            revoked = False
            try:
                await verify(self.token)
            except asyncio.CancelledError:
                revoked = True  # the connection is going: nothing held is served
                raise
            except FS3Error as e:
                if e.code == StatusCode.UNAUTHENTICATED:
                    revoked = True
                    if not self.conn.is_closing:
                        log.warning(
                            "closing user connection peer=%s identity=%s reason=%r",
                            self.conn.peer,
                            self.identity,
                            e.message,
                        )
                        self._send_error(
                            0, StatusCode.RPC_AUTH_FAILED, f"user token no longer valid: {e.message}"
                        )
                        self.conn.close()
            except Exception:  # a bug in the verifier: keep serving, and say so
                log.exception("checking a user token again failed peer=%s", self.conn.peer)
            finally:
                self._verifying = None
                held = self._held
                if held is not None:
                    if revoked:
                        self._held = None
                        for call in held:
                            self._release(call[5])
                    else:
                        self._serve_held(held)

        self._verifying = self.loop.create_task(recheck())
        return True

    def _serve_held(self, held: list[tuple[int, int, int, int, bytes, memoryview | None]]) -> None:
        """Serve the calls ``held`` for a recheck (if they still are: once its answer came, or
        USER_RECHECK_HOLD_S passed), and read again."""
        if self._held is not held:
            return  # served already, or dropped with the connection
        self._held = None
        for call in held:
            if self.conn.is_closing:
                self._release(call[5])
            else:
                self._dispatch(*call)
        if not self._throttled and not self.conn.is_closing:
            self.conn.pause_receiving(False)

    def _handshake_timeout(self) -> None:
        self._handshake_timer = None
        if not self.ready:
            self._refuse("handshake timeout")

    def _refuse(self, reason: str, busy: bool = False, told: str | None = None) -> None:
        """Refuse the connection for ``reason`` (logged, within the warning budget), told to the
        client (``told`` instead where the reason holds what only this server's log should) as
        RPC_AUTH_FAILED, or as UNAVAILABLE where the server is ``busy`` (too many handshakes,
        mgmtd away), which clients retry, rather than as a refusal of their credentials. (Told
        only "authentication failed", a user whose token a meta without authentication refused
        was sent to get a new token.)"""
        told = reason if told is None else told
        # keyed by the peer's host too: the identity is whatever the client says
        if self.server._warn.allow((str(self.conn.peer).rpartition(":")[0], self.identity, reason)):
            log.warning(
                "refusing connection peer=%s identity=%s reason=%r",
                self.conn.peer,
                self.identity or "-",
                reason,
            )
        self.ready = False
        self._step = -1
        if not self.conn.is_closing:
            self.conn.send_frame(
                F_HANDSHAKE | F_ERROR,
                0,
                0,
                0,
                error_message(StatusCode.UNAVAILABLE, f"server busy: {told}; try again")
                if busy
                else error_message(StatusCode.RPC_AUTH_FAILED, f"authentication failed: {told}"),
            )
            self.conn.close()

    # ---- dispatch -----------------------------------------------------------------------------

    def _dispatch(
        self,
        request_id: int,
        service_id: int,
        method_id: int,
        timeout_ms: int,
        message: memoryview | bytes,
        payload: memoryview | None,
    ) -> None:
        if self.user is not None:
            held = self._held
            if held is None and self.loop.time() >= self._recheck_at and self._recheck_user():
                held = self._held = []
                # no more is read meanwhile: held calls are not counted as running ones, whose
                # payloads pause reading past a bound
                self.conn.pause_receiving(True)
                self.loop.call_later(USER_RECHECK_HOLD_S, self._serve_held, held)
            if held is not None:
                # the token is being asked about again: served once it is still someone's (a
                # revoked user's calls on a connection idle past the recheck were all served, a
                # burst of writes up to his capabilities' expiry, before the check closed it)
                held.append((request_id, service_id, method_id, timeout_ms, bytes(message), payload))
                return
        entry = self._handlers.get((service_id << 16) | method_id)
        if entry is None:
            if service_id in self.server._services:
                code, what = (
                    StatusCode.RPC_UNKNOWN_METHOD,
                    f"unknown method {method_id} of service {service_id}",
                )
            else:
                code, what = StatusCode.RPC_UNKNOWN_SERVICE, f"unknown service {service_id}"
            self._log_rejection(
                "rejecting call peer=%s request_id=%d reason=%r", self.conn.peer, request_id, what
            )
            self._send_error(request_id, code, what)
            self._release(payload)
            return
        method, handler, run_inline = entry
        if self.server._stopping:
            # stop() has cancelled what was running and is closing connections: a call started
            # now would outlive it
            self._send_error(request_id, *_SHUTTING_DOWN)
            self._release(payload)
            return
        try:
            request = method.request.FromString(message)
        except DecodeError as e:
            self._log_rejection(
                "rejecting call peer=%s method=%s request_id=%d reason=unparsable_message error=%r",
                self.conn.peer,
                method.full_name,
                request_id,
                str(e),
            )
            self._send_error(
                request_id, StatusCode.RPC_BAD_MESSAGE, f"cannot parse {method.request.__name__}"
            )
            self._release(payload)
            return
        if timeout_ms:
            pulse = self.server._pulse
            deadline = (pulse.received() if pulse is not None else self.loop.time()) + timeout_ms / 1000
        else:
            deadline = None
        ctx = CallContext(
            self.conn.peer, self.identity, request_id, method, deadline, self.user, self.token, self._is_lost
        )
        try:
            coro = handler(request, payload, ctx)
        except Exception as exc:  # a handler that is not a coroutine function after all
            self._reply_exception(request_id, method, exc, payload)
            return
        if not run_inline:
            self._start_task(request_id, method, coro, payload)
            return
        try:
            pending = coro.send(None)
        except StopIteration as stop:
            self._reply(request_id, method, stop.value, payload)
            return
        except Exception as exc:
            self._reply_exception(request_id, method, exc, payload)
            return
        self._start_task(request_id, method, _resume(coro, pending), payload)

    def _log_rejection(self, fmt: str, *args: object) -> None:
        # A confused client can send a stream of bad calls; its first few are worth a warning each,
        # the rest would only flood the log.
        self._rejections += 1
        if self._rejections <= _WARN_REJECTIONS:
            log.warning(fmt, *args)
            if self._rejections == _WARN_REJECTIONS:
                log.warning("further rejected calls logged at debug level peer=%s", self.conn.peer)
        else:
            log.debug(fmt, *args)

    def _start_task(self, request_id: int, method: Method, aw: Any, payload: memoryview | None) -> None:
        key = self._task_key = self._task_key + 1
        # the task's first step runs later, so its entry is in place before _finish can remove it
        self._tasks[key] = self.loop.create_task(self._finish(key, request_id, method, aw, payload))
        self._inflight += 1
        if payload is not None:
            self._inflight_bytes += payload.nbytes
        limits = self.server.limits
        if not self._throttled and (
            self._inflight >= limits.max_inflight_calls
            or self._inflight_bytes >= limits.max_inflight_payload_bytes
        ):
            # Let the client's sends back up in its socket rather than in our memory.
            self._throttled = True
            self.conn.pause_receiving(True)
            log.info(
                "throttling connection peer=%s calls=%d payload_bytes=%d",
                self.conn.peer,
                self._inflight,
                self._inflight_bytes,
            )

    def _call_done(self, payload: memoryview | None) -> None:
        self._inflight -= 1
        if payload is not None:
            self._inflight_bytes -= payload.nbytes
        if self._throttled:
            limits = self.server.limits
            if (
                self._inflight <= limits.max_inflight_calls // 2
                and self._inflight_bytes <= limits.max_inflight_payload_bytes // 2
            ):
                self._throttled = False
                if self._held is None:  # else reading resumes once the held calls are served
                    self.conn.pause_receiving(False)

    async def _finish(
        self, key: int, request_id: int, method: Method, aw: Any, payload: memoryview | None
    ) -> None:
        try:
            if self.server._stopping:
                # stop() came before this task's first step and left the call to it (see
                # cancel_calls); it ends as the calls stop() cuts short, answered UNAVAILABLE
                if inspect.iscoroutine(aw):
                    aw.close()  # a handler not started yet: it never starts, as in _dispatch
                    raise asyncio.CancelledError
                # an inline handler, started already: cancelled at its next wait
                asyncio.current_task().cancel()  # type: ignore[union-attr]
            result = await aw
        except asyncio.CancelledError as exc:
            self._reply_exception(request_id, method, exc, payload)
            raise
        except Exception as exc:
            self._reply_exception(request_id, method, exc, payload)
        else:
            self._reply(request_id, method, result, payload)
        finally:
            del self._tasks[key]
            self._call_done(payload)

    def _reply(
        self, request_id: int, method: Method, result: HandlerResult, req_payload: memoryview | None
    ) -> None:
        done: Callable[[], None] | None = None
        if type(result) is tuple:
            if len(result) == 2:
                response, out = result
            else:
                response, out, done = result
        else:
            response, out = result, None
        self._send_reply(request_id, method, response, out, req_payload, done)

    def _send_reply(
        self,
        request_id: int,
        method: Method,
        response: Any,
        out: Any,
        req_payload: memoryview | None,
        done: Callable[[], None] | None,
    ) -> None:
        """Send the reply; ``done`` (see HandlerResult) is called once ``out`` has left, or at once
        where the reply fails. (Where the connection is closed it is never called: its memory is
        simply not reused.)"""
        if type(response) is not method.response:
            log.error(
                "handler returned the wrong type method=%s returned=%s expected=%s",
                method.full_name,
                type(response).__name__,
                method.response.__name__,
            )
            self._send_error(request_id, StatusCode.INTERNAL, f"{method.full_name} returned a bad response")
            self._release(req_payload)
            if done is not None:
                done()
            return
        try:
            message = response.SerializeToString()
            size = 0 if out is None else memoryview(out).nbytes
        except Exception as exc:  # e.g. a payload that is not bytes-like
            self._reply_exception(request_id, method, exc, req_payload)
            if done is not None:
                done()
            return
        limits = self.conn.limits
        if size > limits.max_payload_bytes or len(message) > limits.max_message_bytes:
            self._send_error(
                request_id,
                StatusCode.RPC_FRAME_TOO_LARGE,
                f"reply of {len(message)} + {size} bytes exceeds the limits",
            )
            self._release(req_payload)
            if done is not None:
                done()
            return
        on_sent = done
        if req_payload is not None:
            # The reply may be (a view of) the request payload: recycle it only once it has left.
            pool, buf = self._pool, req_payload.obj
            if done is None:
                on_sent = lambda: pool.release(buf)  # noqa: E731
            else:
                on_sent = lambda: (pool.release(buf), done())  # type: ignore[func-returns-value]  # noqa: E731
        try:
            self.conn.send_frame(
                F_RESPONSE | (self._crc_flag if out is not None else 0),
                request_id,
                method.service_id,
                method.id,
                message,
                out,
                0,
                on_sent,
            )
        except FS3Error:
            log.debug("reply dropped, connection closed peer=%s request_id=%d", self.conn.peer, request_id)

    def _reply_exception(
        self, request_id: int, method: Method, exc: BaseException, req_payload: memoryview | None
    ) -> None:
        if self.server._stopping and (
            isinstance(exc, asyncio.CancelledError)
            or (isinstance(exc, FS3Error) and exc.code == StatusCode.CANCELLED)
        ):
            # Cancelled by stop() (a graceful restart): the client may retry, here once this
            # server is back or elsewhere, as it would after a lost connection.
            code, message = _SHUTTING_DOWN
        elif isinstance(exc, FS3Error):
            code, message = exc.code, exc.message
        elif isinstance(exc, asyncio.CancelledError):
            code, message = StatusCode.CANCELLED, "call cancelled by the server"
        else:
            log.error(
                "handler failed method=%s peer=%s request_id=%d",
                method.full_name,
                self.conn.peer,
                request_id,
                exc_info=exc,
            )
            code, message = StatusCode.INTERNAL, f"{method.full_name}: {type(exc).__name__}: {exc}"
        self._send_error(request_id, code, message)
        self._release(req_payload)

    def _send_error(self, request_id: int, code: int, message: str) -> None:
        if self.conn.is_closing:
            return
        self.conn.send_frame(F_RESPONSE | F_ERROR, request_id, 0, 0, error_message(code, message))

    def _release(self, payload: memoryview | None) -> None:
        if payload is not None:
            self._pool.release(payload.obj)  # type: ignore[arg-type]

    def cancel_calls(self) -> None:
        for task in list(self._tasks.values()):
            # A task cancelled before its first step ends without running its coroutine at all:
            # no reply, no cleanup, a handler never awaited. One not started yet cancels itself
            # when it starts (see _finish).
            if inspect.getcoroutinestate(task.get_coro()) != inspect.CORO_CREATED:
                task.cancel()


class RpcServer:
    """Serves registered services to authenticated fs3 RPC clients.

    ``secret`` is the cluster secret (≥ 16 bytes); ``identity`` names this server in handshakes and
    logs; ``payload_crc`` makes replies carry a CRC32C of their payload (checked by the receiver).
    ``verify_user`` (``async (token) -> mgmtd_pb2.User``, raising FS3Error for a bad token) admits
    *user connections*, clients that offer a user token instead of proving the secret; handlers see
    their user in ``CallContext.user``; the token is checked again every ``user_recheck_s`` while
    the connection is used, and the connection closed once it is refused. Without it, such
    clients are refused.
    The system service (:mod:`fs3.net.system`: Ping, Echo, Sink, Source) is always registered.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        identity: str = "server",
        transport: Transport | None = None,
        limits: RpcLimits = DEFAULT_LIMITS,
        pool: BufferPool | None = None,
        payload_crc: bool = False,
        verify_user: Callable[[str], Awaitable[Any]] | None = None,
    ) -> None:
        self._secret = auth.check_secret(secret)
        self.verify_user = verify_user
        # user tokens being checked at once, and the most (more handshakes are refused)
        self._user_checks = 0
        self.max_user_checks = 64
        self.user_recheck_s = USER_RECHECK_S
        # A host whose peers had this many tokens refused within the window gets its further
        # unknown tokens refused unasked until the window passes (tokens this server accepted
        # lately still get in: a user sharing that host is not locked out).
        self.max_user_refusals = 20
        self.user_refusal_window_s = 10.0
        self._refusals: dict[str, list[float]] = {}  # host -> loop times of recent refusals
        # User connections open per uid, and the most one uid may hold: each costs a descriptor
        # and ~20 KB, and a user token's holder filled meta's 20,000 descriptors with idle ones
        # (every new connection was refused then, cluster members' included).
        self._user_conns: dict[int, int] = {}
        self.max_user_connections = MAX_USER_CONNECTIONS
        # Connections not authenticated yet, and the most at once (more are closed at once, and
        # unlogged beyond the warning budget): each holds a descriptor until its handshake timeout.
        self.max_handshaking = MAX_HANDSHAKING
        self.max_handshaking_per_host = MAX_HANDSHAKING_PER_HOST
        self._pending = 0
        self._pending_hosts: dict[str, int] = {}  # host -> its connections not authenticated yet
        self._warn = _WarnBudget()
        self._accepted: dict[str, float] = {}  # token -> until when it skips the limit (loop time)
        self.identity = identity
        self.transport = transport or TcpTransport()
        self.limits = limits
        self.pool = pool or default_pool()
        self.payload_crc = payload_crc
        self._services: dict[int, ServiceDef] = {}
        self._handlers: dict[int, tuple[Method, Handler, bool]] = {}
        self._sessions: set[_ServerSession] = set()
        self._listener: Listener | None = None
        self._pulse: _Pulse | None = None
        self._stopping = False
        self.add_service(SYSTEM_SERVICE, SystemService(identity, limits))

    def _user_opened(self, uid: int) -> bool:
        n = self._user_conns.get(uid, 0)
        if n >= self.max_user_connections:
            return False
        self._user_conns[uid] = n + 1
        return True

    def _user_closed(self, uid: int) -> None:
        n = self._user_conns.get(uid, 0) - 1
        if n > 0:
            self._user_conns[uid] = n
        else:
            self._user_conns.pop(uid, None)

    def _refused_too_often(self, host: str, token: str) -> bool:
        now = asyncio.get_running_loop().time()
        if self._accepted.get(token, 0.0) > now:
            return False
        times = self._refusals.get(host)
        if not times:
            return False
        times[:] = [t for t in times if t > now - self.user_refusal_window_s]
        return len(times) >= self.max_user_refusals

    def _note_refusal(self, host: str) -> None:
        if len(self._refusals) >= 10_000:
            self._refusals.clear()
        times = self._refusals.setdefault(host, [])
        times.append(asyncio.get_running_loop().time())
        del times[: -self.max_user_refusals]

    def _note_accepted(self, token: str) -> None:
        if len(self._accepted) >= 10_000:
            self._accepted.clear()
        self._accepted[token] = asyncio.get_running_loop().time() + 600.0

    def add_service(self, service: ServiceDef, handlers: Mapping[str, Handler] | object) -> None:
        """Register handlers for every method of ``service``.

        ``handlers`` maps method names to ``async def handler(request, payload, ctx)``, or is an
        object whose attributes are the handlers, named like the methods or in snake_case
        (``Stat`` -> ``stat``, ``BatchRead`` -> ``batch_read``).
        """
        if service.id in self._services and self._services[service.id] is not service:
            raise ValueError(
                f"service id {service.id} already registered as {self._services[service.id].name}"
            )
        table: dict[int, tuple[Method, Handler, bool]] = {}
        for method in service:
            if isinstance(handlers, Mapping):
                fn = handlers.get(method.name)
            else:
                fn = getattr(handlers, method.name, None) or getattr(handlers, _snake(method.name), None)
            if fn is None:
                raise ValueError(f"no handler for {method.full_name}")
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"handler for {method.full_name} must be an async function")
            table[(service.id << 16) | method.id] = (method, fn, getattr(fn, INLINE_ATTR, False))
        self._services[service.id] = service
        self._handlers.update(table)

    async def start(self, address: str | Address = ("127.0.0.1", 0)) -> Address:
        """Listen on ``address`` and return the bound address (port 0 picks a free port)."""
        if self._listener is not None:
            raise RuntimeError("server already started")
        self._stopping = False
        self._listener = await self.transport.listen(
            parse_address(address), lambda conn: _ServerSession(self, conn), limits=self.limits
        )
        log.info("listening address=%s:%d identity=%s", *self._listener.address, self.identity)
        self._pulse = _Pulse(asyncio.get_running_loop())
        return self._listener.address

    @property
    def address(self) -> Address:
        """The bound address (after :meth:`start`)."""
        if self._listener is None:
            raise RuntimeError("server not started")
        return self._listener.address

    @property
    def connection_count(self) -> int:
        """Open connections, authenticated or not."""
        return len(self._sessions)

    async def stop(self) -> None:
        """Stop accepting, cancel calls in progress, and close every connection. Calls cancelled
        here, and calls that arrive meanwhile, are answered UNAVAILABLE ("server shutting down"),
        which clients retry. Queued replies go out first, for up to ``CLOSE_GRACE_S``; a client
        not reading them by then (a stopped process) has its connection aborted."""
        self._stopping = True
        if self._pulse is not None:
            self._pulse.stop()
            self._pulse = None
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()
            self._listener = None
        sessions = list(self._sessions)
        tasks = [t for s in sessions for t in s._tasks.values()]
        for s in sessions:
            s.cancel_calls()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # the replies queued (those to the calls just cancelled too) go out first, unless the
        # client is not reading them (a stopped process): it would hold us
        await close_connections([s.conn for s in sessions], "client")

    async def __aenter__(self) -> RpcServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))
