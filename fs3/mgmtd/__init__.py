"""The cluster manager (fs3-mgmtd): membership, routing info, chain states, admin API.

Run it with ``fs3 mgmtd --config mgmtd.toml`` (or ``python -m fs3.mgmtd``); several instances over
one store elect a primary by a lease, the others stand by. Talk to it with
:class:`fs3.client.mgmtd_client.MgmtdClient` and keep routing fresh with
:class:`fs3.client.routing.RoutingCache`.

Modules, from the inside out:

* :mod:`~fs3.mgmtd.chain_state` -- the pure chain state machine (reference notes §4.3).
* :mod:`~fs3.mgmtd.schema` -- keys and values in the KV store (DESIGN §4).
* :mod:`~fs3.mgmtd.users` -- users and tokens (stored as SHA-256 digests).
* :mod:`~fs3.mgmtd.election` -- the primary lease and write fencing.
* :mod:`~fs3.mgmtd.cluster` -- the primary's state: records, heartbeats, failure detection, chain
  updates, routing snapshots.
* :mod:`~fs3.mgmtd.admin` -- admin operations with their validation.
* :mod:`~fs3.mgmtd.service` -- the gRPC servicers (Mgmtd, grpc.health.v1) and access control.
* :mod:`~fs3.mgmtd.server` / :mod:`~fs3.mgmtd.main` -- the daemon.
"""
