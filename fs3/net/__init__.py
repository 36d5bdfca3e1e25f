"""fs3 RPC: framed, authenticated, multiplexed calls over pluggable transports (DESIGN §3).

- :mod:`fs3.net.frame` — the wire frame and :class:`RpcLimits`
- :mod:`fs3.net.transport` — the transport interface; :mod:`fs3.net.tcp` implements it
- :mod:`fs3.net.service` — :class:`ServiceDef` / :class:`Method` / :class:`CallContext`
- :mod:`fs3.net.server` — :class:`RpcServer`; :mod:`fs3.net.client` — :class:`RpcClient`
- :mod:`fs3.net.auth` — the shared-secret handshake; :mod:`fs3.net.buffers` — the payload pool
- :mod:`fs3.net.system` — the built-in system service (Ping, Echo, Sink, Source)
"""

from fs3.net.buffers import BufferPool
from fs3.net.client import RpcClient, ServiceStub
from fs3.net.frame import RpcLimits
from fs3.net.server import RpcServer
from fs3.net.service import CallContext, Method, ServiceDef
from fs3.net.system import SYSTEM_SERVICE
from fs3.net.transport import Address, Transport, parse_address

__all__ = [
    "Address",
    "BufferPool",
    "CallContext",
    "Method",
    "RpcClient",
    "RpcLimits",
    "RpcServer",
    "SYSTEM_SERVICE",
    "ServiceDef",
    "ServiceStub",
    "Transport",
    "parse_address",
]
