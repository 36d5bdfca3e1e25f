"""Device and port selection (pure), what probing says on this machine, and the pyverbs layer's
completion-channel plumbing with stand-ins for the pyverbs objects."""

from __future__ import annotations

import errno
import os

import pytest

from fs3.net.rdma import discovery
from fs3.net.rdma.discovery import (
    GID_TYPE_IB_ROCE_V1,
    GID_TYPE_ROCE_V2,
    GidEntry,
    PortInfo,
    mtu_code,
    select_nics,
)
from fs3.net.rdma.wire import LinkLayer

pytestmark = pytest.mark.timeout(30)

V4 = bytes(10) + b"\xff\xff" + bytes([192, 168, 1, 5])
LINK_LOCAL = bytes.fromhex("fe800000000000000202c9fffe000001")
ETH = LinkLayer.ETHERNET


def _roce(
    dev: str, port: int = 1, active: bool = True, gids: tuple[GidEntry, ...] | None = None, mtu: int = 5
) -> PortInfo:
    if gids is None:
        gids = (GidEntry(0, LINK_LOCAL, GID_TYPE_IB_ROCE_V1), GidEntry(1, LINK_LOCAL, GID_TYPE_ROCE_V2),
                GidEntry(2, V4, GID_TYPE_IB_ROCE_V1), GidEntry(3, V4, GID_TYPE_ROCE_V2))  # fmt: skip
    return PortInfo(dev, port, active, ETH, 0, mtu, gids, 128, 128)


def test_auto_gid_prefers_roce_v2_ipv4() -> None:
    inv = select_nics([_roce("rxe0")])
    assert [(n.device, n.gid_index, n.gid) for n in inv.nics] == [("rxe0", 3, V4)]
    assert inv.nics[0].max_rd_atomic == 16 and inv.nics[0].mtu == 5
    # without an IPv4 GID: RoCE v2 link-local, then anything
    inv = select_nics([_roce("rxe0", gids=(GidEntry(0, LINK_LOCAL, 0), GidEntry(1, LINK_LOCAL, 1)))])
    assert inv.nics[0].gid_index == 1
    inv = select_nics([_roce("rxe0", gids=(GidEntry(0, bytes(16), 0), GidEntry(4, LINK_LOCAL, 0)))])
    assert inv.nics[0].gid_index == 4


def test_filters_inactive_ports_and_missing_gids_are_explained() -> None:
    ports = [
        _roce("mlx5_0"),
        _roce("mlx5_1"),
        _roce("mlx5_1", 2, active=False),
        _roce("rxe0", gids=(GidEntry(0, bytes(16), 0),)),
        PortInfo("mlx5_ib", 1, True, LinkLayer.INFINIBAND, 7, 4, (), 16, 16),
    ]
    inv = select_nics(ports)
    assert [n.name for n in inv.nics] == ["mlx5_0:1", "mlx5_1:1", "mlx5_ib:1"]
    assert "mlx5_1:2 is not active" in inv.skipped and any(
        "rxe0:1 has no usable gid" in s for s in inv.skipped
    )
    ib = inv.nics[2]
    assert ib.lid == 7 and ib.gid == bytes(16) and ib.gid_index == 0
    inv = select_nics(ports, device_filter=["mlx5_1:1", "mlx5_ib"])
    assert [n.name for n in inv.nics] == ["mlx5_1:1", "mlx5_ib:1"]
    inv = select_nics(ports, device_filter=["nothing"])
    assert not inv.usable and "not in device_filter" in inv.reason()


def test_fixed_gid_index_and_mtu_cap() -> None:
    inv = select_nics([_roce("rxe0")], gid_index=2, mtu=1024)
    assert inv.nics[0].gid_index == 2 and inv.nics[0].mtu == mtu_code(1024) == 3
    inv = select_nics([_roce("rxe0")], gid_index=9)
    assert not inv.usable and "no usable gid at index 9" in inv.reason()
    with pytest.raises(ValueError):
        mtu_code(1500)
    assert select_nics([]).reason() == "no RDMA device"


def test_probe_on_this_machine_never_raises() -> None:
    ports, error = discovery.probe()
    inv = discovery.discover()
    if not ports:
        assert error and not inv.usable and inv.reason() == error
    else:
        assert all(p.device for p in ports)


# ---- fs3.net.rdma.verbs without a device -----------------------------------------------------------

verbs = pytest.importorskip("fs3.net.rdma.verbs")


def test_completion_channel_descriptor_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # pyverbs hides the channel's fd; the layer finds the anonymous inode the kernel made for it.
    # An eventfd stands in for "[infinibandevent]" here.
    opened: list[int] = []

    class Channel:
        def __init__(self, ctx: object) -> None:
            opened.append(os.eventfd(0))

        def close(self) -> None:
            os.close(opened[0])

    monkeypatch.setattr(verbs, "CompChannel", Channel, raising=False)
    monkeypatch.setattr(verbs, "_EVENT_FD_LINK", "anon_inode:[eventfd]")
    other = os.eventfd(0)  # an unrelated descriptor of the same kind, open before: not taken
    try:
        channel, fd = verbs._create_channel(object())
        assert fd == opened[0] and not os.get_blocking(fd)
        channel.close()
    finally:
        os.close(other)


def test_take_events_acknowledges_everything_it_took(monkeypatch: pytest.MonkeyPatch) -> None:
    if not verbs.HAVE_PYVERBS:
        pytest.skip("pyverbs is not importable (run `make rdma`)")
    from pyverbs.pyverbs_error import PyverbsRDMAError

    class Channel:
        pending = 3

        def get_cq_event(self, cq: object) -> None:
            if self.pending == 0:
                raise PyverbsRDMAError("Failed to get CQ event", errno.EAGAIN)
            self.pending -= 1

    class Cq:
        acked = 0
        notified = 0

        def ack_events(self, n: int) -> None:
            self.acked += n

        def req_notify(self) -> None:
            self.notified += 1

    qp = object.__new__(verbs.VerbsQueuePair)
    qp.channel, qp.cq = Channel(), Cq()
    qp.take_events()
    assert qp.cq.acked == 3 and qp.channel.pending == 0
    qp.take_events()  # nothing pending: returns at once, acknowledges nothing
    assert qp.cq.acked == 3
    qp.arm()
    assert qp.cq.notified == 1

    class Broken(Channel):
        pending = 1

        def get_cq_event(self, cq: object) -> None:
            if self.pending == 0:
                raise PyverbsRDMAError("Failed to get CQ event", errno.EIO)
            self.pending -= 1

    qp.channel = Broken()
    with pytest.raises(PyverbsRDMAError):
        qp.take_events()
    assert qp.cq.acked == 4  # the event taken before the failure is still acknowledged


def test_queue_pair_attributes_are_real_pyverbs_objects() -> None:
    """The attributes for INIT -> RTR -> RTS and the work requests, built with the installed pyverbs
    (these need no device), carry what the handshake exchanged and the [rdma] settings."""
    if not verbs.HAVE_PYVERBS:
        pytest.skip("pyverbs is not importable (run `make rdma`)")
    import pyverbs.enums as e

    from fs3.net.rdma.discovery import Nic
    from fs3.net.rdma.memory import Region
    from fs3.net.rdma.wire import ConnectParams, RemoteBuffer

    nic = Nic("rxe0", 1, 3, V4, 0, ETH, 5, 16)
    remote = ConnectParams(0x77, 0x1234, 0, 3, ETH, V4, 32, 16384, 65536)
    attr = verbs.rts_attributes(
        nic, remote, 0x999, traffic_class=96, service_level=2, timeout=18, rnr_retry=6
    )
    assert (attr.dest_qp_num, attr.rq_psn, attr.sq_psn) == (0x77, 0x1234, 0x999)
    assert attr.path_mtu == 3  # the smaller of the two sides' MTUs
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic) == (18, 7, 6, 16)
    ah = attr.ah_attr
    assert ah.is_global == 1 and ah.sgid_index == 3 and ah.traffic_class == 96 and ah.sl == 2
    assert ah.dgid == "0000:0000:0000:0000:0000:ffff:c0a8:0105" and ah.port_num == 1
    # InfiniBand without a GID: addressed by LID, no global route
    ib = Nic("mlx5_0", 1, 0, bytes(16), 9, LinkLayer.INFINIBAND, 4, 16)
    attr = verbs.rts_attributes(
        ib, ConnectParams(5, 6, 42, 5, LinkLayer.INFINIBAND, bytes(16), 8, 4096, 0), 1
    )
    assert attr.ah_attr.is_global == 0 and attr.ah_attr.dlid == 42 and attr.path_mtu == 4

    region = Region(memoryview(bytearray(64)), 0x10000, 11, 12, 64)
    wr = verbs.send_request(
        e.IBV_WR_RDMA_READ, 0x30000000000000AB, region, 16, 32, RemoteBuffer(0x5000, 99, 32)
    )
    assert (wr.wr_id, wr.opcode, wr.num_sge, wr.send_flags) == (
        0x30000000000000AB,
        e.IBV_WR_RDMA_READ,
        1,
        e.IBV_SEND_SIGNALED,
    )
    assert verbs.gid_string(bytes(range(16))) == "0001:0203:0405:0607:0809:0a0b:0c0d:0e0f"
