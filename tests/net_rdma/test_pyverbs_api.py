"""fs3.net.rdma.verbs and discovery against the pyverbs that is installed (Debian's 44.0, linked into
the venv by `make rdma`), without a device.

pyverbs is compiled Cython: its functions carry no introspectable signature, so each call the verbs
layer makes is checked two ways. Objects that need no device (QPAttr, QPCap, QPInitAttr, SGE,
SendWR, RecvWR, GID, GlobalRoute, AHAttr) are the real classes, so a wrong keyword or attribute
fails exactly as it would on a NIC. Objects that need one (Context, PD, MR, CompChannel, CQ, QP) are
stand-ins that check every call against the real class: the constructor is run for real with the
device objects replaced by None, which pyverbs parses fully (arity, keyword names) before it
rejects the None ("incorrect type" / "must not be None"); every method and attribute must exist on
the real class, and every argument must be one its docstring names (``:param x:``) in that order.
Then the whole life of a device and a queue pair runs through fs3's code and the values that matter
(access flags, attribute masks) are checked.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

import pytest

from fs3.net.rdma import discovery, verbs
from fs3.net.rdma.discovery import GID_TYPE_ROCE_V2, Nic
from fs3.net.rdma.wire import ConnectParams, LinkLayer, RemoteBuffer
from fs3.net.rdma.workreq import WrKind, encode_wr_id

if not verbs.HAVE_PYVERBS:
    pytest.skip(
        "pyverbs is not importable in this venv, so its API cannot be checked: run `make rdma` "
        "(it links Debian's python3-pyverbs into .venv)",
        allow_module_level=True,
    )

import pyverbs.addr as pv_addr  # noqa: E402
import pyverbs.cq as pv_cq  # noqa: E402
import pyverbs.device as pv_device  # noqa: E402
import pyverbs.enums as e  # noqa: E402
import pyverbs.mr as pv_mr  # noqa: E402
import pyverbs.pd as pv_pd  # noqa: E402
import pyverbs.qp as pv_qp  # noqa: E402
from pyverbs.pyverbs_error import PyverbsRDMAError  # noqa: E402

V4 = bytes(10) + b"\xff\xff" + bytes([192, 168, 1, 5])
_PARSED_OK = ("has incorrect type", "must not be None")


def doc_params(func: Any) -> list[str]:
    """The parameters a pyverbs docstring lists, in order (``:param name:``)."""
    return re.findall(r":param (\w+):", getattr(func, "__doc__", None) or "")


def check_arguments(real_cls: type, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``args``/``kwargs`` fit ``real_cls.method`` as its docstring documents it (or, for a method
    without a docstring, as its argument parser accepts them)."""
    func = getattr(real_cls, method, None)
    assert func is not None, f"pyverbs {real_cls.__name__} has no {method}"
    params = doc_params(func)
    if method == "__init__" and "kwargs" in params:
        # keyword-only extras are listed as "* *name*" under :param kwargs:
        params += re.findall(r"\* \*(\w+)\*", func.__doc__ or "")
    if not params and (args or kwargs):
        _probe_arity(real_cls, method, len(args), list(kwargs))
        return
    assert len(args) <= len(params), (
        f"{real_cls.__name__}.{method} takes {params}, got {len(args)} positional"
    )
    for k in kwargs:
        assert k in params, f"{real_cls.__name__}.{method} has no parameter {k!r} (it has {params})"


def _probe_arity(real_cls: type, method: str, nargs: int, names: list[str]) -> None:
    """Call the method of an uninitialised object with arguments of a type no parameter takes: Cython
    checks the count and the keyword names, then fails converting the first argument, before the
    body (which would use the missing C object) runs."""
    obj = real_cls.__new__(real_cls)  # type: ignore[call-overload]
    try:
        getattr(obj, method)(*[object()] * nargs, **{k: object() for k in names})
    except TypeError as exc:
        conversion = ("an integer is required", "cannot be interpreted", "incorrect type")
        assert any(c in str(exc) for c in conversion), f"{real_cls.__name__}.{method}: {exc}"
    else:  # pragma: no cover - only an untyped parameter list gets here
        raise AssertionError(f"{real_cls.__name__}.{method} accepted arguments of any type")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []

    def named(self, cls: str, method: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(a, k) for c, m, a, k in self.calls if c == cls and m == method]


def standin(
    real_cls: type,
    rec: Recorder,
    results: dict[str, Any] | None = None,
    run_ctor: bool = True,
) -> type:
    """A class that records calls and checks each one against the real pyverbs ``real_cls``."""
    results = results or {}

    class StandIn:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            check_arguments(real_cls, "__init__", args, kwargs)
            if run_ctor:
                none = [None if isinstance(a, StandInBase) else a for a in args]
                knone = {k: None if isinstance(v, StandInBase) else v for k, v in kwargs.items()}
                try:
                    real_cls(*none, **knone)
                except TypeError as exc:
                    assert any(s in str(exc) for s in _PARSED_OK), f"{real_cls.__name__}{args}: {exc}"
            rec.calls.append((real_cls.__name__, "__init__", args, kwargs))
            self.args, self.kwargs = args, kwargs

        def __getattr__(self, name: str) -> Any:
            real = getattr(real_cls, name, None)
            assert real is not None, f"pyverbs {real_cls.__name__} has no {name}"
            if type(real).__name__ == "getset_descriptor":
                return results[name]

            def call(*args: Any, **kwargs: Any) -> Any:
                check_arguments(real_cls, name, args, kwargs)
                rec.calls.append((real_cls.__name__, name, args, kwargs))
                result = results.get(name)
                return result(*args) if callable(result) else result

            return call

    StandIn.__name__ = real_cls.__name__
    return type(real_cls.__name__, (StandIn, StandInBase), {})


class StandInBase:
    pass


class Fields:
    """A query result: only attributes the real pyverbs class has may be read."""

    def __init__(self, real_cls: type, **values: Any) -> None:
        self._real, self._values = real_cls, values

    def __getattr__(self, name: str) -> Any:
        assert hasattr(self._real, name), f"pyverbs {self._real.__name__} has no {name}"
        return self._values[name]


@pytest.fixture
def rec(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """verbs.py's device-bound pyverbs classes replaced by checked stand-ins."""
    r = Recorder()
    opened: list[int] = []

    def eagain(cq: Any) -> None:
        raise PyverbsRDMAError("Failed to get CQ event", errno.EAGAIN)

    channel = standin(pv_cq.CompChannel, r, {"get_cq_event": eagain})
    real_init = channel.__init__

    def channel_init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        opened.append(os.eventfd(0))  # the kernel's "[infinibandevent]" descriptor, stood in for

    channel.__init__ = channel_init  # type: ignore[method-assign]
    keys = iter(range(0x100, 0x10000))
    monkeypatch.setattr(verbs, "Context", standin(pv_device.Context, r, run_ctor=False))
    monkeypatch.setattr(verbs, "PD", standin(pv_pd.PD, r))
    monkeypatch.setattr(verbs, "CompChannel", channel)
    monkeypatch.setattr(verbs, "CQ", standin(pv_cq.CQ, r, {"poll": lambda n: (0, [])}))
    # QPInitAttr is real; its CQs are stand-ins, so it is built with None CQs to check the rest
    real_init_attr = pv_qp.QPInitAttr

    def init_attr(**kwargs: Any) -> Any:
        built = real_init_attr(**{k: None if isinstance(v, StandInBase) else v for k, v in kwargs.items()})
        r.calls.append(("QPInitAttr", "__init__", (), kwargs))
        return built

    monkeypatch.setattr(verbs, "QPInitAttr", init_attr)
    monkeypatch.setattr(verbs, "QP", standin(pv_qp.QP, r, {"qp_num": 0x4242}))

    class MR(standin(pv_mr.MR, r)):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.lkey = self.rkey = next(keys)

    monkeypatch.setattr(verbs, "MR", MR)
    monkeypatch.setattr(verbs, "_EVENT_FD_LINK", "anon_inode:[eventfd]")
    yield r
    for fd in opened:
        os.close(fd)


def test_verbs_layer_calls_pyverbs_as_installed(rec: Recorder) -> None:
    nic = Nic("rxe0", 1, 3, V4, 0, LinkLayer.ETHERNET, 3, 16)
    dev = verbs.Device(nic, traffic_class=96, service_level=2)
    assert rec.named("Context", "__init__") == [((), {"name": "rxe0"})]

    # registered memory is local-only; an exposure is exactly the bytes lent, with remote flags
    region = dev.register(8192)
    ((args, kwargs),) = rec.named("MR", "__init__")
    assert args[1:] == (8192, e.IBV_ACCESS_LOCAL_WRITE) and kwargs == {"address": region.addr}
    exp = dev.expose(region, 100, 1000, write=True)
    args, kwargs = rec.named("MR", "__init__")[1]
    remote = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    assert args[1:] == (1000, remote) and kwargs == {"address": region.addr + 100}
    assert (exp.addr, exp.length, exp.rkey) == (region.addr + 100, 1000, exp.handle.rkey)
    ro = dev.expose(region, 0, 10)
    assert rec.named("MR", "__init__")[2][0][2] == e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
    dev.withdraw(ro)
    dev.withdraw(exp)
    with pytest.raises(ValueError):
        dev.expose(region, 8000, 200)

    # a queue pair: CQ on a completion channel, RC, created in INIT without remote access
    qp = dev.queue_pair(64, 32)
    ((args, _),) = rec.named("CQ", "__init__")
    assert args[1] == 96 and isinstance(args[3], verbs.CompChannel)
    (init_kwargs,) = [k for _, k in rec.named("QPInitAttr", "__init__")]
    assert init_kwargs["qp_type"] == e.IBV_QPT_RC and init_kwargs["sq_sig_all"] == 0
    cap = init_kwargs["cap"]
    assert (cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge, cap.max_recv_sge) == (64, 32, 1, 1)
    ((args, _),) = rec.named("QP", "__init__")
    attr = args[2]
    assert isinstance(attr, pv_qp.QPAttr) and attr.qp_access_flags == 0 and attr.port_num == 1
    assert qp.fileno() >= 0 and not os.get_blocking(qp.fileno())

    local = qp.local_params(32, 16384, 65536)
    assert local.qpn == 0x4242 and local.gid == V4
    peer = ConnectParams(0x77, 0x1234, 0, 3, LinkLayer.ETHERNET, V4, 32, 16384, 65536)
    qp.connect(peer, timeout=18, retry_cnt=6, rnr_retry=5)
    ((args, _),) = rec.named("QP", "to_rts")
    rts = args[0]
    # everything INIT->RTR (AV, path MTU, dest QPN, RQ PSN, max dest RD atomic, min RNR timer) and
    # RTR->RTS (timeout, retry count, RNR retry, SQ PSN, max RD atomic) needs, in one QPAttr
    assert isinstance(rts, pv_qp.QPAttr)
    assert (rts.dest_qp_num, rts.rq_psn, rts.sq_psn, rts.path_mtu) == (0x77, 0x1234, qp.psn, 3)
    assert (rts.timeout, rts.retry_cnt, rts.rnr_retry, rts.min_rnr_timer) == (18, 6, 5, 12)
    assert (rts.max_rd_atomic, rts.max_dest_rd_atomic) == (16, 16)
    assert rts.ah_attr.is_global == 1 and rts.ah_attr.sgid_index == 3 and rts.ah_attr.traffic_class == 96

    # remote access comes later, by an RTS->RTS modify of the access flags alone
    qp.allow_remote_access()
    ((args, _),) = rec.named("QP", "modify")
    assert args[1] == e.IBV_QP_ACCESS_FLAGS
    assert args[0].qp_access_flags == e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    assert args[0].qp_state == e.IBV_QPS_RTS and args[0].cur_qp_state == e.IBV_QPS_RTS

    # work requests: real RecvWR/SendWR/SGE objects, RDMA ones aimed at the remote buffer
    rid = encode_wr_id(WrKind.RECV, 3)
    qp.post_recv(rid, region, 4096, 1024)
    ((args, _),) = rec.named("QP", "post_recv")
    assert args[0].wr_id == rid and args[0].num_sge == 1 and args[1] is None
    target = RemoteBuffer(0x7000, 0xBEEF, 512)
    qp.post_send(1, region, 0, 100)
    qp.post_read(2, region, 0, 512, target)
    qp.post_write(3, region, 512, 512, target)
    qp.post_send(4, region, 0, 100, False)
    sends = [a[0] for a, _ in rec.named("QP", "post_send")]
    assert [w.opcode for w in sends] == [
        e.IBV_WR_SEND,
        e.IBV_WR_RDMA_READ,
        e.IBV_WR_RDMA_WRITE,
        e.IBV_WR_SEND,
    ]
    # each work request says whether it wants a completion (the QP does not signal all)
    assert [w.send_flags for w in sends] == [e.IBV_SEND_SIGNALED] * 3 + [0]
    assert all(w.num_sge == 1 for w in sends)

    # completions: arm, take (EAGAIN ends it, nothing to acknowledge), poll
    qp.arm()
    qp.take_events()
    assert rec.named("CQ", "req_notify") == [((), {})] and rec.named("CQ", "ack_events") == []
    assert qp.poll(16) == [] and rec.named("CQ", "poll") == [((16,), {})]
    qp.close()
    assert [m for c, m, *_ in rec.calls if m == "close"] == ["close"] * 5  # 2 MRs, QP, CQ, channel
    dev.deregister(region)
    dev.close()


def test_discovery_reads_what_pyverbs_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    gids = {0: "fe80:0000:0000:0000:0000:0000:0000:0001", 1: "0000:0000:0000:0000:0000:ffff:c0a8:0105"}

    def query_gid(port: int, index: int) -> Any:
        return pv_addr.GID(val=gids[index])

    context = standin(
        pv_device.Context,
        rec,
        {
            "query_device": lambda: Fields(
                pv_device.DeviceAttr, phys_port_cnt=1, max_qp_rd_atom=16, max_qp_init_rd_atom=8
            ),
            "query_port": lambda port: Fields(
                pv_device.PortAttr,
                state=e.IBV_PORT_ACTIVE,
                link_layer=e.IBV_LINK_LAYER_ETHERNET,
                lid=0,
                active_mtu=e.IBV_MTU_1024,
                gid_tbl_len=2,
            ),
            "query_gid": query_gid,
            "query_gid_type": lambda port, index: [0, GID_TYPE_ROCE_V2][index],
        },
        run_ctor=False,
    )
    device = Fields(pv_device.Device, name=b"rxe0")
    monkeypatch.setattr(pv_device, "Context", context)
    monkeypatch.setattr(pv_device, "get_device_list", lambda: [device])
    ports, error = discovery.probe()
    assert error == ""
    (port,) = ports
    assert port.active and port.link_layer == LinkLayer.ETHERNET and port.active_mtu == e.IBV_MTU_1024
    assert [g.type for g in port.gids] == [0, GID_TYPE_ROCE_V2] and port.gids[1].gid == V4
    assert rec.named("Context", "__init__") == [((), {"name": "rxe0"})]
    # what ibv_query_gid_type reports is the sysfs type: RoCE v2 is 1 there (2 in ibv_gid_entry)
    assert GID_TYPE_ROCE_V2 == e.IBV_GID_TYPE_SYSFS_ROCE_V2
    inv = discovery.select_nics(ports)
    assert [n.gid_index for n in inv.nics] == [1]


def test_checks_catch_a_wrong_call() -> None:
    """The checks above would notice a mismatch: a keyword the installed pyverbs does not take."""
    rec = Recorder()
    cq_cls = standin(pv_cq.CQ, rec)
    with pytest.raises(AssertionError, match="no parameter 'channel_fd'"):
        cq_cls(None, 10, channel_fd=3)
    with pytest.raises(AssertionError, match="has no fd"):
        standin(pv_cq.CompChannel, rec)(None).fd  # noqa: B018 - pyverbs 44 hides the channel's fd
    with pytest.raises(TypeError, match="unexpected keyword argument 'grh'"):
        pv_addr.AHAttr(port_num=1, is_global=1, grh=pv_addr.GlobalRoute())  # its docstring says grh; it is gr
    with pytest.raises(AssertionError, match="takes"):
        check_arguments(pv_qp.QP, "modify", (1, 2, 3), {})
    with pytest.raises(AssertionError, match="takes exactly 2 positional"):
        check_arguments(pv_device.Context, "query_gid", (1,), {})  # no docstring: its parser says
