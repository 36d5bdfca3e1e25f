"""The RDMA transport of fs3 RPC (DESIGN §3; reference notes §8), over pyverbs.

- :mod:`~fs3.net.rdma.transport` — :class:`RdmaTransport`: RC queue pairs set up over the TCP port
- :mod:`~fs3.net.rdma.connection` — :class:`RdmaConnection`: frames by SEND/RECV with credits,
  pulled payloads, and the one-sided API (``rdma_read`` / ``rdma_write`` with a
  :class:`~fs3.net.rdma.wire.RemoteBuffer` the peer lent with ``expose``; nothing is lent before
  the peer has authenticated)
- :mod:`~fs3.net.rdma.wire` — handshake, chunk header and payload descriptor bytes
- :mod:`~fs3.net.rdma.credits`, :mod:`~fs3.net.rdma.workreq`, :mod:`~fs3.net.rdma.memory`,
  :mod:`~fs3.net.rdma.nics`, :mod:`~fs3.net.rdma.stream` — the bookkeeping, plain Python
- :mod:`~fs3.net.rdma.discovery` — devices, ports and GIDs; :mod:`~fs3.net.rdma.verbs` — the only
  module that calls pyverbs

Importing this package does not import pyverbs; only opening a device does.
"""

from fs3.net.rdma.discovery import Inventory, Nic, discover
from fs3.net.rdma.wire import RemoteBuffer

__all__ = ["Inventory", "Nic", "RemoteBuffer", "discover"]
