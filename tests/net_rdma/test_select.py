"""``transport = "auto" | "tcp" | "rdma"``: the choice, its log line and metric, and every pairing of
a node with and without a device (devices simulated by the fake verbs fabric)."""

from __future__ import annotations

import logging
import os

import pytest
from fakeverbs import Fabric
from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.config import RdmaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer
from fs3.net.rdma.discovery import Inventory
from fs3.net.rdma.transport import RdmaTransport
from fs3.net.system import ECHO, PING
from fs3.net.tcp import TcpConnection, TcpTransport
from fs3.net.transport_select import (
    AutoTransport,
    Choice,
    TransportMetrics,
    choose,
    make_transport,
)
from fs3.proto import rpc_pb2

pytestmark = pytest.mark.timeout(60)
SECRET = b"select-test-secret-0123456789abcd"
NO_DEVICE = Inventory(error="libibverbs lists no devices")


def test_choice_table() -> None:
    assert choose("tcp", True, True) == Choice("tcp", "configured")
    assert choose("rdma", True, None) == Choice("rdma", "configured")
    with pytest.raises(FS3Error) as info:
        choose("rdma", False, None)
    assert info.value.code == StatusCode.UNAVAILABLE
    assert choose("auto", False, True) == Choice("tcp", "no_local_device")
    assert choose("auto", True, None) == Choice("rdma", "both_rdma")  # unknown peer: let the handshake decide
    assert choose("auto", True, True) == Choice("rdma", "both_rdma")
    assert choose("auto", True, False) == Choice("tcp", "peer_no_device")
    with pytest.raises(ValueError):
        choose("infiniband", True, True)


def test_make_transport_without_a_device() -> None:
    assert isinstance(make_transport("tcp"), TcpTransport)
    reg = CollectorRegistry()
    auto = make_transport("auto", inventory=NO_DEVICE, metrics_sink=TransportMetrics(reg))
    assert isinstance(auto, AutoTransport) and auto.rdma is None
    assert "no devices" in auto.no_rdma_reason
    with pytest.raises(FS3Error, match="transport = rdma but libibverbs lists no devices") as info:
        make_transport("rdma", inventory=NO_DEVICE)
    assert info.value.code == StatusCode.UNAVAILABLE
    with pytest.raises(ValueError):
        make_transport("udp")


def test_a_device_that_cannot_be_opened_means_tcp_in_auto_mode() -> None:
    fabric = Fabric()

    def broken(nic: object, cfg: object) -> object:
        raise OSError(19, "No such device")

    auto = make_transport(
        "auto",
        inventory=fabric.inventory(),
        opener=broken,
        metrics_sink=TransportMetrics(CollectorRegistry()),
    )
    assert isinstance(auto, AutoTransport) and auto.rdma is None
    assert "could be opened" in auto.no_rdma_reason and "No such device" in auto.no_rdma_reason
    with pytest.raises(FS3Error, match="could be opened"):
        make_transport("rdma", inventory=fabric.inventory(), opener=broken)
    # one bad NIC of two: the other is used
    calls = []

    def half(nic: object, cfg: object) -> object:
        calls.append(nic)
        if len(calls) == 1:
            raise OSError(19, "No such device")
        return fabric.opener(nic, cfg)  # type: ignore[arg-type]

    rdma = RdmaTransport(RdmaConfig(), inventory=fabric.inventory(), opener=half)  # type: ignore[arg-type]
    assert [n.name for n in rdma.nics] == ["fake1:1"]


def test_an_rdma_transport_appears_in_the_process_metrics() -> None:
    """What a daemon's /metrics serves: make_transport registers its RDMA transport's per-NIC
    figures (fs3_net_rdma_*) in the process registry."""
    fabric = Fabric()
    t = make_transport(
        "rdma",
        inventory=fabric.inventory(),
        opener=fabric.opener,
        metrics_sink=TransportMetrics(CollectorRegistry()),
    )
    assert isinstance(t, RdmaTransport)
    try:
        # (other tests' transports with the same fake NIC names may still be alive: they add up)
        for nic in t.nics:
            for name in (
                "fs3_net_rdma_sends_total",
                "fs3_net_rdma_one_sided_total",
                "fs3_net_rdma_connections",
            ):
                labels = {"nic": nic.name, "op": "read"} if "one_sided" in name else {"nic": nic.name}
                assert metrics.registry().get_sample_value(name, labels) is not None, name
    finally:
        t.close()


def test_make_transport_probes_this_machine() -> None:
    # whatever this machine has: auto always works, and says why when it is TCP
    t = make_transport("auto", metrics_sink=TransportMetrics(CollectorRegistry()))
    assert isinstance(t, AutoTransport)
    if t.rdma is None:
        assert t.no_rdma_reason


def _count(reg: CollectorRegistry, transport: str, reason: str) -> float:
    v = reg.get_sample_value(
        "fs3_net_transport_connections_total", {"transport": transport, "reason": reason}
    )
    return v or 0.0


async def _serve(transport: object) -> RpcServer:
    server = RpcServer(SECRET, transport=transport)  # type: ignore[arg-type]
    await server.start(("127.0.0.1", 0))
    return server


async def _echo(client: RpcClient, server: RpcServer) -> None:
    data = os.urandom(200_000)
    _, payload = await client.call(
        server.address, ECHO, rpc_pb2.EchoRequest(data=b"hi"), payload=data, timeout=10
    )
    assert bytes(payload) == data


@pytest.mark.parametrize(("mode", "reason"), [("tcp", "configured"), ("auto", "no_local_device")])
async def test_a_refused_connection_is_not_counted_as_opened(mode: str, reason: str) -> None:
    """A peer that is down refuses every reconnect: those attempts are no connections (the
    counter rose by dozens while one storage daemon was down for seconds)."""
    reg = CollectorRegistry()
    transport = make_transport(mode, inventory=NO_DEVICE, metrics_sink=TransportMetrics(reg))
    server = await _serve(TcpTransport())
    address = server.address
    await server.stop()
    async with RpcClient(SECRET, transport=transport) as client:
        for _ in range(3):
            with pytest.raises(FS3Error):
                await client.call(address, PING, rpc_pb2.PingRequest(), timeout=5)
        assert _count(reg, "tcp", reason) == 0
        server = await _serve(TcpTransport())
        try:
            await _echo(client, server)
        finally:
            await server.stop()
    assert _count(reg, "tcp", reason) == 1


async def test_both_sides_with_devices_use_rdma(caplog: pytest.LogCaptureFixture) -> None:
    fabric, reg = Fabric(), CollectorRegistry()
    sink = TransportMetrics(reg)
    server = await _serve(
        make_transport("auto", inventory=fabric.inventory(), opener=fabric.opener, metrics_sink=sink)
    )
    auto = make_transport("auto", inventory=fabric.inventory(), opener=fabric.opener, metrics_sink=sink)
    caplog.set_level(logging.INFO, logger="fs3.net.rdma.transport")
    async with RpcClient(SECRET, transport=auto) as client:
        await _echo(client, server)
    await server.stop()
    assert _count(reg, "rdma", "both_rdma") == 2  # the client's connect and the server's accept
    assert any("transport chosen" in r.message and "transport=rdma" in r.message for r in caplog.records)
    assert fabric.sends > 0


async def test_client_with_device_to_server_without_falls_back_on_the_same_socket() -> None:
    fabric, reg = Fabric(), CollectorRegistry()
    sink = TransportMetrics(reg)
    server = await _serve(make_transport("auto", inventory=NO_DEVICE, metrics_sink=sink))
    auto = make_transport("auto", inventory=fabric.inventory(), opener=fabric.opener, metrics_sink=sink)
    assert isinstance(auto, AutoTransport)
    async with RpcClient(SECRET, transport=auto) as client:
        await _echo(client, server)
        conn = client._single[server.address].conn
        assert isinstance(conn, TcpConnection)
    async with RpcClient(SECRET, transport=auto) as client:
        await _echo(client, server)  # remembered: straight to TCP
    await server.stop()
    assert _count(reg, "tcp", "peer_no_device") == 2
    assert fabric.sends == 0 and not fabric.qps  # the queue pair made for the offer was destroyed


async def test_client_with_device_to_tcp_only_server_reconnects_with_tcp() -> None:
    fabric, reg = Fabric(), CollectorRegistry()
    server = await _serve(TcpTransport())
    auto = make_transport(
        "auto", inventory=fabric.inventory(), opener=fabric.opener, metrics_sink=TransportMetrics(reg)
    )
    async with RpcClient(SECRET, transport=auto) as client:
        await _echo(client, server)
    await server.stop()
    assert _count(reg, "tcp", "peer_tcp_only") == 1


async def test_client_without_device_to_rdma_server_uses_tcp() -> None:
    fabric, reg = Fabric(), CollectorRegistry()
    server = await _serve(RdmaTransport(RdmaConfig(), inventory=fabric.inventory(), opener=fabric.opener))
    auto = make_transport("auto", inventory=NO_DEVICE, metrics_sink=TransportMetrics(reg))
    async with RpcClient(SECRET, transport=auto) as client:
        await _echo(client, server)
        await client.call(server.address, PING, rpc_pb2.PingRequest())
    await server.stop()
    assert _count(reg, "tcp", "no_local_device") == 1
    assert fabric.sends == 0


async def test_rdma_mode_refuses_a_peer_without_rdma() -> None:
    fabric = Fabric()
    server = await _serve(
        make_transport("auto", inventory=NO_DEVICE, metrics_sink=TransportMetrics(CollectorRegistry()))
    )
    rdma = make_transport(
        "rdma",
        inventory=fabric.inventory(),
        opener=fabric.opener,
        metrics_sink=TransportMetrics(CollectorRegistry()),
    )
    async with RpcClient(SECRET, transport=rdma) as client:
        with pytest.raises(FS3Error, match="does not offer RDMA") as info:
            await client.call(server.address, PING, rpc_pb2.PingRequest(), timeout=5)
        assert info.value.code == StatusCode.RPC_CONNECT_FAILED
    await server.stop()
    assert not fabric.qps


def test_socket_hand_over_works_on_uvloop() -> None:
    """Both hand-overs of a set-up socket to TCP framing (a FALLBACK answer; a TCP client on the RDMA
    listener) on uvloop, which fs3's daemons run on (the async tests here use the standard loop)."""
    import uvloop

    async def scenario() -> None:
        await test_client_with_device_to_server_without_falls_back_on_the_same_socket()
        await test_client_without_device_to_rdma_server_uses_tcp()

    uvloop.run(scenario())
