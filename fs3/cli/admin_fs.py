"""File commands of ``fs3 admin``: ls, stat (with the chunk → chain → target layout), checksum
of every replica of a file's chunks, gc-list, and set-layout (a directory's default layout for
the files created in it later: what a FUSE mount cannot set).

They speak fs3 RPC to meta and storage, which takes the cluster secret (``--secret-file``) for the
connection and the token's user for permissions. Meta servers are found in mgmtd's routing info.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat as stat_mod
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

from fs3.cli import parse_size
from fs3.cli.admin import (
    EX_MISMATCH,
    EX_UNAVAILABLE,
    Connection,
    Progress,
    Result,
    UsageError,
    command,
    natural,
    positive,
    u32,
)
from fs3.errors import FS3Error, StatusCode, shown_name
from fs3.net.transport import format_address
from fs3.proto import common_pb2

TYPE_NAMES = {1: "file", 2: "dir", 3: "symlink"}


@contextlib.asynccontextmanager
async def filesystem(conn: Connection) -> AsyncIterator[Any]:
    """(routing cache, meta client, storage client) for the connection's user."""
    from fs3.client.meta_client import MetaClient
    from fs3.client.routing import RoutingCache
    from fs3.client.storage_client import RetryPolicy, StorageClient
    from fs3.net import RpcClient

    mgmtd = conn.mgmtd_client()
    user = common_pb2.UserInfo()
    if conn.token:
        u = await mgmtd.verify_token(conn.token)
        user = common_pb2.UserInfo(uid=u.uid, gid=u.gid, groups=list(u.groups), token=conn.token)
    routing = RoutingCache(mgmtd, refresh_interval_s=5.0)
    await routing.start(first_timeout_s=conn.timeout_s)
    metas = routing.routing.nodes_of_type(common_pb2.NODE_META)
    addresses = [
        format_address(e.host, e.port) for n in metas for e in n.endpoints if e.transport in ("", "tcp")
    ]
    if not addresses:
        await routing.stop()
        raise FS3Error(StatusCode.UNAVAILABLE, "no active meta server in routing info")
    from fs3.client.meta_client import DEV_SECRET

    rpc = RpcClient(conn.secret or DEV_SECRET, identity="fs3-admin")
    meta = MetaClient(addresses, user=user, rpc=rpc, timeout_s=conn.timeout_s)
    storage = StorageClient(
        routing,
        rpc,
        user=user,
        retry=RetryPolicy(total_s=conn.timeout_s, rpc_timeout_s=min(10.0, conn.timeout_s)),
    )
    try:
        yield routing, meta, storage
    except FS3Error as e:
        if e.code != StatusCode.RPC_AUTH_FAILED or conn.secret:
            raise
        # the development secret was tried, as for a cluster run without one: this one has its own
        raise UsageError(
            "this command reaches meta and storage as a cluster member, with the cluster secret: "
            "give it with --secret-file, $FS3_CLUSTER_SECRET_FILE or --local-dir"
        ) from None
    finally:
        await meta.close()
        await routing.stop()
        await rpc.close()


def fs3_path(text: str) -> str:
    """An argparse type: a path inside fs3, not empty (meta takes the empty path for the root: a
    script's unset ``$DIR`` changed the root's layout)."""
    if not text:
        raise argparse.ArgumentTypeError("the empty path names nothing (the root is /)")
    return text


def _path_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=fs3_path, help="path inside fs3 (absolute, from its root)")


def _mode_string(inode: Any) -> str:
    kind = {1: stat_mod.S_IFREG, 2: stat_mod.S_IFDIR, 3: stat_mod.S_IFLNK}.get(inode.type, 0)
    return stat_mod.filemode(kind | inode.mode)


def _ts(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def _ls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", default="/", type=fs3_path, help="directory or file (default /)")


@command("ls", "list a directory with mode, owner, size and time", _ls_args)
async def ls(conn: Connection, args: argparse.Namespace) -> Result:
    async with filesystem(conn) as (_routing, meta, _storage):
        node = await meta.lookup_path(args.path.encode())
        if node.type != 2:
            entries = [(args.path.rsplit("/", 1)[-1], node)]
        else:
            names = [e async for e in meta.listdir(node.id)]
            inodes = await meta.batch_stat([e.inode_id for e in names]) if names else []
            # names as text that tells them apart (not UTF-8, a newline: escaped, as ls -b shows them)
            entries = [(shown_name(e.name), i) for e, i in zip(names, inodes, strict=True)]
    rows = []
    for name, ino in entries:
        if isinstance(ino, FS3Error):  # removed between readdir and stat
            continue
        rows.append(
            {
                "mode": _mode_string(ino),
                "uid": ino.uid,
                "gid": ino.gid,
                "size": ino.size,
                "mtime": _ts(ino.mtime_ns),
                "inode": ino.id,
                "name": name,
                "type": TYPE_NAMES.get(ino.type, str(ino.type)),
            }
        )
    return Result(rows, ["mode", "uid", "gid", "size", "mtime", "inode", "name"])


def _stat_args(p: argparse.ArgumentParser) -> None:
    _path_arg(p)
    p.add_argument("--layout", action="store_true", help="also each chunk's chain and that chain's targets")
    p.add_argument(
        "--max-chunks", type=natural, default=64, help="with --layout, at most this many chunks (default 64)"
    )


def _set_layout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", type=fs3_path, help="a directory inside fs3 (absolute, from its root)")
    p.add_argument(
        "--chunk-size",
        type=parse_size,
        default=None,
        help="chunk size of files created in it later: a power of two from 64K to 64M",
    )
    p.add_argument(
        "--stripe", type=natural, default=None, help="chains each file created in it later spreads over"
    )
    p.add_argument(
        "--chain-table", type=u32, default=None, help="chain table those files take their chains from"
    )


@command(
    "set-layout",
    "a directory's default layout (chunk size, stripe, chain table) for files created in it later",
    _set_layout_args,
)
async def set_layout(conn: Connection, args: argparse.Namespace) -> Result:
    if args.chunk_size is None and args.stripe is None and args.chain_table is None:
        raise UsageError("name at least one of --chunk-size, --stripe, --chain-table")
    # 0 is what the request says for "keep this one": given, it was taken for not given at all
    for flag, value, top in (
        ("--stripe", args.stripe, 1 << 32),
        ("--chain-table", args.chain_table, 1 << 32),
        ("--chunk-size", args.chunk_size, 1 << 63),
    ):
        if value is not None and not 0 < value < top:
            raise UsageError(f"{flag} must be from 1 to {top - 1}, not {value}")
    async with filesystem(conn) as (routing, meta, _storage):
        node = await meta.lookup_path(args.path.encode())
        ino = await meta.set_layout(node.id, args.chain_table or 0, args.chunk_size or 0, args.stripe or 0)
        lay = ino.layout
        try:
            chains = (
                len(routing.routing.chain_table(lay.chain_table_id).chain_ids) if lay.chain_table_id else 0
            )
        except FS3Error:  # a table mgmtd does not know (yet)
            chains = 0
    value = {
        "path": args.path,
        "chunk_size": lay.chunk_size,
        "stripe_count": lay.stripe_count,
        "chain_table": lay.chain_table_id,
    }
    stripe = str(lay.stripe_count or "the default")
    if chains and lay.stripe_count > chains:
        # meta keeps the stripe asked for and gives each new file at most every chain of its
        # table (meta.layout.ChainAllocator): say what files get now
        value["files_stripe"] = chains
        stripe = (
            f"{chains}, not {lay.stripe_count} (chain table {lay.chain_table_id} has {chains} "
            f"chain{'s' if chains != 1 else ''} and a file takes each at most once; the directory "
            f"keeps {lay.stripe_count} for when the table grows)"
        )
    message = (
        f"{args.path}: files created here get chunk size {lay.chunk_size or 'the default'}, "
        f"stripe {stripe}, chain table {lay.chain_table_id or 'the default'}"
    )
    return Result(value=value, message=message)


def _chunk_count(size: int, chunk_size: int) -> int:
    return (size + chunk_size - 1) // chunk_size if chunk_size else 0


@command("stat", "an inode's attributes; --layout: chunks -> chains -> targets", _stat_args)
async def stat(conn: Connection, args: argparse.Namespace) -> Result:
    async with filesystem(conn) as (routing, meta, _storage):
        ino = await meta.lookup_path(args.path.encode(), follow=False)
        r = routing.routing
    value: dict[str, Any] = {
        "path": args.path,
        "inode": ino.id,
        "type": TYPE_NAMES.get(ino.type, str(ino.type)),
        "mode": f"{ino.mode:04o}",
        "uid": ino.uid,
        "gid": ino.gid,
        "nlink": ino.nlink,
        "size": ino.size,
        "atime": _ts(ino.atime_ns),
        "mtime": _ts(ino.mtime_ns),
        "ctime": _ts(ino.ctime_ns),
    }
    lines = [f"{k}: {v}" for k, v in value.items()]
    lay = ino.layout
    if ino.HasField("layout") and lay.chains:
        value["layout"] = {
            "chain_table": lay.chain_table_id,
            "chain_table_version": lay.chain_table_version,
            "chunk_size": lay.chunk_size,
            "stripe": lay.stripe_count,
            "chains": list(lay.chains),
            "shuffle_seed": lay.shuffle_seed,
        }
        lines.append(
            f"layout: chain table {lay.chain_table_id} v{lay.chain_table_version}, chunk size {lay.chunk_size}, "
            f"stripe {lay.stripe_count}, chains {','.join(map(str, lay.chains))}"
        )
    if args.layout and lay.chains and lay.chunk_size:
        chunks = []
        total = _chunk_count(ino.size, lay.chunk_size)
        for index in range(min(total, args.max_chunks)):
            chain_id = lay.chains[index % len(lay.chains)]
            chain = r.chains.get(chain_id)
            targets = []
            if chain is not None:
                for t in chain.targets:
                    info = r.targets.get(t.target_id)
                    targets.append(
                        {
                            "target_id": t.target_id,
                            "state": common_pb2.PublicTargetState.Name(t.public_state),
                            "node_id": info.node_id if info is not None else 0,
                        }
                    )
            chunks.append(
                {"index": index, "offset": index * lay.chunk_size, "chain_id": chain_id, "targets": targets}
            )
            shown = " -> ".join(f"{t['target_id']}@{t['node_id']}({t['state']})" for t in targets)
            lines.append(f"  chunk {index} @ {index * lay.chunk_size}: chain {chain_id}: {shown}")
        if total > args.max_chunks:
            lines.append(f"  ... {total - args.max_chunks} more chunks (--max-chunks)")
        value["chunks"] = chunks
    return Result(value=value, message="\n".join(lines))


def compare_replicas(
    index: int,
    chain_id: int,
    chain_targets: list[int],
    found: dict[int, Any],
    damaged: dict[int, str] | None = None,
    unreachable: Collection[int] = (),
) -> dict[str, Any]:
    """One chunk's row: ``ok`` when every target of its chain holds the same committed version,
    length and CRC32C, or none holds the chunk (a hole); ``MISMATCH`` otherwise; ``DAMAGED`` when
    they agree but some replica's bytes cannot be read back as its metadata says; ``unverified``
    when the replicas that answered agree but some could not be asked (``unreachable``: a daemon
    down is no sign of lost data, its copy is shown as unreachable, not missing). ``found`` maps a
    target id to its ChunkMeta for this chunk, ``damaged`` a target id to what reading it found."""
    damaged = damaged or {}
    asked = [t for t in chain_targets if t not in unreachable]
    states = {(m.committed_version, m.length, m.crc32c) for m in found.values()}
    complete = all(t in found for t in asked)
    ok = not found or (len(states) == 1 and complete)
    replicas = []
    for t in chain_targets:
        if t in unreachable:
            replicas.append(f"{t}:unreachable")
            continue
        if t not in found:
            replicas.append(f"{t}:missing")
            continue
        m = found[t]
        bad = f" DAMAGED ({damaged[t]})" if t in damaged else ""
        replicas.append(f"{t}:v{m.committed_version}/{m.length}/{m.crc32c:08x}{bad}")
    return {
        "chunk": index,
        "chain_id": chain_id,
        "status": "MISMATCH"
        if not ok
        else "DAMAGED"
        if damaged
        else "unverified"
        if len(asked) < len(chain_targets)
        else "ok",
        "replicas": replicas,
    }


class _NotReadBack(Exception):
    """A replica's copy that could not be read back now, for a reason other than damage."""


async def _read_back(storage: Any, chain_id: int, target_id: int, m: Any) -> str | None:
    """Read ``target_id``'s copy of the chunk ``m`` (its ChunkMeta) describes: None when its bytes
    are its committed version's (the daemon checks every block's CRC32C, and the whole chunk's
    is checked here), else what is wrong. Errors of reaching the daemon are raised."""
    from fs3.client.storage_client import STORAGE_SERVICE, crc32c, node_address
    from fs3.proto import storage_pb2

    routing = storage.routing.routing
    req = storage_pb2.BatchReadReq()
    io = req.ios.add(offset=0, length=m.length)
    io.key.chain_id = chain_id
    io.key.chain_version = routing.chain(chain_id).version
    io.key.inode_id, io.key.chunk_index = m.key.inode_id, m.key.chunk_index
    rsp, payload = await storage.rpc.call(
        node_address(routing, target_id),
        STORAGE_SERVICE["BatchRead"],
        req,
        timeout=storage.retry.rpc_timeout_s,
    )
    res = rsp.results[0]
    if res.status.code == StatusCode.STORAGE_CHECKSUM_MISMATCH:
        return res.status.message or StatusCode.STORAGE_CHECKSUM_MISMATCH.name
    if res.status.code != StatusCode.OK:
        # not readable there now (a SYNCING target, the chunk removed or cut meanwhile): not read
        # back, which the report says; the metadata comparison still covers it
        raise _NotReadBack(f"{target_id}/chunk {m.key.chunk_index}: {StatusCode(res.status.code).name}")
    if res.committed_version != m.committed_version:
        return None  # written since its metadata was listed: not this check's to judge
    data = payload[res.payload_offset : res.payload_offset + res.length] if payload else b""
    if len(data) != m.length or crc32c(data) != m.crc32c:
        return f"read back {len(data)} bytes of CRC32C {crc32c(data):08x}"
    return None


def _checksum_args(p: argparse.ArgumentParser) -> None:
    _path_arg(p)
    p.add_argument(
        "--metadata-only",
        action="store_true",
        help="compare the replicas' chunk metadata only, without reading every replica's bytes back",
    )


@command(
    "checksum",
    "compare every replica of every chunk of a file (version, length, CRC32C) and read each back",
    _checksum_args,
)
async def checksum(conn: Connection, args: argparse.Namespace) -> Result:
    async with filesystem(conn) as (routing, meta, storage):
        ino = await meta.lookup_path(args.path.encode())
        if ino.type != 1:
            raise UsageError(f"{args.path} is not a regular file")
        lay = ino.layout
        r = routing.routing
        total = _chunk_count(ino.size, lay.chunk_size)
        chains = sorted(set(lay.chains[: min(total, len(lay.chains))]))
        targets = [(cid, t.target_id) for cid in chains for t in r.chain(cid).targets]
        progress = Progress(f"checksum {args.path}", len(targets))
        replicas: dict[int, dict[int, Any]] = {}  # chunk index → target → meta
        unreachable: list[str] = []
        unreachable_ids: set[int] = set()
        not_read: list[str] = []  # copies not read back now (see _read_back)
        damaged: dict[int, dict[int, str]] = {}  # chunk index → target → what reading it found
        for cid, tid in targets:
            try:
                metas = [cm for cm in await storage.dump_chunk_meta(tid, ino.id) if cm.key.chain_id == cid]
                for cm in metas:
                    replicas.setdefault(cm.key.chunk_index, {})[tid] = cm
                    # a copy the daemon knows it cannot read (a data file missing at its start)
                    if cm.damaged:
                        damaged.setdefault(cm.key.chunk_index, {})[tid] = "its data file is missing"
                if not args.metadata_only:
                    for cm in metas:
                        if cm.length and tid not in damaged.get(cm.key.chunk_index, {}):
                            try:
                                why = await _read_back(storage, cid, tid, cm)
                            except _NotReadBack as e:
                                not_read.append(str(e))
                                continue
                            if why is not None:
                                damaged.setdefault(cm.key.chunk_index, {})[tid] = why
            except FS3Error as e:
                unreachable.append(f"{tid}: {e}")
                unreachable_ids.add(tid)
                for per_chunk in replicas.values():  # what it listed before it failed is not judged
                    per_chunk.pop(tid, None)
            progress.step()
        progress.finish()
    # the chunks some replica holds: a hole (a chunk none holds) is not listed, so that the check
    # of a sparse file costs what it holds, not its length (one of 256 TiB with 2 chunks never
    # ended, making a row for each of its 4 billion chunk places)
    rows = []
    for index in sorted(i for i in replicas.keys() | damaged.keys() if i < total):
        cid = lay.chains[index % len(lay.chains)]
        chain_targets = [t.target_id for t in r.chain(cid).targets]
        rows.append(
            compare_replicas(
                index, cid, chain_targets, replicas.get(index, {}), damaged.get(index), unreachable_ids
            )
        )
    mismatches = sum(row["status"] in ("MISMATCH", "DAMAGED") for row in rows)
    unverified = sum(row["status"] == "unverified" for row in rows)
    # differences found: 3; none, but not every replica could be asked: 69 (try again later)
    status = EX_MISMATCH if mismatches else EX_UNAVAILABLE if unreachable else 0
    if args.json:
        report = {
            "path": args.path,
            "inode": ino.id,
            "chunks": rows,
            "mismatches": mismatches,
            "unverified": unverified,
            "unreachable": unreachable,
            "not_read_back": not_read,
        }
        return Result(value=report, status=status)
    summary = (
        f"{args.path}: {len(rows)} chunks held (its length spans {total}) on {len(chains)} chains, "
        f"{len(targets)} targets asked, "
        f"{mismatches} chunks differ or are damaged"
        + (f", {unverified} not compared on every replica" if unverified else "")
        + (f"; unreachable: {'; '.join(unreachable)}" if unreachable else "")
        + (f"; not read back now: {'; '.join(not_read)}" if not_read else "")
    )
    return Result(rows, ["chunk", "chain_id", "status", "replicas"], message=summary, status=status)


#: client ids gc-list shows per entry, of those holding its file open
_GC_SESSIONS_SHOWN = 3


def _gc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-path", help="the lmdb store of meta (default: the local cluster's)")
    p.add_argument("--engine", default="lmdb", choices=("lmdb", "fdb"), help="store engine (default lmdb)")
    p.add_argument("--cluster-file", default="", help="fdb: cluster file")
    p.add_argument("--limit", type=positive, default=1000, help="at most this many entries (default 1000)")


@command(
    "gc-list", "files and directories waiting for the garbage collector (reads the meta store)", _gc_args
)
async def gc_list(conn: Connection, args: argparse.Namespace) -> Result:
    from fs3.kv import open_database
    from fs3.kv.base import prefix_end
    from fs3.meta import schema
    from fs3.proto import meta_pb2

    if args.engine == "lmdb":
        path = args.kv_path or (str(conn.local_dir / "kv") if conn.local_dir is not None else "")
        if not path:
            raise UsageError("give --kv-path (the directory of meta's lmdb store)")
        if not os.path.isfile(os.path.join(path, "data.mdb")):  # noqa: ASYNC240 (one stat; make none)
            raise UsageError(f"--kv-path {path}: no lmdb store there (no data.mdb)")
        db = await open_database("lmdb", path=path)
    else:
        if args.kv_path:
            raise UsageError("--kv-path is for --engine lmdb; fdb takes --cluster-file")
        db = await open_database("fdb", cluster_file=args.cluster_file or None)
    try:

        async def scan(tr):  # type: ignore[no-untyped-def]
            """Each entry, with its inode (None once gone) and the client ids of its sessions."""
            rv = tr.snapshot
            out = []
            for _key, value in await rv.get_range(schema.GCQU, prefix_end(schema.GCQU), args.limit):
                e = meta_pb2.GcEntry.FromString(value)
                raw = await rv.get(schema.inode_key(e.inode_id))
                sprefix = schema.session_prefix(e.inode_id)
                sessions = await rv.get_range(sprefix, prefix_end(sprefix), _GC_SESSIONS_SHOWN + 1)
                clients = [meta_pb2.FileSession.FromString(v).client_id for _k, v in sessions]
                out.append((e, meta_pb2.Inode.FromString(raw) if raw is not None else None, clients))
            return out

        entries = await db.run(scan, read_only=True)
    finally:
        await db.close()
    now = time.time_ns()
    rows = []
    for e, ino, clients in entries:
        if clients:
            state = "open"  # the collector waits for the last close
        elif ino is None:
            state = "removed"  # its chunks and inode are gone; the entry goes next
        elif ino.collecting:
            state = "removing"  # claimed: its chunks are being removed
        else:
            state = "waiting"  # for gc_grace_s after the unlink, then the collector's next round
        shown = ",".join(str(c) for c in clients[:_GC_SESSIONS_SHOWN])
        rows.append(
            {
                "inode": e.inode_id,
                "type": TYPE_NAMES.get(e.type, str(e.type)),
                "queued": _ts(e.queued_ns) if e.queued_ns else "",
                "waiting_s": round((now - e.queued_ns) / 1e9, 1) if e.queued_ns else "",
                "state": state,
                # the clients holding it open (their sessions), the first few
                "open_by": shown + (",..." if len(clients) > _GC_SESSIONS_SHOWN else ""),
                # collected; its chunks are removed once more then (a write capability of it lapsed)
                "second_pass": _ts(e.sweep_after_ns) if e.sweep_after_ns else "",
            }
        )
    columns = ["inode", "type", "queued", "waiting_s", "state", "open_by", "second_pass"]
    return Result(rows, columns, message="" if rows else "GC queue is empty")
