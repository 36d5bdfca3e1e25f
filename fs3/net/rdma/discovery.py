"""Which RDMA devices and ports this node can use.

:func:`probe` asks libibverbs (through pyverbs) for every device, port and GID; :func:`select_nics`
turns that inventory into the NICs to use, applying the configured device filter and GID index, and
says why each port was left out. The split keeps the policy testable without a device.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from fs3.net.rdma.wire import LinkLayer

log = logging.getLogger(__name__)

# ibv_gid_type_sysfs values
GID_TYPE_IB_ROCE_V1 = 0
GID_TYPE_ROCE_V2 = 1


@dataclass(slots=True, frozen=True)
class GidEntry:
    index: int
    gid: bytes  # 16 bytes
    type: int  # GID_TYPE_*


@dataclass(slots=True, frozen=True)
class PortInfo:
    """One port of one device, as probed."""

    device: str
    port: int
    active: bool
    link_layer: int
    lid: int
    active_mtu: int  # ibv_mtu code
    gids: tuple[GidEntry, ...] = ()
    max_qp_rd_atom: int = 16
    max_qp_init_rd_atom: int = 16


@dataclass(slots=True, frozen=True)
class Nic:
    """A usable (device, port, GID index): what a queue pair is created on."""

    device: str
    port: int
    gid_index: int
    gid: bytes
    lid: int
    link_layer: int
    mtu: int  # ibv_mtu code this side will use at most
    max_rd_atomic: int = 16

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


@dataclass(slots=True)
class Inventory:
    """The outcome of discovery: usable NICs, and why there are none (or why ports were skipped)."""

    nics: list[Nic] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def usable(self) -> bool:
        return bool(self.nics)

    def reason(self) -> str:
        """One line saying why RDMA is not usable ('' when it is)."""
        if self.nics:
            return ""
        return self.error or ("; ".join(self.skipped) if self.skipped else "no RDMA device")


MTU_CODES = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def mtu_code(mtu_bytes: int) -> int:
    """ibv_mtu code of an MTU in bytes (256..4096, a power of two)."""
    try:
        return MTU_CODES[mtu_bytes]
    except KeyError:
        raise ValueError(f"RDMA MTU must be one of {sorted(MTU_CODES)}, got {mtu_bytes}") from None


def _matches(filters: Sequence[str], device: str, port: int) -> bool:
    if not filters:
        return True
    return any(f == device or f == f"{device}:{port}" for f in filters)


def _auto_gid(port: PortInfo) -> GidEntry | None:
    """RoCE: a RoCE v2 GID with an IPv4 address first (routable, what 3FS uses), then other RoCE v2,
    then any non-zero GID. InfiniBand: index 0."""
    nonzero = [g for g in port.gids if any(g.gid)]
    if port.link_layer != LinkLayer.ETHERNET:
        return next((g for g in nonzero if g.index == 0), nonzero[0] if nonzero else None)

    def ipv4_mapped(g: GidEntry) -> bool:
        return ipaddress.IPv6Address(g.gid).ipv4_mapped is not None

    for pred in (
        lambda g: g.type == GID_TYPE_ROCE_V2 and ipv4_mapped(g),
        lambda g: g.type == GID_TYPE_ROCE_V2,
        lambda g: True,
    ):
        found = [g for g in nonzero if pred(g)]
        if found:
            return found[0]
    return None


def select_nics(
    ports: Sequence[PortInfo], device_filter: Sequence[str] = (), gid_index: int = -1, mtu: int = 0
) -> Inventory:
    """The usable NICs among ``ports``. ``device_filter`` lists device names or ``device:port``
    (empty: all); ``gid_index`` -1 picks one per port (see :func:`_auto_gid`); ``mtu`` in bytes caps
    the path MTU (0: the port's active MTU)."""
    inv = Inventory()
    cap = mtu_code(mtu) if mtu else 5
    for p in ports:
        where = f"{p.device}:{p.port}"
        if not _matches(device_filter, p.device, p.port):
            inv.skipped.append(f"{where} not in device_filter")
            continue
        if not p.active:
            inv.skipped.append(f"{where} is not active")
            continue
        if gid_index >= 0:
            g = next((g for g in p.gids if g.index == gid_index), None)
            if g is None or (p.link_layer == LinkLayer.ETHERNET and not any(g.gid)):
                inv.skipped.append(f"{where} has no usable gid at index {gid_index}")
                continue
        else:
            g = _auto_gid(p)
            if g is None:
                if p.link_layer == LinkLayer.ETHERNET:
                    inv.skipped.append(f"{where} has no usable gid (RoCE needs an IP address on the netdev)")
                    continue
                g = GidEntry(0, bytes(16), GID_TYPE_IB_ROCE_V1)
        inv.nics.append(
            Nic(
                p.device,
                p.port,
                g.index,
                g.gid,
                p.lid,
                p.link_layer,
                min(p.active_mtu, cap),
                min(16, p.max_qp_rd_atom, p.max_qp_init_rd_atom) or 1,
            )
        )
    if not ports and not inv.error:
        inv.error = "no RDMA device"
    return inv


def probe() -> tuple[list[PortInfo], str]:
    """Every port of every RDMA device (via pyverbs), and an error string when probing failed.

    Never raises: a machine without pyverbs, without devices, or whose kernel lacks RDMA support
    gets an empty list and the reason."""
    try:
        import pyverbs.device as d
        import pyverbs.enums as e
        from pyverbs.pyverbs_error import PyverbsError
    except ImportError as exc:
        return [], f"pyverbs is not importable ({exc}); run `make rdma`"
    try:
        devices = d.get_device_list()
    except PyverbsError as exc:
        return [], f"libibverbs lists no devices ({exc}); is an RDMA driver (or rdma_rxe) loaded?"
    ports: list[PortInfo] = []
    errors: list[str] = []
    for dev in devices:
        name = dev.name.decode()
        try:
            ctx = d.Context(name=name)
        except PyverbsError as exc:
            errors.append(f"{name}: cannot open ({exc})")
            continue
        try:
            attr = ctx.query_device()
            for port_num in range(1, attr.phys_port_cnt + 1):
                pa = ctx.query_port(port_num)
                gids = []
                for idx in range(pa.gid_tbl_len):
                    try:
                        gid = ctx.query_gid(port_num, idx)
                        gtype = ctx.query_gid_type(port_num, idx)
                    except PyverbsError:
                        continue  # unpopulated entries fail to query on some drivers
                    raw = bytes.fromhex(gid.gid.replace(":", ""))
                    gids.append(GidEntry(idx, raw, int(gtype)))
                ports.append(
                    PortInfo(
                        name,
                        port_num,
                        pa.state == e.IBV_PORT_ACTIVE,
                        int(pa.link_layer),
                        int(pa.lid),
                        int(pa.active_mtu),
                        tuple(gids),
                        int(attr.max_qp_rd_atom),
                        int(attr.max_qp_init_rd_atom),
                    )
                )
        except PyverbsError as exc:
            errors.append(f"{name}: query failed ({exc})")
        finally:
            ctx.close()
    if not ports:
        return [], "; ".join(errors) if errors else "no RDMA device"
    return ports, ""


def discover(device_filter: Sequence[str] = (), gid_index: int = -1, mtu: int = 0) -> Inventory:
    """Probe the devices and select the usable NICs."""
    ports, error = probe()
    inv = select_nics(ports, device_filter, gid_index, mtu)
    if error:
        inv.error = error  # the probe knows best why there is nothing
    for why in inv.skipped:
        log.info("rdma port skipped reason=%r", why)
    return inv
