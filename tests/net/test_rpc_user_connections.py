"""User connections: a client without the cluster secret authenticates with a user token, which the
server verifies (its ``verify_user``); handlers see the token's user. Bad tokens, servers that take
cluster members only, and protocol violations while the token is checked are refused."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
import rpcwire
from cluster import wait_until
from rpc_fixtures import TEST_LIMITS, TEST_SERVICE, make_transports, poll, serve_test_service
from rpcwire import SECRET

from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer, auth
from fs3.net import server as server_module
from fs3.net.frame import F_ERROR, F_HANDSHAKE, F_REQUEST
from fs3.net.system import PING
from fs3.proto import mgmtd_pb2, rpc_pb2

pytestmark = pytest.mark.timeout(60)

BLOCK = TEST_SERVICE["Block"]
USERS = {"tok-alice": mgmtd_pb2.User(uid=1001, name="alice", gid=100)}


class Verifier:
    """What mgmtd answers, as meta and storage ask it (fs3.net.auth.TokenCache): the user a token
    belongs to, or UNAUTHENTICATED."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, token: str) -> mgmtd_pb2.User:
        self.asked.append(token)
        if self.gate is not None:
            await self.gate.wait()
        if token == "tok-mgmtd-away":
            raise FS3Error(StatusCode.UNAVAILABLE, "mgmtd 10.0.0.1:8000: failed to connect to all addresses")
        user = USERS.get(token)
        if user is None:
            raise FS3Error(StatusCode.UNAUTHENTICATED, "unknown token")
        return user


@pytest.fixture
async def server() -> AsyncIterator[RpcServer]:
    verifier = Verifier()
    async with serve_test_service(identity="user-server", verify_user=verifier) as server:
        server.verifier = verifier  # type: ignore[attr-defined]
        yield server


async def _served_context(server: RpcServer, client: RpcClient) -> object:
    server.handlers.gate.set()  # type: ignore[attr-defined]
    await client.call(server.address, BLOCK, rpc_pb2.EchoRequest(data=b"x"))
    return server.handlers.contexts[-1]  # type: ignore[attr-defined]


async def test_a_user_connection_acts_as_its_tokens_user(server: RpcServer) -> None:
    async with RpcClient(None, token="tok-alice", identity="alice-job", limits=TEST_LIMITS) as client:
        ctx = await _served_context(server, client)
    assert ctx.user.uid == 1001 and ctx.user.name == "alice"  # type: ignore[attr-defined]
    assert ctx.token == "tok-alice"  # type: ignore[attr-defined]
    assert "alice-job" in ctx.identity and "1001" in ctx.identity  # type: ignore[attr-defined]
    # a cluster member on the same server: no user
    async with RpcClient(SECRET, identity="member", limits=TEST_LIMITS) as client:
        ctx = await _served_context(server, client)
    assert ctx.user is None and ctx.token == ""  # type: ignore[attr-defined]


async def test_a_bad_token_is_refused(server: RpcServer, caplog: pytest.LogCaptureFixture) -> None:
    async with RpcClient(None, token="tok-mallory", limits=TEST_LIMITS) as client:
        # what the client adds (FileSystem: which token_file, and to restart with a new one)
        client.refusal_hint = "the user token in token_file /x"
        with pytest.raises(FS3Error) as e:
            await client.call(server.address, PING, rpc_pb2.PingRequest())
    assert e.value.code == StatusCode.RPC_AUTH_FAILED
    assert e.value.message.endswith(": the user token in token_file /x"), e.value
    assert "tok-mallory" in server.verifier.asked  # type: ignore[attr-defined]
    assert any("refused: unknown token" in r.getMessage() for r in caplog.records)
    await poll(lambda: server.connection_count == 0, what="the refused connection to close")


async def test_a_token_mgmtd_cannot_verify_now_is_refused_as_busy_and_says_nothing_of_mgmtd(
    server: RpcServer, caplog: pytest.LogCaptureFixture
) -> None:
    """mgmtd away: the handshake was refused as a failed authentication (not retried; the user
    told to get a new token), and told whoever connected what mgmtd's client said (its address)."""
    async with RpcClient(None, token="tok-mgmtd-away", limits=TEST_LIMITS) as client:
        client.refusal_hint = "the user token in token_file /x"
        with pytest.raises(FS3Error) as e:
            await client.call(server.address, PING, rpc_pb2.PingRequest())
    assert e.value.code == StatusCode.UNAVAILABLE and e.value.retryable, e.value
    assert "cannot be verified now" in e.value.message, e.value
    assert "10.0.0.1" not in e.value.message and "token_file" not in e.value.message, e.value
    assert any("10.0.0.1" in r.getMessage() for r in caplog.records)  # the server's log has it


async def test_a_server_without_a_verifier_takes_cluster_members_only(
    rpc_server: RpcServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as client:
        with pytest.raises(FS3Error) as e:
            await client.call(rpc_server.address, PING, rpc_pb2.PingRequest())
    assert e.value.code == StatusCode.RPC_AUTH_FAILED
    assert any("accepts cluster members only" in r.getMessage() for r in caplog.records)
    # and the client is told why, not only that it failed (it then blamed its token)
    assert "a server that accepts cluster members only" in e.value.message, e.value


@pytest.mark.parametrize("eager", ["request", "second hello"])
async def test_nothing_is_served_while_the_token_is_checked(
    server: RpcServer, eager: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A client that sends a request, or another hello (another token), before the server answered
    # its token is refused, and nothing is served, however the check then ends.
    server.verifier.gate = asyncio.Event()  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()

    def attempt() -> tuple[int, int, bytes]:
        with rpcwire.connect(server.address) as sock:
            hello = rpc_pb2.ClientHello(
                version=1, nonce=auth.new_nonce(), identity="eager", token="tok-nobody"
            )
            sock.sendall(rpcwire.frame(F_HANDSHAKE, 0, 0, auth.CLIENT_HELLO, hello.SerializeToString()))
            if eager == "request":
                sock.sendall(rpcwire.frame(F_REQUEST, 1, 0, BLOCK.id, b""))
            else:
                hello.token = "tok-alice"
                sock.sendall(rpcwire.frame(F_HANDSHAKE, 0, 0, auth.CLIENT_HELLO, hello.SerializeToString()))
            hdr, message, _ = rpcwire.read_frame(sock)
            return hdr[0], rpcwire.read_status(message).code, rpcwire.wait_closed(sock)

    flags, code, rest = await loop.run_in_executor(None, attempt)
    assert flags & F_HANDSHAKE and flags & F_ERROR and code == StatusCode.RPC_AUTH_FAILED and rest == b""
    server.verifier.gate.set()  # type: ignore[attr-defined]
    await poll(lambda: server.connection_count == 0, what="the refused connection to close")
    assert server.handlers.contexts == []  # type: ignore[attr-defined]
    assert server.verifier.asked == ["tok-nobody"]  # type: ignore[attr-defined]
    expected = "frame before authentication" if eager == "request" else "handshake step 1 where -2"
    assert any(expected in r.getMessage() for r in caplog.records)


async def test_a_token_check_that_never_ends_times_the_handshake_out(server: RpcServer) -> None:
    server.verifier.gate = asyncio.Event()  # type: ignore[attr-defined]  # never opened
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS, connect_timeout=0.5) as client:
        with pytest.raises(FS3Error) as e:
            await client.call(server.address, PING, rpc_pb2.PingRequest())
    assert e.value.code in (StatusCode.RPC_CONNECT_FAILED, StatusCode.RPC_AUTH_FAILED)
    await poll(lambda: server.connection_count == 0, what="the connection to close")


async def test_an_overlong_token_is_refused_unasked(server: RpcServer) -> None:
    async with RpcClient(None, token="t" * (auth.MAX_TOKEN_CHARS + 1), limits=TEST_LIMITS) as client:
        with pytest.raises(FS3Error) as e:
            await client.call(server.address, PING, rpc_pb2.PingRequest())
    assert e.value.code == StatusCode.RPC_AUTH_FAILED
    assert server.verifier.asked == []  # type: ignore[attr-defined]


def test_a_client_needs_exactly_one_of_secret_and_token() -> None:
    with pytest.raises(ValueError, match="either the cluster secret or a user token"):
        RpcClient(None)
    with pytest.raises(ValueError, match="either the cluster secret or a user token"):
        RpcClient(SECRET, token="tok-alice")


async def test_a_flood_of_tokens_is_checked_a_bounded_number_at_a_time(
    server: RpcServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Each check may cost mgmtd a call: a server checks at most max_user_checks at once and refuses
    # the handshakes beyond, and counts each check it ends, however it ends.
    server.max_user_checks = 2
    server.verifier.gate = asyncio.Event()  # type: ignore[attr-defined]
    clients = [RpcClient(None, token=f"tok-{i}", limits=TEST_LIMITS, connect_timeout=5) for i in range(3)]
    calls = [asyncio.ensure_future(c.call(server.address, PING, rpc_pb2.PingRequest())) for c in clients]
    await poll(lambda: len(server.verifier.asked) == 2, what="two tokens being checked")  # type: ignore[attr-defined]
    await poll(lambda: any(c.done() for c in calls), what="the third handshake refused")
    assert any("too many user tokens being checked" in r.getMessage() for r in caplog.records)
    server.verifier.gate.set()  # type: ignore[attr-defined]
    for call in calls:
        with pytest.raises(FS3Error):
            await call  # unknown tokens, or refused
    for c in clients:
        await c.close()
    assert len(server.verifier.asked) == 2  # type: ignore[attr-defined]  # the third never asked
    await poll(lambda: server._user_checks == 0, what="the checks counted out")
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as client:
        await client.call(server.address, PING, rpc_pb2.PingRequest())


async def test_a_connection_whose_token_is_revoked_is_closed(
    server: RpcServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The token is asked about again every user_recheck_s while the connection is used: once it
    # belongs to nobody, the connection closes and a new one is refused.
    server.user_recheck_s = 0.2
    monkeypatch.setitem(USERS, "tok-bob", mgmtd_pb2.User(uid=1002, name="bob", gid=100))
    async with RpcClient(None, token="tok-bob", limits=TEST_LIMITS) as client:
        await client.call(server.address, PING, rpc_pb2.PingRequest())
        del USERS["tok-bob"]  # revoked
        await asyncio.sleep(0.3)

        async def refused() -> bool:
            try:
                await client.call(server.address, PING, rpc_pb2.PingRequest())
            except FS3Error as e:
                return e.code in (StatusCode.RPC_AUTH_FAILED, StatusCode.RPC_CONNECTION_CLOSED)
            return False

        await wait_until(refused, 5.0, "the revoked token's connection to be closed")
        with pytest.raises(FS3Error) as e:
            await client.call(server.address, PING, rpc_pb2.PingRequest())
        assert e.value.code == StatusCode.RPC_AUTH_FAILED  # a new connection is refused
    assert any("closing user connection" in r.getMessage() for r in caplog.records)
    # a connection left idle past the recheck: the calls that wake it wait for the answer, and
    # none of them is served once the token belongs to nobody (all of a burst of calls were)
    monkeypatch.setitem(USERS, "tok-carol", mgmtd_pb2.User(uid=1003, name="carol", gid=100))
    handlers = server.handlers  # type: ignore[attr-defined]
    handlers.gate.set()
    async with RpcClient(None, token="tok-carol", limits=TEST_LIMITS) as client:
        await client.call(server.address, BLOCK, rpc_pb2.EchoRequest(data=b"before"))
        served = len(handlers.contexts)
        del USERS["tok-carol"]
        await asyncio.sleep(0.3)
        burst = await asyncio.gather(
            *(client.call(server.address, BLOCK, rpc_pb2.EchoRequest(data=b"after")) for _ in range(20)),
            return_exceptions=True,
        )
        assert all(isinstance(r, FS3Error) for r in burst), burst
        assert len(handlers.contexts) == served  # not one of them reached its handler
    # a recheck mgmtd does not answer holds the calls USER_RECHECK_HOLD_S at most: then they are
    # served while it goes on (an unreachable mgmtd changes nothing)
    monkeypatch.setattr(server_module, "USER_RECHECK_HOLD_S", 0.3)
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as client:
        await client.call(server.address, PING, rpc_pb2.PingRequest())
        verifier = server.verifier  # type: ignore[attr-defined]
        verifier.gate = asyncio.Event()  # mgmtd hangs
        try:
            await asyncio.sleep(0.3)
            await asyncio.wait_for(client.call(server.address, PING, rpc_pb2.PingRequest()), 10)
        finally:
            verifier.gate.set()
            verifier.gate = None
    # a token still valid keeps its connection however long it is used
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as client:
        for _ in range(4):
            await client.call(server.address, PING, rpc_pb2.PingRequest())
            await asyncio.sleep(0.15)
        assert server.connection_count == 1


async def test_user_connections_are_refused_over_rdma(caplog: pytest.LogCaptureFixture) -> None:
    # On RDMA the key of a live exposure works from any queue pair of the NIC whose peer has
    # authenticated: a user could reach other connections' memory by guessing keys.
    server_transport, client_transport = make_transports("rdma-fake")
    server = RpcServer(SECRET, limits=TEST_LIMITS, transport=server_transport, verify_user=Verifier())
    await server.start(("127.0.0.1", 0))
    try:
        async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS, transport=client_transport) as c:
            with pytest.raises(FS3Error) as e:
                await c.call(server.address, PING, rpc_pb2.PingRequest())
        assert e.value.code == StatusCode.RPC_AUTH_FAILED
        assert any("TCP only" in r.getMessage() for r in caplog.records)
        async with RpcClient(SECRET, limits=TEST_LIMITS, transport=client_transport) as c:
            await c.call(server.address, PING, rpc_pb2.PingRequest())  # members are served
    finally:
        await server.stop()


async def test_a_host_trying_made_up_tokens_is_refused_unasked_for_a_while(server: RpcServer) -> None:
    # Each unknown token costs mgmtd a call: after max_user_refusals refusals within the window a
    # host's further unknown tokens are refused without asking; a token this server accepted lately
    # still gets in (a user sharing that host is not locked out), and the window passes.
    server.max_user_refusals = 2
    server.user_refusal_window_s = 0.5
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as c:
        await c.call(server.address, PING, rpc_pb2.PingRequest())  # accepted once
    for i in range(4):
        async with RpcClient(None, token=f"tok-guess-{i}", limits=TEST_LIMITS) as c:
            with pytest.raises(FS3Error) as e:
                await c.call(server.address, PING, rpc_pb2.PingRequest())
        # refused unasked as busy (retried), not as a bad token: another user of the host, whose
        # new token waits out the flood, was told to get a new one
        assert e.value.code == (StatusCode.RPC_AUTH_FAILED if i < 2 else StatusCode.UNAVAILABLE), e.value
    assert "too many refused user tokens from this host" in e.value.message
    assert server.verifier.asked == ["tok-alice", "tok-guess-0", "tok-guess-1"]  # type: ignore[attr-defined]
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as c:
        await c.call(server.address, PING, rpc_pb2.PingRequest())
    await asyncio.sleep(0.6)
    async with RpcClient(None, token="tok-guess-9", limits=TEST_LIMITS) as c:
        with pytest.raises(FS3Error):
            await c.call(server.address, PING, rpc_pb2.PingRequest())
    assert server.verifier.asked[-1] == "tok-guess-9"  # type: ignore[attr-defined]  # asked again


async def test_one_uid_holds_at_most_max_user_connections(server: RpcServer) -> None:
    """A user token's holder opened idle connections until meta ran out of descriptors (every new
    connection, cluster members' too, was refused then): one uid holds max_user_connections at
    most; a closed one frees its place; cluster members are not counted."""
    server.max_user_connections = 3
    clients = [RpcClient(None, token="tok-alice", limits=TEST_LIMITS) for _ in range(4)]
    try:
        for c in clients[:3]:
            await c.call(server.address, PING, rpc_pb2.PingRequest())
        with pytest.raises(FS3Error) as e:
            await clients[3].call(server.address, PING, rpc_pb2.PingRequest())
        assert e.value.code in (StatusCode.RPC_AUTH_FAILED, StatusCode.UNAUTHENTICATED), e.value
        async with RpcClient(SECRET, identity="member", limits=TEST_LIMITS) as member:
            await member.call(server.address, PING, rpc_pb2.PingRequest())
        await clients[0].close()
        await wait_until(lambda: server._user_conns.get(1001) == 2, 10, "the closed one to count off")  # noqa: SLF001
        await clients[3].call(server.address, PING, rpc_pb2.PingRequest())
    finally:
        for c in clients:
            await c.close()


async def test_connections_not_yet_authenticated_are_capped() -> None:
    """More connections than max_handshaking that have not authenticated are closed at once, not
    held (each a descriptor) until their handshake timeout; authenticated ones are not counted."""
    server = RpcServer(SECRET, limits=dataclasses.replace(TEST_LIMITS, handshake_timeout_s=60.0))
    await server.start(("127.0.0.1", 0))
    server.max_handshaking = 5
    host, port = server.address
    idle = [await asyncio.open_connection(host, port) for _ in range(5)]
    try:
        async with RpcClient(SECRET, identity="member", limits=TEST_LIMITS) as member:
            with pytest.raises(FS3Error) as e:  # refused at once, long before the handshake timeout
                await asyncio.wait_for(member.call(server.address, PING, rpc_pb2.PingRequest()), 20)
        # as busy, which clients retry, not as a refusal of their credentials
        assert e.value.code == StatusCode.UNAVAILABLE, e.value
        assert "too many connections not authenticated yet" in e.value.message
        reader, writer = await asyncio.open_connection(host, port)
        await asyncio.wait_for(reader.read(), 20)  # an error frame, then the end
        assert reader.at_eof()
        writer.close()
        for _, w in idle:
            w.close()
        await wait_until(lambda: server._pending == 0, 10, "the idle ones to count off")  # noqa: SLF001
        async with RpcClient(SECRET, identity="member", limits=TEST_LIMITS) as member:
            await member.call(server.address, PING, rpc_pb2.PingRequest())
    finally:
        for _, w in idle:
            w.close()
        await server.stop()


async def test_one_hosts_connections_not_yet_authenticated_leave_room_for_other_hosts() -> None:
    """1,024 stalled connections from one host took every place: each new client, from anywhere,
    was refused (and told its authentication failed) for as long as the host kept them up."""
    server = RpcServer(SECRET, limits=dataclasses.replace(TEST_LIMITS, handshake_timeout_s=60.0))
    await server.start(("127.0.0.1", 0))
    server.max_handshaking_per_host = 3
    host, port = server.address
    # from 127.0.0.2 (this machine too, another host to the server)
    idle = [await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0)) for _ in range(4)]
    try:
        # the fourth is refused at once, as busy
        hdr, message, _ = await asyncio.wait_for(rpcwire.read_frame_async(idle[3][0]), 20)
        status = rpcwire.read_status(message)
        assert hdr[0] & F_ERROR and status.code == StatusCode.UNAVAILABLE, status
        assert "too many connections not authenticated yet from this host" in status.message
        # and a client from another host still gets in
        async with RpcClient(SECRET, identity="member", limits=TEST_LIMITS) as member:
            await asyncio.wait_for(member.call(server.address, PING, rpc_pb2.PingRequest()), 20)
    finally:
        for _, w in idle:
            w.close()
        await server.stop()


async def test_a_connection_opening_while_the_token_changes_retires_after_its_calls(
    server: RpcServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """retire_connections saw only open connections: one still proving the old token joined the
    pool once its handshake ended, and served every later call with that token (closed by the
    server once the token was revoked: the outage the new token was to avoid)."""
    monkeypatch.setitem(USERS, "tok-alice-2", USERS["tok-alice"])
    verifier = server.verifier  # type: ignore[attr-defined]
    verifier.gate = asyncio.Event()
    async with RpcClient(None, token="tok-alice", limits=TEST_LIMITS) as client:
        first = asyncio.ensure_future(client.call(server.address, PING, rpc_pb2.PingRequest()))
        await poll(lambda: verifier.asked == ["tok-alice"], what="the handshake to be checked")
        client.token = "tok-alice-2"
        assert client.retire_connections() == 0  # nothing open yet
        verifier.gate.set()
        await first  # served by the connection it waited for
        ctx = await _served_context(server, client)
        assert ctx.token == "tok-alice-2"  # type: ignore[attr-defined]
        await poll(lambda: server.connection_count == 1, what="the old connection to close")
        ctx = await _served_context(server, client)
        assert ctx.token == "tok-alice-2"  # type: ignore[attr-defined]
