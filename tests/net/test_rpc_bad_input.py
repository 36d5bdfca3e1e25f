"""A server fed garbage answers with an error or closes that one connection, logs why, and keeps
serving everyone else (DESIGN §10). Driven with raw sockets against a server in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest
import rpcwire
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpc_fixtures import TEST_LIMITS, ThreadedServer

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient
from fs3.net.frame import (
    F_ERROR,
    F_HANDSHAKE,
    F_PAYLOAD_CRC,
    F_REQUEST,
    F_RESPONSE,
    HEADER_SIZE,
    encode_header,
)
from fs3.net.system import ECHO, PING
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(120)

HYPOTHESIS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def valid_frames() -> list[bytes]:
    """A few well-formed requests to mutate."""
    return [
        rpcwire.frame(F_REQUEST, 1, 0, PING.id, b""),
        rpcwire.frame(
            F_REQUEST, 2, 0, ECHO.id, rpc_pb2.EchoRequest(data=b"abc").SerializeToString(), b"x" * 100
        ),
        rpcwire.frame(F_REQUEST, 3, 0, ECHO.id, b"", b"y" * 5000, timeout_ms=1000),
    ]


def check_healthy(ts: ThreadedServer) -> None:
    assert ts.ping().identity == "threaded"
    assert not ts.loop_errors, ts.loop_errors


def send_and_close(ts: ThreadedServer, data: bytes, authenticate: bool) -> bytes:
    """Send ``data`` (after a handshake if asked), half-close, and return what the server answers
    until it closes or goes quiet."""
    with rpcwire.connect(ts.address) as sock:
        if authenticate:
            rpcwire.handshake(sock)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        try:
            # the server answers, then closes when it sees our EOF or bad input, or stays open
            # waiting for the rest of an incomplete frame until the frame timeout
            return rpcwire.wait_closed(sock, timeout=TEST_LIMITS.frame_timeout_s + 3)
        except TimeoutError:
            return b"<still open>"


@HYPOTHESIS
@given(data=st.binary(min_size=1, max_size=4096), authenticate=st.booleans())
def test_random_bytes(threaded_server: ThreadedServer, data: bytes, authenticate: bool) -> None:
    out = send_and_close(threaded_server, data, authenticate)
    assert out != b"<still open>"
    for hdr, _ in rpcwire.parse_frames(out):
        assert hdr[0] & F_RESPONSE or hdr[0] & F_ERROR  # only replies and errors ever come back
    check_healthy(threaded_server)


@HYPOTHESIS
@given(
    which=st.integers(0, 2),
    mutations=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_mutated_and_truncated_frames(
    threaded_server: ThreadedServer, which: int, mutations: list[tuple[int, int]], cut: int | None
) -> None:
    good = bytearray(valid_frames()[which])
    for pos, value in mutations:
        good[pos % len(good)] = value
    if cut is not None:
        good = good[: cut % (len(good) + 1)]
    out = send_and_close(threaded_server, bytes(good), authenticate=True)
    assert out != b"<still open>"
    check_healthy(threaded_server)


def test_valid_frames_after_handshake_are_answered(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        for f in valid_frames():
            sock.sendall(f)
        replies = [rpcwire.read_frame(sock) for _ in range(3)]
    assert [h[1] for h, _, _ in replies] == [1, 2, 3]
    assert replies[1][2] == b"x" * 100 and replies[2][2] == b"y" * 5000


def error_reply(sock: socket.socket) -> tuple[int, int, str]:
    hdr, message, _ = rpcwire.read_frame(sock)
    assert hdr[0] & F_ERROR
    status = rpcwire.read_status(message)
    return hdr[1], status.code, status.message


def test_length_of_2_pow_63_is_refused(
    threaded_server: ThreadedServer, caplog: pytest.LogCaptureFixture
) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(encode_header(F_REQUEST, 77, 0, ECHO.id, 0, 1 << 63) + b"a" * 1000)
        rid, code, message = error_reply(sock)
        assert (rid, code) == (77, StatusCode.RPC_FRAME_TOO_LARGE) and "exceeds" in message
        rid, code, _ = error_reply(sock)  # and the connection-level notice that it is closing
        assert (rid, code) == (0, StatusCode.RPC_FRAME_TOO_LARGE)
        rpcwire.wait_closed(sock)
    check_healthy(threaded_server)
    assert any("RPC_FRAME_TOO_LARGE" in r.getMessage() for r in caplog.records)


def test_message_length_beyond_limit_is_refused(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(encode_header(F_REQUEST, 5, 0, ECHO.id, 0xFFFFFFFF, 0))
        assert error_reply(sock)[:2] == (5, StatusCode.RPC_FRAME_TOO_LARGE)
        rpcwire.wait_closed(sock)
    check_healthy(threaded_server)


def test_bad_magic_closes_with_malformed_frame(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * HEADER_SIZE)
        assert error_reply(sock)[:2] == (0, StatusCode.RPC_MALFORMED_FRAME)
        rpcwire.wait_closed(sock)
    check_healthy(threaded_server)


def test_unparsable_protobuf_fails_only_that_call(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(rpcwire.frame(F_REQUEST, 9, 0, ECHO.id, b"\xff\xff\xff\xff\x0f", b"payload"))
        assert error_reply(sock)[:2] == (9, StatusCode.RPC_BAD_MESSAGE)
        sock.sendall(rpcwire.frame(F_REQUEST, 10, 0, PING.id, b""))
        hdr, message, _ = rpcwire.read_frame(sock)
        assert hdr[1] == 10 and not hdr[0] & F_ERROR
        assert rpc_pb2.PingResponse.FromString(message).identity == "threaded"


def test_unknown_service_and_method_fail_only_that_call(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(rpcwire.frame(F_REQUEST, 1, 4242, 1, b""))
        sock.sendall(rpcwire.frame(F_REQUEST, 2, 0, 4242, b"", b"some payload"))
        sock.sendall(rpcwire.frame(F_REQUEST, 3, 0, PING.id, b""))
        assert error_reply(sock)[:2] == (1, StatusCode.RPC_UNKNOWN_SERVICE)
        assert error_reply(sock)[:2] == (2, StatusCode.RPC_UNKNOWN_METHOD)
        hdr, _, _ = rpcwire.read_frame(sock)
        assert hdr[1] == 3 and not hdr[0] & F_ERROR


def test_response_frame_sent_to_a_server_closes_the_connection(threaded_server: ThreadedServer) -> None:
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(rpcwire.frame(F_RESPONSE, 1, 0, PING.id, b""))
        assert error_reply(sock)[1] == StatusCode.RPC_MALFORMED_FRAME
        rpcwire.wait_closed(sock)
    check_healthy(threaded_server)


@pytest.mark.parametrize("stop_after", [1, HEADER_SIZE - 1, HEADER_SIZE + 3, HEADER_SIZE + 5000])
def test_client_that_never_finishes_its_frame_is_disconnected(
    threaded_server: ThreadedServer, stop_after: int, caplog: pytest.LogCaptureFixture
) -> None:
    f = rpcwire.frame(
        F_REQUEST, 1, 0, ECHO.id, rpc_pb2.EchoRequest(data=b"abcdef").SerializeToString(), b"z" * 9000
    )
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        sock.sendall(f[:stop_after])
        start = time.monotonic()
        # no EOF from us: the server must give up on its own after the frame timeout
        rpcwire.wait_closed(sock, timeout=TEST_LIMITS.frame_timeout_s + 5)
        assert time.monotonic() - start >= TEST_LIMITS.frame_timeout_s * 0.9
    check_healthy(threaded_server)
    assert any("incomplete" in r.getMessage() for r in caplog.records)


def test_many_bad_clients_at_once_do_not_disturb_a_good_one(threaded_server: ThreadedServer) -> None:
    socks = []
    try:
        for i in range(20):
            s = rpcwire.connect(threaded_server.address)
            s.sendall(bytes([i]) * (i * 7 + 1))  # never authenticated, never finished
            socks.append(s)
        for _ in range(5):
            check_healthy(threaded_server)
    finally:
        for s in socks:
            s.close()


def test_payload_crc_mismatch_fails_only_that_call(threaded_server: ThreadedServer) -> None:
    payload = b"p" * 3000
    good_crc = crc32c(payload)
    with rpcwire.connect(threaded_server.address) as sock:
        rpcwire.handshake(sock)
        for rid, crc in ((1, good_crc ^ 1), (2, good_crc)):
            head = encode_header(F_REQUEST | F_PAYLOAD_CRC, rid, 0, ECHO.id, 0, len(payload), 0, crc)
            sock.sendall(head + payload)
        assert error_reply(sock)[:2] == (1, StatusCode.RPC_MALFORMED_FRAME)
        hdr, _, echoed = rpcwire.read_frame(sock)
        assert hdr[1] == 2 and echoed == payload


def test_anonymous_peers_get_small_limits(threaded_server: ThreadedServer) -> None:
    # Before the handshake, a frame may not even announce a payload or a large message.
    for head in (
        encode_header(F_HANDSHAKE, 0, 0, 1, 0, 1 << 20),
        encode_header(F_HANDSHAKE, 0, 0, 1, 1 << 20, 0),
    ):
        with rpcwire.connect(threaded_server.address) as sock:
            sock.sendall(head)
            assert error_reply(sock)[1] == StatusCode.RPC_FRAME_TOO_LARGE
            rpcwire.wait_closed(sock)
    check_healthy(threaded_server)


@contextlib.asynccontextmanager
async def misbehaving_server(script: bytes, complete_handshake: bool) -> AsyncIterator[tuple[str, int]]:
    """A fake server that authenticates properly (or not), then sends ``script`` and hangs up."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if complete_handshake:
                await rpcwire.accept_handshake(reader, writer)
                await reader.readexactly(HEADER_SIZE)  # the client's first request
            writer.write(script)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2]
    finally:
        server.close()


@pytest.mark.parametrize(
    ("script", "complete_handshake", "codes"),
    [
        (b"\x00" * 100, True, {StatusCode.RPC_CONNECTION_CLOSED}),
        (encode_header(F_RESPONSE, 1, 0, 1, 0, 1 << 63), True, {StatusCode.RPC_CONNECTION_CLOSED}),
        (encode_header(F_RESPONSE, 1, 0, 1, 10, 0) + b"\xff" * 10, True, {StatusCode.RPC_BAD_MESSAGE}),
        (encode_header(F_REQUEST, 1, 0, 1, 0, 0), True, {StatusCode.RPC_CONNECTION_CLOSED}),
        (encode_header(F_RESPONSE, 1, 0, 1, 100, 0)[:30], True, {StatusCode.RPC_CONNECTION_CLOSED}),
        (
            b"garbage instead of a hello",
            False,
            {StatusCode.RPC_CONNECTION_CLOSED, StatusCode.RPC_MALFORMED_FRAME},
        ),
    ],
    ids=["zeros", "huge-length", "bad-protobuf", "request-to-client", "truncated", "no-handshake"],
)
async def test_client_survives_a_misbehaving_server(
    script: bytes, complete_handshake: bool, codes: set[StatusCode]
) -> None:
    async with (
        misbehaving_server(script, complete_handshake) as address,
        RpcClient(rpcwire.SECRET, limits=TEST_LIMITS, connect_timeout=2) as client,
    ):
        with pytest.raises(FS3Error) as e:
            await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        assert e.value.code in codes, e.value


async def test_client_gives_up_on_a_server_that_never_answers_the_handshake() -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    address = server.sockets[0].getsockname()[:2]
    try:
        async with RpcClient(rpcwire.SECRET, connect_timeout=0.3) as client:
            with pytest.raises(FS3Error) as e:
                await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
            assert e.value.code == StatusCode.RPC_CONNECT_FAILED and e.value.retryable
            # a call with a shorter deadline than the connect timeout fails on its own deadline
            async with RpcClient(rpcwire.SECRET, connect_timeout=5) as slow:
                with pytest.raises(FS3Error) as e:
                    await slow.call(address, PING, rpc_pb2.PingRequest(), timeout=0.2)
                assert e.value.code == StatusCode.DEADLINE_EXCEEDED
    finally:
        release.set()
        server.close()


def test_warnings_about_bad_connections_are_limited(
    threaded_server: ThreadedServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who reaches the port can make a server warn, once per connection: at most a burst
    of such warnings per window is logged, the rest counted in one line (10,000 garbage
    connections a second wrote ~400 KiB of log a second). The server serves on."""
    from fs3.net.server import _WarnBudget

    assert threaded_server.server is not None
    threaded_server.server._warn = _WarnBudget(burst=3, window_s=0.5)  # noqa: SLF001
    caplog.clear()
    for _ in range(12):
        with rpcwire.connect(threaded_server.address) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))
            rpcwire.wait_closed(sock)
    warned = [r for r in caplog.records if r.name == "fs3.net.server" and r.levelname == "WARNING"]
    assert 1 <= len(warned) <= 3, [r.getMessage() for r in warned]
    time.sleep(0.6)
    with rpcwire.connect(threaded_server.address) as sock:
        sock.sendall(bytes(64))
        rpcwire.wait_closed(sock)
    assert any("were not logged" in r.getMessage() for r in caplog.records)
    check_healthy(threaded_server)


def test_the_same_refusal_of_the_same_peer_is_said_once_a_minute() -> None:
    """A client whose token was revoked retries on and on: its refusal was logged twice a second
    by every server it reached (452 lines in a few minutes on meta); now once per repeat_s, the
    repeats counted in the window's summary line."""
    from fs3.net.server import _WarnBudget

    budget = _WarnBudget(burst=100, window_s=0.2, repeat_s=60.0)
    refusal = ("client-1", "user token of uid 1000 refused: invalid or expired token")
    assert budget.allow(refusal)
    assert not any(budget.allow(refusal) for _ in range(50))
    assert budget.allow(("client-2", refusal[1]))  # another peer: said
    assert budget.allow(("client-1", "handshake timeout"))  # another reason: said
    time.sleep(0.25)
    assert budget.allow()  # the window's summary counts the 50 repeats
    assert not budget.allow(refusal)


async def test_a_token_client_told_by_a_server_that_takes_no_tokens_says_so() -> None:
    """A server from before user connections answers a token's hello as a member's (a server
    hello): the client said only 'unexpected handshake step 2'."""

    async def old_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await rpcwire.accept_handshake(reader, writer)
        writer.close()

    server = await asyncio.start_server(old_server, "127.0.0.1", 0)
    address = server.sockets[0].getsockname()[:2]
    try:
        async with RpcClient(None, token="fs3u.1.x", connect_timeout=2) as client:
            with pytest.raises(FS3Error) as e:
                await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        assert e.value.code == StatusCode.RPC_AUTH_FAILED
        assert "does not take user tokens (an fs3 older than this client?" in e.value.message, e.value
    finally:
        server.close()
