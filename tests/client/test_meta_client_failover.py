"""The meta client's failover: across a meta server's graceful stop, and over an address list that
changes under it (a mount's per-user clients share one list)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cluster import wait_until

from fs3.client.meta_client import DEV_SECRET, META_SERVICE, MetaClient
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcServer
from fs3.net.service import CallContext
from fs3.net.transport import parse_address
from fs3.proto import meta_pb2 as m

pytestmark = pytest.mark.timeout(60)


class FakeMeta:
    """Answers Stat with the inode asked for, naming itself in ``uid``; with ``hold``, Stat waits
    until the call is cancelled (by the server's stop) instead."""

    def __init__(self, uid: int, hold: bool) -> None:
        self.uid = uid
        self.hold = hold
        self.stats = 0

    def handlers(self) -> dict[str, Any]:
        async def refuse(request: Any, payload: Any, ctx: CallContext) -> Any:
            raise FS3Error(StatusCode.NOT_IMPLEMENTED, ctx.method.name)

        table: dict[str, Any] = {meth.name: refuse for meth in META_SERVICE}
        table["Stat"] = self.stat
        return table

    async def stat(self, request: m.StatReq, payload: Any, ctx: CallContext) -> m.InodeRsp:
        self.stats += 1
        if self.hold:
            await asyncio.Event().wait()
        return m.InodeRsp(inode=m.Inode(id=request.inode_id, uid=self.uid))


async def _serve(fake: FakeMeta) -> tuple[RpcServer, str]:
    server = RpcServer(DEV_SECRET, identity=f"meta-{fake.uid}")
    server.add_service(META_SERVICE, fake.handlers())
    host, port = await server.start(("127.0.0.1", 0))
    return server, f"{host}:{port}"


async def test_a_call_cut_short_by_a_meta_servers_graceful_stop_goes_to_another() -> None:
    stopping, other = FakeMeta(1, hold=True), FakeMeta(2, hold=False)
    server_a, a = await _serve(stopping)
    server_b, b = await _serve(other)
    client = MetaClient([a, b], timeout_s=20, rpc_timeout_s=10)
    try:
        client._current = 0  # noqa: SLF001  # the first try goes to the server about to stop
        call = asyncio.ensure_future(client.stat(42))
        await wait_until(lambda: stopping.stats == 1, 10, "the call to reach the server", interval_s=0.005)
        await server_a.stop()  # a rolling restart's SIGTERM, the call in progress
        inode = await asyncio.wait_for(call, 10)
        assert (inode.id, inode.uid) == (42, 2)  # answered by the other server, not failed
    finally:
        await client.close()
        await server_a.stop()
        await server_b.stop()


class RecordingRpc:
    """Stands in for RpcClient: records the address of each call and answers it."""

    def __init__(self) -> None:
        self.called: list[tuple[str, int]] = []

    async def call(self, address: tuple[str, int], method: Any, request: Any, **kw: Any) -> Any:
        self.called.append(address)
        return m.InodeRsp(inode=m.Inode(id=request.inode_id)), None

    def on_connection_lost(self, listener: Any) -> None:
        pass

    def remove_connection_lost(self, listener: Any) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_shared_address_list_that_shrinks_does_not_break_a_client() -> None:
    rpc = RecordingRpc()
    base = MetaClient(["10.0.0.1:8100", "10.0.0.2:8100", "10.0.0.3:8100"], rpc=rpc)  # type: ignore[arg-type]
    per_user = MetaClient(base.addresses, rpc=rpc)  # type: ignore[arg-type]
    per_user.addresses = base.addresses  # one list, as a mount shares it
    per_user._current = 2  # noqa: SLF001  # it was using the third server
    base.addresses[:] = ["10.0.0.9:8100"]  # the mount learns the meta servers are now just one
    inode = await per_user.stat(7)
    assert inode.id == 7
    assert rpc.called == [parse_address("10.0.0.9:8100")]
    # and on growing again, it keeps to the list as it is
    base.addresses[:] = ["10.0.0.9:8100", "10.0.0.8:8100"]
    await per_user.stat(8)
    assert rpc.called[-1] in {parse_address(a) for a in base.addresses}


async def test_an_empty_address_list_is_an_error_not_a_crash() -> None:
    client = MetaClient(["10.0.0.1:8100"], rpc=RecordingRpc())  # type: ignore[arg-type]
    client.addresses.clear()
    with pytest.raises(FS3Error) as e:
        await client.stat(1)
    assert e.value.code == StatusCode.UNAVAILABLE


async def test_a_call_that_gives_up_on_a_hung_server_leaves_the_next_call_to_another() -> None:
    """A budget that one try uses up (a hung server: the call times out) fails that call; the
    next one starts with another server rather than the one that just failed it."""
    hung, other = FakeMeta(1, hold=True), FakeMeta(2, hold=False)
    server_a, a = await _serve(hung)
    server_b, b = await _serve(other)
    client = MetaClient([a, b], timeout_s=0.5, rpc_timeout_s=0.5)
    try:
        client._current = 0  # noqa: SLF001  # the first try goes to the hung server
        with pytest.raises(FS3Error) as e:
            await client.stat(42)
        assert e.value.code == StatusCode.DEADLINE_EXCEEDED
        assert (await client.stat(43)).uid == 2
        assert hung.stats == 1
    finally:
        await client.close()
        await server_a.stop()
        await server_b.stop()


class HoldingProxy:
    """A TCP proxy to a server whose answers it can hold back (``hold``) and then let through,
    late (``release``): an answer lost or late while the network is out."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.open = asyncio.Event()
        self.open.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.AbstractServer | None = None

    def hold(self) -> None:
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, gated: bool) -> None:
            try:
                while data := await r.read(1 << 16):
                    if gated:
                        await self.open.wait()
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        for task in (pipe(client_r, server_w, False), pipe(server_r, client_w, True)):
            t = asyncio.ensure_future(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def test_a_change_whose_answer_came_too_late_is_answered_not_failed(tmp_path) -> None:
    """A mkdir (any change) that meta made but whose answer arrived after the client's budget (the
    network back just as it ran out) failed with ETIMEDOUT, and the directory was there. The
    client now asks meta what became of it: done, its answer; not done, never (so the error is
    true)."""
    from fs3.client.meta_client import ROOT_ID
    from fs3.config import KvConfig, MetaConfig
    from fs3.meta.daemon import MetaDaemon

    meta = MetaDaemon(
        MetaConfig(listen_port=0, mgmtd_addresses=[], authenticate=False, kv=KvConfig(engine="mem"))
    )
    await meta.start()
    proxy = HoldingProxy(("127.0.0.1", meta.port))
    client = MetaClient([await proxy.start()], timeout_s=1.0, rpc_timeout_s=1.0)
    try:
        await client.stat(ROOT_ID)  # connected and authenticated before the answers are held
        proxy.hold()
        asyncio.get_running_loop().call_later(1.5, proxy.release)  # after the budget of 1 s
        made = await client.mkdir(ROOT_ID, b"late", 0o755)
        assert made.id and (await client.lookup(ROOT_ID, b"late")).id == made.id
        # one meta cannot be asked about (it is gone) fails, as before
        await meta.stop()
        with pytest.raises(FS3Error) as e:
            await client.mkdir(ROOT_ID, b"never", 0o755)
        assert e.value.retryable or e.value.code == StatusCode.DEADLINE_EXCEEDED
    finally:
        await client.close()
        await proxy.stop()
        await meta.stop()
