"""Choosing the transport: ``transport = "auto" | "tcp" | "rdma"`` in a service's config.

``auto`` uses RDMA to a peer when both ends have a usable device and TCP otherwise:

- this node has no usable device: every connection is TCP (nothing to negotiate);
- it has one: a connection starts with the RDMA handshake on the peer's TCP port; a peer without a
  device answers FALLBACK and the same socket goes on as TCP; a peer that listens for TCP only
  answers with a TCP error frame, and the connection is reopened as TCP. The peer's answer is
  remembered, so later connections to it go straight to the right transport.

Every choice is logged (``transport chosen peer=… transport=… reason=…``) and counted in
``fs3_net_transport_connections_total{transport, reason}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from fs3 import metrics
from fs3.config import RdmaConfig
from fs3.errors import FS3Error, StatusCode
from fs3.net.frame import DEFAULT_LIMITS, RpcLimits
from fs3.net.rdma.discovery import Inventory, discover
from fs3.net.tcp import TcpTransport
from fs3.net.transport import Address, Connection, Listener, ReceiverFactory, Transport

log = logging.getLogger(__name__)

MODES = ("auto", "tcp", "rdma")

# reasons, as metric labels (a bounded set)
R_CONFIGURED = "configured"
R_NO_LOCAL_DEVICE = "no_local_device"
R_PEER_NO_DEVICE = "peer_no_device"
R_PEER_TCP_ONLY = "peer_tcp_only"
R_BOTH_RDMA = "both_rdma"


@dataclass(slots=True, frozen=True)
class Choice:
    """Which transport a connection uses, and why."""

    transport: str
    reason: str


def choose(mode: str, local_rdma: bool, peer_rdma: bool | None) -> Choice:
    """The transport for a connection. ``peer_rdma`` is what the peer said last time (None: not yet
    known, so try RDMA and let the handshake decide). Raises ValueError for an unknown mode and
    FS3Error(UNAVAILABLE) for ``rdma`` without a local device."""
    if mode not in MODES:
        raise ValueError(f"transport must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "tcp":
        return Choice("tcp", R_CONFIGURED)
    if mode == "rdma":
        if not local_rdma:
            raise FS3Error(StatusCode.UNAVAILABLE, "transport = rdma but this node has no usable RDMA device")
        return Choice("rdma", R_CONFIGURED)
    if not local_rdma:
        return Choice("tcp", R_NO_LOCAL_DEVICE)
    if peer_rdma is False:
        return Choice("tcp", R_PEER_NO_DEVICE)
    return Choice("rdma", R_BOTH_RDMA)


_REASON_LABEL = {
    "peer listens for TCP only": R_PEER_TCP_ONLY,
}


class TransportMetrics:
    """``fs3_net_transport_connections_total{transport, reason}``."""

    def __init__(self, reg: CollectorRegistry | None = None) -> None:
        self.connections: Counter = metrics.counter(
            "fs3_net_transport_connections_total",
            "connections this process opened (not those it accepted), by transport and the reason "
            "it was chosen",
            ("transport", "reason"),
            reg,
        )

    def record(self, transport: str, reason: str) -> None:
        self.connections.labels(transport, reason).inc()


def default_metrics() -> TransportMetrics:
    """The process registry's transport counter (created on first use, by one thread)."""
    made: TransportMetrics = metrics.process_wide("fs3_net_transport", TransportMetrics)
    return made


class AutoTransport(Transport):
    """RDMA where both ends can, TCP otherwise (see the module documentation)."""

    name = "auto"

    def __init__(
        self,
        rdma: Transport | None,
        no_rdma_reason: str = "",
        *,
        tcp: TcpTransport | None = None,
        metrics_sink: TransportMetrics | None = None,
    ) -> None:
        self.rdma = rdma
        self.no_rdma_reason = no_rdma_reason or "no usable RDMA device"
        self.tcp = tcp or TcpTransport()
        self.metrics = metrics_sink
        self._peer_rdma: dict[Address, bool] = {}
        if rdma is not None:
            rdma.tcp_fallback = True  # type: ignore[attr-defined]
            rdma._on_choice = self._on_rdma_choice  # type: ignore[attr-defined]
        log.info(
            "transport auto local_rdma=%s%s",
            rdma is not None,
            "" if rdma is not None else f" reason={self.no_rdma_reason!r}",
        )

    def _record(self, peer: str, choice: Choice) -> None:
        if self.metrics is not None:
            self.metrics.record(choice.transport, choice.reason)

    def _on_rdma_choice(self, peer: str, transport: str, reason: str) -> None:
        if transport == "rdma":
            label = R_BOTH_RDMA
        elif reason in _REASON_LABEL:
            label = _REASON_LABEL[reason]
        else:
            label = R_PEER_NO_DEVICE
        self._record(peer, Choice(transport, label))

    async def connect(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
        connect_timeout: float = 10.0,
    ) -> Connection:
        choice = choose("auto", self.rdma is not None, self._peer_rdma.get(address))
        peer = f"{address[0]}:{address[1]}"
        if choice.transport == "tcp":
            log.debug("transport chosen peer=%s transport=tcp reason=%s", peer, choice.reason)
            conn = await self.tcp.connect(
                address, receiver_factory, limits=limits, connect_timeout=connect_timeout
            )
            self._record(peer, choice)  # once connected: a refused attempt is no connection
            return conn
        assert self.rdma is not None
        conn = await self.rdma.connect(
            address, receiver_factory, limits=limits, connect_timeout=connect_timeout
        )
        self._peer_rdma[address] = type(conn).__name__ == "RdmaConnection"
        return conn

    async def listen(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
    ) -> Listener:
        if self.rdma is not None:
            return await self.rdma.listen(address, receiver_factory, limits=limits)
        # Still answer RDMA offers (FALLBACK, then TCP on the same socket) so RDMA peers need no retry.
        from fs3.net.rdma.transport import listen_sniffing

        return await listen_sniffing(address, receiver_factory, limits, None, self.no_rdma_reason)


class ConfiguredTcpTransport(TcpTransport):
    """``transport = "tcp"``: TCP to every peer, each connection counted as chosen by the config
    (``transport="tcp", reason="configured"``), as ``auto`` counts the TCP connections it opens."""

    def __init__(self, metrics_sink: TransportMetrics) -> None:
        super().__init__()
        self.metrics = metrics_sink

    async def connect(
        self,
        address: Address,
        receiver_factory: ReceiverFactory,
        *,
        limits: RpcLimits = DEFAULT_LIMITS,
        connect_timeout: float = 10.0,
    ) -> Connection:
        log.debug("transport chosen peer=%s:%d transport=tcp reason=%s", *address, R_CONFIGURED)
        conn = await super().connect(
            address, receiver_factory, limits=limits, connect_timeout=connect_timeout
        )
        self.metrics.record("tcp", R_CONFIGURED)  # once connected: a refused attempt is no connection
        return conn


def make_transport(
    mode: str,
    config: RdmaConfig | None = None,
    *,
    limits: RpcLimits = DEFAULT_LIMITS,
    inventory: Inventory | None = None,
    opener: Callable[..., object] | None = None,
    metrics_sink: TransportMetrics | None = None,
) -> Transport:
    """The transport a service's ``transport`` setting asks for. ``rdma`` without a usable device
    raises FS3Error(UNAVAILABLE) naming the reason; ``auto`` falls back to TCP and logs why."""
    cfg = config or RdmaConfig()
    if mode not in MODES:
        raise ValueError(f"transport must be one of {', '.join(MODES)}, got {mode!r}")
    sink = metrics_sink if metrics_sink is not None else default_metrics()
    if mode == "tcp":
        return ConfiguredTcpTransport(sink)
    inv = inventory if inventory is not None else discover(cfg.device_filter, cfg.gid_index, cfg.mtu)
    if not inv.usable:
        if mode == "rdma":
            raise FS3Error(StatusCode.UNAVAILABLE, f"transport = rdma but {inv.reason()}")
        return AutoTransport(None, inv.reason(), metrics_sink=sink)
    from fs3.net.rdma.transport import RdmaTransport, track

    try:
        rdma = RdmaTransport(cfg, inventory=inv, opener=opener, limits=limits)  # type: ignore[arg-type]
    except FS3Error as e:
        if mode == "rdma":
            raise
        return AutoTransport(None, e.message, metrics_sink=sink)
    track(rdma)
    if mode == "rdma":
        rdma._on_choice = lambda peer, transport, reason: sink.record(transport, R_CONFIGURED)
        return rdma
    return AutoTransport(rdma, metrics_sink=sink)
