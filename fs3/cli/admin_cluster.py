"""Cluster commands of ``fs3 admin`` over mgmtd: init, nodes, targets, chains, users, configs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fs3.cli import seconds
from fs3.cli.admin import Connection, Result, UsageError, command, int_list, natural, u32, utf8_text
from fs3.errors import FS3Error, StatusCode
from fs3.mgmtd.users import MAX_TOKENS_PER_USER, TOKEN_PREFIX
from fs3.net.auth import TOKEN_CACHE_S, TOKEN_STALE_S
from fs3.net.server import USER_RECHECK_S
from fs3.net.transport import format_address
from fs3.proto import common_pb2, mgmtd_pb2

if TYPE_CHECKING:
    from fs3.client.mgmtd_client import MgmtdClient

NODE_TYPES = {
    "mgmtd": common_pb2.NODE_MGMTD,
    "meta": common_pb2.NODE_META,
    "storage": common_pb2.NODE_STORAGE,
    "client": common_pb2.NODE_CLIENT,
}


def _state(v: int) -> str:
    return common_pb2.PublicTargetState.Name(v) if v else "-"


def _local_state(v: int) -> str:
    return {common_pb2.LOCAL_OFFLINE: "OFFLINE"}.get(v) or (common_pb2.LocalTargetState.Name(v) if v else "-")


def _node_type(v: int) -> str:
    return common_pb2.NodeType.Name(v).removeprefix("NODE_") if v else "-"


def _node_status(v: int) -> str:
    return mgmtd_pb2.NodeStatus.Name(v).removeprefix("NODE_STATUS_") if v else "-"


def chain_roles(chain: mgmtd_pb2.ChainInfo) -> dict[int, str]:
    """HEAD, MIDDLE or TAIL of each target a write passes (SERVING, or SYNCING which receives
    forwarded writes), in chain order; '-' for targets out of the write path."""
    in_path = [
        t.target_id for t in chain.targets if t.public_state in (common_pb2.SERVING, common_pb2.SYNCING)
    ]
    roles = {t.target_id: "-" for t in chain.targets}
    for i, tid in enumerate(in_path):
        if len(in_path) == 1:
            roles[tid] = "HEAD+TAIL"
        elif i == 0:
            roles[tid] = "HEAD"
        elif i == len(in_path) - 1:
            roles[tid] = "TAIL"
        else:
            roles[tid] = "MIDDLE"
    return roles


def _chain_state(chain: mgmtd_pb2.ChainInfo, t: mgmtd_pb2.ChainTarget) -> str:
    """A target's public state in its chain, ",draining" added while it drains."""
    draining = any(d.target_id == t.target_id for d in chain.draining)
    return _state(t.public_state) + (",draining" if draining else "")


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not text (not valid UTF-8 at byte {e.start})") from None


def _write_secret(path: str, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: make it private
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)


def _token_out(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--token-out", metavar="FILE", help="write the token to FILE (mode 0600) instead of printing it"
    )


@contextlib.contextmanager
def _token_out_ready(path: str | None) -> Iterator[None]:
    """Around a change that issues a token: --token-out is made sure of first (created, 0600, if it
    does not exist; an existing one is left as it is until the token arrives), so that no token is
    issued to be lost (a user created, a cluster initialized, and nowhere to write their token).
    A file created here goes again if the change fails."""
    if not path:
        yield
        return
    existed = os.path.lexists(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        raise UsageError(f"cannot write --token-out {path}: {e.strerror}") from None
    try:
        yield
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise


def _token_result(token: str, args: argparse.Namespace, value: dict[str, Any], what: str) -> Result:
    if args.token_out:
        _write_secret(args.token_out, token)
        return Result(
            value={**value, "token_file": args.token_out},
            message=f"{what}; token written to {args.token_out}",
        )
    return Result(value={**value, "token": token}, message=f"{what}; token (shown once):\n{token}")


# -- cluster and nodes ----------------------------------------------------------------------------


def _init_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster-id", default="fs3", help="cluster name (default fs3)")
    p.add_argument("--admin-name", default="root", help="name of the first admin user (default root)")
    p.add_argument("--admin-uid", type=u32, default=0, help="uid of the first admin user (default 0)")
    _token_out(p)


@command("init-cluster", "initialize a new cluster and create its first admin user", _init_args)
async def init_cluster(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client(with_secret=True)
    with _token_out_ready(args.token_out):
        token = await client.init_cluster(args.cluster_id, args.admin_name, args.admin_uid)
    return _token_result(
        token,
        args,
        {"cluster_id": args.cluster_id, "admin_uid": args.admin_uid},
        f"cluster {args.cluster_id} initialized, admin {args.admin_name} (uid {args.admin_uid})",
    )


@command("list-nodes", "nodes with type, status, address and last heartbeat")
async def list_nodes(conn: Connection, args: argparse.Namespace) -> Result:
    rows = [
        {
            "node_id": n.node_id,
            "type": _node_type(n.type),
            "status": _node_status(n.status),
            "hostname": n.hostname,
            "pid": n.pid or "",
            "endpoints": [format_address(e.host, e.port) for e in n.endpoints],
            "heartbeat_age_s": round(n.last_heartbeat_age_s, 1) if n.pid else "",  # none heard: no age
            "disabled": n.disabled,
        }
        for n in sorted(await conn.mgmtd_client().list_nodes(), key=lambda n: n.node_id)
    ]
    return Result(
        rows, ["node_id", "type", "status", "hostname", "pid", "endpoints", "heartbeat_age_s", "disabled"]
    )


def _chain_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chain", type=u32, default=0, help="only this chain's targets")


@command("list-targets", "targets with chain, role, public and local state, node, disk and use", _chain_arg)
async def list_targets(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    targets = await client.list_targets(args.chain)
    roles: dict[int, str] = {}
    for c in await client.list_chains():
        roles.update(chain_roles(c))
    rows = [
        {
            "target_id": t.target_id,
            "chain_id": t.chain_id or "-",
            "role": roles.get(t.target_id, "-"),
            "public_state": _state(t.public_state),
            "local_state": _local_state(t.local_state),
            "node_id": t.node_id,
            "disk_index": t.disk_index,
            "used_bytes": t.used_bytes,
            "low_space": t.low_space,
        }
        for t in sorted(targets, key=lambda t: (t.chain_id, t.target_id))
    ]
    return Result(
        rows,
        [
            "target_id",
            "chain_id",
            "role",
            "public_state",
            "local_state",
            "node_id",
            "disk_index",
            "used_bytes",
            "low_space",
        ],
    )


def _chains_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", type=u32, default=0, help="only the chains of this chain table")
    p.add_argument("--table-version", type=u32, default=0, help="that table's version (default newest)")


@command("list-chains", "chains with version and each target's state and role (head first)", _chains_args)
async def list_chains(conn: Connection, args: argparse.Namespace) -> Result:
    if args.table_version and not args.table:
        raise UsageError("--table-version needs --table (the version of which table)")
    chains = await conn.mgmtd_client().list_chains(args.table, args.table_version)
    rows = []
    for c in sorted(chains, key=lambda c: c.chain_id):
        roles = chain_roles(c)
        serving = sum(t.public_state == common_pb2.SERVING for t in c.targets)
        rows.append(
            {
                "chain_id": c.chain_id,
                "version": c.version,
                "status": "OK" if serving == len(c.targets) else ("DEGRADED" if serving else "UNAVAILABLE"),
                "targets": [
                    {"target_id": t.target_id, "state": _chain_state(c, t), "role": roles[t.target_id]}
                    for t in c.targets
                ],
                "preferred_order": list(c.preferred_order),
            }
        )
    if args.json:
        return Result(rows, ["chain_id", "version", "status", "targets"])
    shown = [
        {
            **r,
            "targets": " ".join(
                f"{t['target_id']}({t['state']}{'' if t['role'] == '-' else ',' + t['role']})"
                for t in r["targets"]
            ),
        }
        for r in rows
    ]
    return Result(shown, ["chain_id", "version", "status", "targets"])


@command("list-chain-tables", "chain tables, every version")
async def list_chain_tables(conn: Connection, args: argparse.Namespace) -> Result:
    tables = await conn.mgmtd_client().list_chain_tables()
    rows = [
        {
            "table_id": t.table_id,
            "version": t.version,
            "chains": len(t.chain_ids),
            "description": t.description,
            "chain_ids": list(t.chain_ids),
        }
        for t in sorted(tables, key=lambda t: (t.table_id, t.version))
    ]
    return Result(rows, ["table_id", "version", "chains", "description"])


@command("list-clients", "live client sessions (mounts, admin tools)")
async def list_clients(conn: Connection, args: argparse.Namespace) -> Result:
    now = time.time()
    reply = await conn.mgmtd_client().client_sessions()
    rows = [
        {
            "client_id": s.client_id,
            "type": _node_type(s.type),
            "hostname": s.hostname,
            "pid": s.pid,
            "uid": s.uid,
            "description": s.description,
            "age_s": round(now - s.started_at, 1) if s.started_at else "",
        }
        for s in reply.sessions
    ]
    # Sessions live in the primary's memory only: after it takes over (a start or a failover) or
    # resumes after a stall, a live client is listed from its next extension on, which comes at
    # least three times per session timeout (ClientSessionKeeper). 'partial' lasts a whole timeout,
    # for meta's expiry of write sessions; a live client can be missing only for the first third.
    note = ""
    heard, timeout = reply.listening_s, reply.session_timeout_s
    if reply.partial and not timeout:  # a mgmtd that does not say how long it has listened
        note = (
            "note: this mgmtd has listened for client sessions for less than the session timeout (it "
            "became primary or resumed after a stall since); a live client is listed once it extends "
            "its session, so one may be missing"
        )
    elif reply.partial and heard < timeout / 3:
        note = (
            f"note: this mgmtd has listened for client sessions for {heard:.0f} s (it became primary or "
            f"resumed after a stall then); live clients extend theirs at least every {timeout / 3:.0f} s, "
            "so one may not be listed yet"
        )
    return Result(rows, ["client_id", "type", "hostname", "pid", "uid", "description", "age_s"], message=note)


# -- chain changes --------------------------------------------------------------------------------


def _chain_result(chain: mgmtd_pb2.ChainInfo, what: str) -> Result:
    roles = chain_roles(chain)
    targets = [
        {"target_id": t.target_id, "state": _chain_state(chain, t), "role": roles[t.target_id]}
        for t in chain.targets
    ]
    shown = " -> ".join(f"{t['target_id']}({t['state']})" for t in targets)
    if chain.draining:
        what += " once the draining targets' daemons stop reading (not yet)"
    return Result(
        value={"chain_id": chain.chain_id, "version": chain.version, "targets": targets},
        message=f"{what}; chain {chain.chain_id} version {chain.version}: {shown}",
    )


# A SERVING target an operation takes out drains first (mgmtd_pb2.DrainingTarget): its daemon
# acts on the new routing within a heartbeat or two, and mgmtd waits a heartbeat timeout at most.
_DRAIN_WAIT_S = 60.0


async def _drained(conn: Connection, chain: mgmtd_pb2.ChainInfo) -> mgmtd_pb2.ChainInfo:
    """``chain`` once mgmtd has made the change its draining targets wait for (or as it is after
    ``_DRAIN_WAIT_S``)."""
    deadline = time.monotonic() + _DRAIN_WAIT_S
    while chain.draining and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        chain = next(c for c in await conn.mgmtd_client().list_chains() if c.chain_id == chain.chain_id)
    return chain


def _offline_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target_id", type=natural)
    p.add_argument(
        "--force",
        action="store_true",
        help="even if it is the chain's last SERVING or its LASTSRV target: the next target becomes "
        "LASTSRV, and data only this one holds may be lost",
    )


@command(
    "offline-target",
    "take a target out of its chain now (it moves to the end; it comes back, resyncing, while its "
    "daemon reports it: to keep it out, stop that daemon or disable-node its node)",
    _offline_args,
)
async def offline_target(conn: Connection, args: argparse.Namespace) -> Result:
    chain = await _drained(conn, await conn.mgmtd_client().offline_target(args.target_id, args.force))
    return _chain_result(
        chain,
        f"target {args.target_id} taken out of its chain (back, resyncing, while its daemon reports it)",
    )


def _register_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("node_id", type=u32)
    p.add_argument("type", choices=("meta", "storage"), help="node type")


@command(
    "register-node",
    "pre-register a node, so that targets can be created on it before it starts",
    _register_args,
)
async def register_node(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    known = await _node(client, args.node_id)
    await client.register_node(args.node_id, NODE_TYPES[args.type])  # (another type: mgmtd refuses)
    if known is not None:  # said so, as enable-node says a node was not disabled
        return Result(
            value={"node_id": args.node_id, "type": args.type, "registered": False},
            message=f"{args.type} node {args.node_id} was registered already "
            f"({_node_status(known.status).lower()})",
        )
    return Result(
        value={"node_id": args.node_id, "type": args.type, "registered": True},
        message=f"{args.type} node {args.node_id} registered",
    )


async def _node(client: MgmtdClient, node_id: int) -> mgmtd_pb2.NodeInfo | None:
    """Node ``node_id`` as mgmtd lists it, None if it has no such node."""
    return next((n for n in await client.list_nodes() if n.node_id == node_id), None)


def _node_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("node_id", type=u32)


def _disable_args(p: argparse.ArgumentParser) -> None:
    _node_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="even if a chain would be left with no SERVING target (its data unavailable until "
        "enable-node), or no meta node active",
    )


@command(
    "disable-node",
    "take a node out of service until enable-node: its SERVING targets drain, then all go OFFLINE, "
    "and mgmtd refuses its heartbeats (for maintenance, or before replacing its disks)",
    _disable_args,
)
async def disable_node(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    nodes = await client.list_nodes()
    node = next((n for n in nodes if n.node_id == args.node_id), None)
    if node is not None and node.disabled:  # said so, as enable-node says a node was not disabled
        return Result(
            value={"node_id": args.node_id, "enabled": False, "draining": []},
            message=f"node {args.node_id} was disabled already",
        )
    if node is not None and node.type == common_pb2.NODE_META:
        return await _disable_meta_node(client, node, nodes, args.force)
    if node is not None and node.type != common_pb2.NODE_STORAGE:
        raise UsageError(
            f"node {args.node_id} is a {_node_type(node.type).lower()} node: only storage and meta "
            "nodes can be disabled"
        )
    mine = {t.target_id for t in await client.list_targets() if t.node_id == args.node_id}
    # a node holding a chain's last SERVING target is refused without --force (by mgmtd, as
    # offline-target refuses to take that target)
    async with _refused_without_force():
        await client.set_node_enabled(args.node_id, False, force=args.force)
    # one listing per poll, waiting for this node's targets only (see _drained)
    deadline = time.monotonic() + _DRAIN_WAIT_S
    while True:
        draining = sorted(
            d.target_id for c in await client.list_chains() for d in c.draining if d.target_id in mine
        )
        if not draining or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)
    value = {"node_id": args.node_id, "enabled": False, "draining": draining}
    if draining:
        return Result(
            value=value,
            message=f"node {args.node_id} disabled, but targets {' '.join(map(str, draining))} still "
            f"drain after {_DRAIN_WAIT_S:.0f} s (see list-chains)",
            status=1,
        )
    return Result(
        value=value,
        message=f"node {args.node_id} disabled: its targets are out of their chains until enable-node",
    )


async def _disable_meta_node(
    client: MgmtdClient, node: mgmtd_pb2.NodeInfo, nodes: list[mgmtd_pb2.NodeInfo], force: bool
) -> Result:
    """A meta node holds no targets: disabled, it leaves routing info's active meta nodes (mgmtd
    refuses its heartbeats), so clients that find meta through routing go to the others."""
    others = [
        n.node_id
        for n in nodes
        if n.type == common_pb2.NODE_META
        and n.node_id != node.node_id
        and n.status == mgmtd_pb2.NODE_STATUS_ACTIVE
        and not n.disabled
    ]
    # the only active meta node is refused without --force (by mgmtd, one request at a time)
    async with _refused_without_force():
        await client.set_node_enabled(node.node_id, False, force=force)
    return Result(
        value={"node_id": node.node_id, "enabled": False, "draining": []},
        message=f"node {node.node_id} disabled (a meta node: it has no targets): mgmtd refuses its "
        "heartbeats, and clients that find meta through routing "
        + (f"go to meta nodes {' '.join(map(str, others))}" if others else "find no meta node")
        + " until enable-node",
    )


@command(
    "enable-node",
    "put a disabled node back in service: its targets rejoin their chains as their daemon reports "
    "them, resyncing first",
    _node_arg,
)
async def enable_node(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    node = await _node(client, args.node_id)
    await client.set_node_enabled(args.node_id, True)  # an unknown node: mgmtd says so
    if node is not None and not node.disabled:
        return Result(
            value={"node_id": args.node_id, "enabled": True}, message=f"node {args.node_id} was not disabled"
        )
    what = (
        "mgmtd takes its heartbeats again, and clients that find meta through routing use it again"
        if node is not None and node.type == common_pb2.NODE_META
        else "its targets rejoin their chains (SYNCING, then SERVING)"
    )
    return Result(
        value={"node_id": args.node_id, "enabled": True}, message=f"node {args.node_id} enabled: {what}"
    )


def _unregister_args(p: argparse.ArgumentParser) -> None:
    _node_arg(p)
    p.add_argument(
        "--force", action="store_true", help="even while the node's daemon runs (it registers again)"
    )


@command(
    "unregister-node",
    "forget a node whose daemon is stopped for good (its targets must be removed first)",
    _unregister_args,
)
async def unregister_node(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    node = await _node(client, args.node_id)
    if node is not None and node.status == mgmtd_pb2.NODE_STATUS_ACTIVE and not args.force:
        # its next heartbeat registers it again: "unregistered" would have undone itself unseen
        raise UsageError(
            f"node {args.node_id} is ACTIVE (its daemon heartbeated {node.last_heartbeat_age_s:.0f} s "
            "ago): stop its daemon first, or it registers again at its next heartbeat; a stopped "
            "one is ACTIVE until mgmtd's heartbeat_timeout_s (10 s by default) has passed, then "
            "FAILED (--force to do it anyway)"
        )
    await client.unregister_node(args.node_id)
    return Result(value={"node_id": args.node_id}, message=f"node {args.node_id} unregistered")


def _target_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("target_id", type=natural)


@command("remove-target", "delete a target that is in no chain", _target_arg)
async def remove_target(conn: Connection, args: argparse.Namespace) -> Result:
    await conn.mgmtd_client().remove_target(args.target_id)
    return Result(value={"removed": args.target_id}, message=f"target {args.target_id} removed")


def _update_chain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("chain_id", type=u32)
    p.add_argument("target_id", type=natural)
    p.add_argument(
        "--mode", choices=("add", "remove"), required=True, help="add the target to the chain or remove it"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="remove even if the chain is left with one copy of its data, or none SERVING",
    )


@command("update-chain", "add a target to a chain or remove one from it", _update_chain_args)
async def update_chain(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    mode = mgmtd_pb2.CHAIN_UPDATE_ADD if args.mode == "add" else mgmtd_pb2.CHAIN_UPDATE_REMOVE
    async with _refused_without_force():  # a removal leaving fewer than two SERVING targets
        changed = await client.update_chain(args.chain_id, args.target_id, mode, force=args.force)
    chain = await _drained(conn, changed)
    return _chain_result(
        chain, f"target {args.target_id} {'added to' if args.mode == 'add' else 'removed from'} chain"
    )


@contextlib.asynccontextmanager
async def _refused_without_force() -> AsyncIterator[None]:
    """mgmtd's refusal of what --force would do (it checks, one admin request at a time) as a
    usage error, exit status 2: the command line is what to mend."""
    try:
        yield
    except FS3Error as e:
        if e.code == StatusCode.FAILED_PRECONDITION and "(--force to do it anyway)" in e.message:
            raise UsageError(e.message) from None
        raise


def _chain_id_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("chain_id", type=u32)


def _rotate_lastsrv_args(p: argparse.ArgumentParser) -> None:
    _chain_id_arg(p)
    p.add_argument(
        "--force",
        action="store_true",
        help="even though the LASTSRV target may hold writes no other target has (they are lost)",
    )


@command(
    "rotate-lastsrv",
    "make the next target of a chain with no SERVING target its LASTSRV (writes only the old LASTSRV "
    "holds are lost: for a target that will not come back)",
    _rotate_lastsrv_args,
)
async def rotate_lastsrv(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    if not args.force:
        # it said "LASTSRV rotated", and writes acknowledged while the LASTSRV target served alone
        # were gone without a word (helper review)
        chain = next((c for c in await client.list_chains() if c.chain_id == args.chain_id), None)
        last = chain and next((t for t in chain.targets if t.public_state == common_pb2.LASTSRV), None)
        if last:
            raise UsageError(
                f"target {last.target_id} is chain {args.chain_id}'s last server: writes acknowledged "
                "while it served alone are on it only, and are lost once another target serves in "
                f"its place; bring target {last.target_id} back instead if it can be (--force to do "
                "it anyway)"
            )
    chain = await client.rotate_lastsrv(args.chain_id)
    return _chain_result(chain, "LASTSRV rotated")


def _preferred_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("chain_id", type=u32)
    p.add_argument("target_ids", help="comma-separated target ids, head first")


@command(
    "set-preferred-order",
    "record the order a chain returns to (rotate-as-preferred-order applies it)",
    _preferred_args,
)
async def set_preferred_order(conn: Connection, args: argparse.Namespace) -> Result:
    tids = int_list(args.target_ids, "target_ids")
    chain = await conn.mgmtd_client().set_preferred_order(args.chain_id, tids)
    return _chain_result(chain, "preferred order set")


@command(
    "rotate-as-preferred-order", "reorder a chain's SERVING targets as its preferred order", _chain_id_arg
)
async def rotate_as_preferred_order(conn: Connection, args: argparse.Namespace) -> Result:
    chain = await _drained(conn, await conn.mgmtd_client().rotate_as_preferred_order(args.chain_id))
    order = [t.target_id for t in chain.targets]
    if list(chain.preferred_order) and order != list(chain.preferred_order):
        # mgmtd moves one target a step (it rejoins at the tail and resyncs): not there yet
        return _chain_result(
            chain, "moved a step toward the preferred order; run this again once the chain is SERVING"
        )
    return _chain_result(chain, "rotated to the preferred order")


# -- users ----------------------------------------------------------------------------------------


def _user_add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("uid", type=u32)
    p.add_argument("name", type=utf8_text)
    p.add_argument("--gid", type=u32, default=None, help="primary group (default: the uid)")
    p.add_argument("--groups", default="", help="comma-separated supplementary groups")
    p.add_argument("--admin", action="store_true", help="may use the admin API")
    p.add_argument("--root", action="store_true", help="may act as any uid towards meta")
    _token_out(p)


@command("user-add", "create a user and issue its first token", _user_add_args)
async def user_add(conn: Connection, args: argparse.Namespace) -> Result:
    groups = int_list(args.groups, "--groups", u32)
    gid = args.uid if args.gid is None else args.gid
    with _token_out_ready(args.token_out):
        token = await conn.mgmtd_client().add_user(args.uid, args.name, gid, groups, args.admin, args.root)
    return _token_result(
        token, args, {"uid": args.uid, "name": args.name}, f"user {args.name} (uid {args.uid}) added"
    )


def _user_fields(u: mgmtd_pb2.User) -> dict[str, Any]:
    return {
        "uid": u.uid,
        "name": u.name,
        "gid": u.gid,
        "groups": list(u.groups),
        "admin": u.admin,
        "root": u.root,
    }


def _utc(t: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    except (OverflowError, OSError, ValueError):  # (a date no calendar here holds: an older build's)
        return f"{t:.0f} s after the epoch"


def _token_fields(u: mgmtd_pb2.User) -> dict[str, Any]:
    """A user's live tokens: how many, the first to expire (the table's column), and each one."""
    expiring = [t.expires_at for t in u.tokens if t.expires_at]
    if not u.token_count:
        first = "-"
    else:
        first = _utc(min(expiring)) if expiring else "never"
    return {
        "tokens": u.token_count,
        "first_expiry": first,
        "token_list": [
            {"created": _utc(t.created_at), "expires": _utc(t.expires_at) if t.expires_at else "never"}
            for t in u.tokens
        ],
    }


@command("user-list", "users with groups and flags, and when their tokens expire")
async def user_list(conn: Connection, args: argparse.Namespace) -> Result:
    rows = [
        {**_user_fields(u), **_token_fields(u)}
        for u in sorted(await conn.mgmtd_client().list_users(), key=lambda u: u.uid)
    ]
    return Result(rows, ["uid", "name", "gid", "groups", "admin", "root", "tokens", "first_expiry"])


def _user_set_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("uid", type=u32)
    p.add_argument("--name", type=utf8_text, default=None, help="a new name")
    p.add_argument("--gid", type=u32, default=None, help="a new primary group")
    p.add_argument(
        "--groups",
        default=None,
        help="the supplementary groups, comma-separated, in place of its own ('' = none)",
    )
    p.add_argument(
        "--admin", action=argparse.BooleanOptionalAction, default=None, help="may use the admin API"
    )
    p.add_argument(
        "--root", action=argparse.BooleanOptionalAction, default=None, help="may act as any uid towards meta"
    )


@command("user-set", "change a user's name, groups or flags; its tokens stay valid", _user_set_args)
async def user_set(conn: Connection, args: argparse.Namespace) -> Result:
    if args.name == "":  # mgmtd reads an empty name as "unchanged"
        raise UsageError("--name '': a user name is 1..255 bytes without '/' or NUL")
    req = mgmtd_pb2.SetUserRequest(uid=args.uid, name=args.name)
    if args.gid is not None:
        req.gid = args.gid
    if args.groups is not None:
        req.set_groups = True
        req.groups.extend(int_list(args.groups, "--groups", u32) if args.groups.strip() else [])
    if args.admin is not None:
        req.admin = args.admin
    if args.root is not None:
        req.root = args.root
    if not (
        args.name is not None
        or args.gid is not None
        or req.set_groups
        or req.HasField("admin")
        or req.HasField("root")
    ):
        raise UsageError("name at least one of --name, --gid, --groups, --admin/--no-admin, --root/--no-root")
    u = await conn.mgmtd_client().set_user(req)
    return Result(
        value=_user_fields(u),
        message=f"user {u.name} (uid {u.uid}) changed{_CACHED.replace('takes it', 'acts on what it knew')}",
    )


def _user_token_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("uid", type=u32)
    p.add_argument("--ttl", type=seconds, default=0.0, help="seconds the token is valid (default: no expiry)")
    p.add_argument("--invalidate", action="store_true", help="revoke the user's other tokens")
    p.add_argument(
        "--force",
        action="store_true",
        help="--invalidate: also when that revokes the token this command uses",
    )
    _token_out(p)


def _own_token(conn: Connection, uid: int) -> bool:
    """Whether this command runs with a token of ``uid`` (a local cluster's mount uses it too)."""
    return bool(conn.token) and (conn.token or "").startswith(f"{TOKEN_PREFIX}.{uid}.")


def _refuse_own_token(conn: Connection, uid: int, what: str) -> None:
    if _own_token(conn, uid):
        raise UsageError(
            f"{what} revokes the token this command uses ({conn.token_source or 'given'}): the next "
            "admin command, and a mount using the same token (a local cluster's does), would be "
            "refused. Give the new token to them first, or pass --force"
        )


@command("user-token", "issue a new token for a user", _user_token_args)
async def user_token(conn: Connection, args: argparse.Namespace) -> Result:
    client = conn.mgmtd_client()
    note = ""
    if args.invalidate:
        if not args.force:
            _refuse_own_token(conn, args.uid, f"user-token {args.uid} --invalidate")
    elif (await client.get_user(args.uid)).token_count >= MAX_TOKENS_PER_USER:
        if not args.force:  # the oldest may be the one in use here
            _refuse_own_token(conn, args.uid, f"a 17th token for uid {args.uid} (its oldest goes)")
        note = (
            f"; its oldest token was revoked: a user keeps at most {MAX_TOKENS_PER_USER}, and a job "
            "still using that one is refused from now on (see user-list)"
        )
    with _token_out_ready(args.token_out):
        token = await client.issue_token(args.uid, args.ttl, args.invalidate)
    what = f"token issued for uid {args.uid}" + (
        f", valid {args.ttl:g} s (until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() + args.ttl))})"
        if args.ttl
        else ""
    )
    return _token_result(
        token,
        args,
        {"uid": args.uid},
        what + (f", the others revoked{_CACHED}" if args.invalidate else "") + note,
    )


# what a removal or revocation of tokens leaves for a while (fs3.net.auth.TokenCache)
_CACHED = (
    f" (a server that checked one of its tokens in the last {TOKEN_CACHE_S:.0f} s takes it until "
    f"its cache of token checks expires, a connection open on it until its next check up to "
    f"{USER_RECHECK_S:.0f} s later: {TOKEN_CACHE_S + USER_RECHECK_S:.0f} s in all; and one that "
    "cannot reach mgmtd then, until it can, for up to its token_stale_s, "
    f"{TOKEN_STALE_S / 3600:g} h by default)"
)


def _uid_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("uid", type=u32)


def _user_remove_args(p: argparse.ArgumentParser) -> None:
    _uid_arg(p)
    p.add_argument("--force", action="store_true", help="also when it is the user this command runs as")


@command("user-remove", "delete a user and its tokens", _user_remove_args)
async def user_remove(conn: Connection, args: argparse.Namespace) -> Result:
    if not args.force:
        _refuse_own_token(conn, args.uid, f"user-remove {args.uid}")
    await conn.mgmtd_client().remove_user(args.uid)
    return Result(value={"removed": args.uid}, message=f"user {args.uid} removed{_CACHED}")


# -- configs --------------------------------------------------------------------------------------


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("get", "set"), help="get: print the stored config; set: upload FILE")
    p.add_argument("service", choices=sorted(NODE_TYPES), help="which service's config")
    p.add_argument("file", nargs="?", help="set: the TOML file (checked like the service would)")
    p.add_argument("--version", type=natural, default=None, help="get: that version (default newest)")
    p.add_argument("--desc", type=utf8_text, default="", help="set: description of the change")


@command(
    "config",
    "get or set the config mgmtd stores and pushes for a service type (nodes apply what they can while "
    "running: log.level; meta capability_ttl_s, idem_ttl_s; storage forward_timeout_s, keep_free)",
    _config_args,
)
async def config(conn: Connection, args: argparse.Namespace) -> Result:
    from fs3.config import SERVICE_CONFIGS, load_config

    client = conn.mgmtd_client()
    node_type = NODE_TYPES[args.service]
    if args.action == "get":
        if args.file:
            raise UsageError("config get takes no FILE (it prints the stored config)")
        info = await client.get_config(node_type, args.version or 0)
        if info is None:  # a version asked for and missing is NOT_FOUND, raised above
            return Result(
                value={"service": args.service, "version": 0, "content": ""},
                message=f"no {args.service} config stored in mgmtd: {args.service} nodes run on their "
                f"own config files ('fs3 admin config set {args.service} FILE' stores one to push)",
            )
        value = {
            "service": args.service,
            "version": info.version,
            "description": info.description,
            "content": info.content,
        }
        return Result(
            value=value,
            message=f"# {args.service} config version {info.version}"
            f"{': ' + info.description if info.description else ''}\n{info.content.rstrip()}",
        )
    if not args.file:
        raise UsageError("config set needs a FILE")
    if args.version is not None:  # versions are mgmtd's to number: set stores the next one
        raise UsageError("--version is for config get; config set stores the next version")
    try:  # refuse what the service would: a file to mend, exit 2 like the other usage errors
        load_config(SERVICE_CONFIGS[args.service], args.file, environ={})
    except FS3Error as e:
        if e.code != StatusCode.CONFIG_INVALID:
            raise
        raise UsageError(e.message) from None
    content = _read_text(args.file)
    try:
        version = await client.set_config(node_type, content, args.desc)
    except FS3Error as e:
        if e.code != StatusCode.CONFIG_INVALID:  # what only mgmtd checks: per-node keys, sizes
            raise
        raise UsageError(e.message) from None
    if args.service == "mgmtd":
        applied = "mgmtd applies none of it while running (its own config file says how it runs)"
    else:
        applied = (
            f"{args.service} nodes apply the settings they can change while running at their next "
            "heartbeat (mounts: session extension) and log which; the rest takes effect from each "
            "node's own config file at a restart"
        )
    return Result(
        value={"service": args.service, "version": version},
        message=f"{args.service} config version {version} stored; {applied}",
    )
