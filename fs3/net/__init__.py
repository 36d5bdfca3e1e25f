"""fs3 RPC: framed, authenticated, multiplexed calls over pluggable transports (DESIGN §3).

Define a service once, shared by server and client (ids are wire protocol, see rpc.proto's
``ServiceId`` and each service's method enum)::

    META = ServiceDef(rpc_pb2.SERVICE_META, "meta", {
        meta_pb2.METHOD_META_STAT: ("Stat", meta_pb2.StatReq, meta_pb2.InodeRsp),
    })

Serve it (handlers get the request message, the raw payload or None, and a CallContext; they return
a response, or ``(response, payload)``, or raise FS3Error)::

    class MetaHandlers:
        async def stat(self, request, payload, ctx): ...

    server = RpcServer(cluster_secret, identity="meta-1", limits=RpcLimits(...))
    server.add_service(META, MetaHandlers())
    await server.start(("0.0.0.0", 8000))

Call it (one pooled connection per peer, deadline on every call, errors as FS3Error)::

    client = RpcClient(cluster_secret, identity="client-7")
    response, payload = await client.call(("10.0.0.5", 8000), META["Stat"], request, timeout=5)

Modules: :mod:`~fs3.net.frame` (the wire frame, :class:`RpcLimits`), :mod:`~fs3.net.transport`
(the transport interface) and :mod:`~fs3.net.tcp` (TCP on uvloop), :mod:`~fs3.net.service`
(:class:`ServiceDef`, :class:`Method`, :class:`CallContext`, :func:`inline`), :mod:`~fs3.net.server`,
:mod:`~fs3.net.client`, :mod:`~fs3.net.auth` (the shared-secret handshake),
:mod:`~fs3.net.buffers` (the payload buffer pool), :mod:`~fs3.net.system` (the built-in service 0:
Ping, Echo, Sink, Source). ``python -m fs3.net serve|ping`` runs a bare endpoint.
"""

from fs3.net.buffers import BufferPool
from fs3.net.client import RpcClient, ServiceStub
from fs3.net.frame import RpcLimits
from fs3.net.server import RpcServer
from fs3.net.service import CallContext, Method, ServiceDef, inline
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
    "inline",
    "parse_address",
]
