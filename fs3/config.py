"""Configuration: one dataclass per service, loaded from TOML, overridable from the environment.

Every field has a default, so a local cluster needs no file at all. A TOML file sets fields by name;
nested dataclasses are TOML tables (``[kv]``). Loading rejects, naming the key and the file:
unknown keys, values of the wrong type, and values a field's ``check`` refuses.

Environment overrides win over the file: ``FS3_<FIELD>`` for a top-level field and
``FS3_<TABLE>__<FIELD>`` for a field of a table (``FS3_KV__ENGINE=lmdb``, ``FS3_LISTEN_PORT=9000``).
Values are parsed as TOML values where that parses (numbers, booleans, ``["a", "b"]``) and taken as
plain strings otherwise. ``FS3_*`` variables that name no field of the service being configured are
ignored, since one environment often serves several services.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fs3.errors import FS3Error, StatusCode

C = TypeVar("C")

ENV_PREFIX = "FS3_"


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be > 0"


#: node ids travel as uint32 (NodeInfo.node_id), target ids as uint64
MAX_NODE_ID = (1 << 32) - 1
MAX_TARGET_ID = (1 << 64) - 1


def _node_id(v: Any) -> str | None:
    return None if 0 < v <= MAX_NODE_ID else f"must be from 1 to {MAX_NODE_ID}"


def _seconds(v: Any) -> str | None:
    """A duration: more than 0 and at most 10^9 s (31 years; beyond it a TTL overflows where it
    becomes nanoseconds)."""
    return None if 0 < v <= 1e9 else "must be > 0 and at most 1e9 (seconds)"


def _seconds_or_zero(v: Any) -> str | None:
    """A duration that may be 0 (none), at most 10^9 s (see _seconds)."""
    return None if 0 <= v <= 1e9 else "must be >= 0 and at most 1e9 (seconds)"


def _non_negative(v: Any) -> str | None:
    return None if v >= 0 else "must be >= 0"


def _fraction(v: Any) -> str | None:
    return None if 0 <= v < 1 else "must be a fraction 0 <= x < 1"


def _chunk_size(v: Any) -> str | None:
    ok = isinstance(v, int) and 64 << 10 <= v <= 64 << 20 and v & (v - 1) == 0
    return None if ok else "must be a power of two from 65536 (64 KiB) to 67108864 (64 MiB)"


def _port(v: Any) -> str | None:
    return None if 0 <= v <= 65535 else "must be a port number 0..65535 (0 = any free port)"


def _map_size(v: Any) -> str | None:
    """An LMDB map size: address space, so at most 2^46 bytes (64 TiB; an x86-64 process has
    128 TiB of it, and py-lmdb overflows on larger numbers)."""
    return None if 0 < v <= 1 << 46 else "must be > 0 and at most 2^46 bytes (64 TiB of address space)"


def _host_port(v: str) -> str | None:
    host, sep, port = v.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"has {v!r}, not host:port with a port 1..65535"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return f"has {v!r}: an IPv6 address goes in brackets, as in [::1]:8000"
    return None


def _addresses(v: Any) -> str | None:
    """A list of ``host:port`` addresses (``[v6]:port`` too), possibly empty."""
    return next((why for a in v if (why := _host_port(a))), None)


def _some_addresses(v: Any) -> str | None:
    """A list of ``host:port`` addresses, at least one."""
    return _addresses(v) if v else "must name at least one host:port"


def _choice(*allowed: str):
    def check(v: Any) -> str | None:
        return None if v in allowed else f"must be one of {', '.join(allowed)}"

    return check


def _log_level(v: Any) -> str | None:
    return (
        None
        if str(v).upper() in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
        else ("must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    )


def opt(default: Any = dataclasses.MISSING, *, doc: str, check=None, factory=None):
    """A config field with documentation (shown by ``fs3 config-template``) and an optional check."""
    meta = {"doc": doc, "check": check}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(slots=True)
class KvConfig:
    engine: str = opt(
        "lmdb", doc="metadata store engine: lmdb (embedded), fdb or mem", check=_choice("lmdb", "fdb", "mem")
    )
    path: str = opt("", doc="lmdb: directory of the environment (shared by mgmtd and meta on one host)")
    cluster_file: str = opt("", doc="fdb: path of the FoundationDB cluster file ('' = the default)")
    group_commit_interval_ms: float = opt(
        2.0,
        doc="lmdb: longest wait for acknowledged callers to rejoin the next commit batch (0 = overlap batches)",
        check=_non_negative,
    )
    map_size: int = opt(
        256 << 30,
        doc="lmdb: largest size of the store in bytes (address space only: the file grows with the "
        "data; a file's metadata takes about 0.3 KiB, so the default holds several hundred million "
        "files); a full store fails every write",
        check=_map_size,
    )


@dataclass(slots=True)
class LogConfig:
    level: str = opt("INFO", doc="log level", check=_log_level)
    file: str = opt("", doc="log file ('' = standard error)")


def _mtu(v: Any) -> str | None:
    return (
        None
        if v in (0, 256, 512, 1024, 2048, 4096)
        else "must be 0 (the port's) or 256, 512, 1024, 2048, 4096"
    )


def _byte(v: Any) -> str | None:
    return None if 0 <= v <= 255 else "must be 0..255"


@dataclass(slots=True)
class RdmaConfig:
    """The RDMA transport (used when ``transport`` is rdma, or auto and a device is present)."""

    device_filter: list[str] = opt(
        doc="RDMA devices (mlx5_0) or ports (mlx5_0:1) to use; empty = every active port", factory=list
    )
    gid_index: int = opt(
        -1,
        doc="GID table index (-1 = a RoCE v2 IPv4 GID, or 0 on InfiniBand)",
        check=lambda v: None if -1 <= v <= 255 else "must be -1 (pick one) or an index 0..255",
    )
    traffic_class: int = opt(0, doc="IP traffic class / DSCP << 2 of RoCE packets (QoS)", check=_byte)
    service_level: int = opt(
        0, doc="InfiniBand service level", check=lambda v: None if 0 <= v <= 15 else "must be 0..15"
    )
    mtu: int = opt(0, doc="path MTU in bytes (0 = the port's active MTU)", check=_mtu)
    buffer_size: int = opt(
        16384,
        doc="bytes of each SEND/RECV buffer",
        check=lambda v: None if 1024 <= v <= 1 << 20 else "must be 1 KiB..1 MiB",
    )
    send_buffers: int = opt(32, doc="SEND buffers per connection", check=_positive)
    recv_buffers: int = opt(
        32,
        doc="receive buffers per connection (the peer's credits)",
        check=lambda v: None if 4 <= v <= 4096 else "must be 4..4096",
    )
    inline_payload_bytes: int = opt(
        65536,
        doc="payloads up to this size travel in SENDs; larger ones are pulled with RDMA READ",
        check=_non_negative,
    )
    max_onesided_per_nic: int = opt(
        256, doc="outstanding RDMA READ/WRITE operations per NIC", check=_positive
    )
    pool_bytes: int = opt(256 << 20, doc="registered staging memory per NIC", check=_positive)
    timeout: int = opt(
        14,
        doc="QP ack timeout exponent (4.096 us * 2^timeout)",
        check=lambda v: None if 0 <= v <= 31 else "must be 0..31",
    )
    retry_cnt: int = opt(
        7, doc="QP transport retries", check=lambda v: None if 0 <= v <= 7 else "must be 0..7"
    )
    rnr_retry: int = opt(
        7,
        doc="QP receiver-not-ready retries (7 = unlimited)",
        check=lambda v: None if 0 <= v <= 7 else "must be 0..7",
    )


@dataclass(slots=True)
class MgmtdConfig:
    """fs3-mgmtd: the cluster manager."""

    node_id: int = opt(1, doc="this mgmtd's node id, unique among mgmtd instances", check=_node_id)
    listen_host: str = opt("127.0.0.1", doc="address the gRPC service binds")
    listen_port: int = opt(8000, doc="gRPC port (0 = any free port)", check=_port)
    cluster_id: str = opt(
        "fs3", doc="cluster name, for people and logs: not checked (the cluster secret tells clusters apart)"
    )
    cluster_secret_file: str = opt("", doc="file holding the shared cluster secret ('' = none, tests only)")
    lease_interval_s: float = opt(
        4.0,
        doc="primary lease length; a standby takes over after it. Keep it under half of "
        "heartbeat_timeout_s: a storage node's own lease (0.8 x heartbeat_timeout_s from its last "
        "accepted heartbeat) must outlast a failover, or every node refuses reads until the new "
        "primary has heard from it",
        check=_seconds,
    )
    heartbeat_timeout_s: float = opt(10.0, doc="a node silent this long is marked failed", check=_seconds)
    chain_update_interval_s: float = opt(1.0, doc="how often chain states are recomputed", check=_seconds)
    metrics_port: int = opt(0, doc="Prometheus /metrics port (0 = disabled)", check=_port)
    advertise_host: str = opt(
        "",
        doc="host that nodes and clients use to reach this mgmtd ('' = listen_host; this host's "
        "name when that is a wildcard such as 0.0.0.0 or ::)",
    )
    client_session_timeout_s: float = opt(
        300.0, doc="client sessions not extended for this long expire", check=_seconds
    )
    stop_fence_s: float = opt(
        60.0,
        doc="on a clean stop the primary extends the storage nodes' leases by this long and "
        "promises that no node is failed before it and heartbeat_timeout_s have passed, so that a "
        "restart or a short maintenance of the only mgmtd pauses no I/O; a storage node that dies "
        "meanwhile stays in its chains (writes to them wait) until then, and the mgmtd hosts' "
        "clocks must agree within 1.2 x heartbeat_timeout_s; none is set while a standby mgmtd "
        "runs, which takes over at once (0 = off)",
        check=_seconds_or_zero,
    )
    kv: KvConfig = opt(doc="metadata store", factory=KvConfig)
    log: LogConfig = opt(doc="logging", factory=LogConfig)


@dataclass(slots=True)
class MetaConfig:
    """fs3-meta: the metadata service."""

    node_id: int = opt(100, doc="this node's id, unique in the cluster", check=_node_id)
    listen_host: str = opt("127.0.0.1", doc="address the fs3 RPC service binds")
    listen_port: int = opt(8100, doc="fs3 RPC port (0 = any free port)", check=_port)
    advertise_host: str = opt(
        "",
        doc="host that nodes and clients use to reach this meta ('' = listen_host; this host's name "
        "when that is a wildcard such as 0.0.0.0 or ::)",
    )
    mgmtd_addresses: list[str] = opt(
        doc="host:port of every mgmtd", factory=lambda: ["127.0.0.1:8000"], check=_addresses
    )
    cluster_id: str = opt(
        "fs3", doc="cluster name, for people and logs: not checked (the cluster secret tells clusters apart)"
    )
    cluster_secret_file: str = opt("", doc="file holding the shared cluster secret")
    transport: str = opt("auto", doc="auto, tcp or rdma", check=_choice("auto", "tcp", "rdma"))
    rdma: RdmaConfig = opt(doc="RDMA transport", factory=RdmaConfig)
    gc_interval_s: float = opt(5.0, doc="how often the garbage collector runs", check=_seconds)
    gc_grace_s: float = opt(
        2.0,
        doc="an unlinked file's chunks are removed no sooner than this after the unlink: an open "
        "whose lookup of the name came just before the unlink or a rename over it still opens the "
        "file (as a local file system would), instead of failing with ENOENT; at 0.5 s or more, "
        "read-only opens and their closes are answered before their sessions are written",
        check=_seconds_or_zero,
    )
    session_timeout_s: float = opt(
        300.0, doc="write sessions of silent clients expire after this", check=_seconds
    )
    metrics_port: int = opt(0, doc="Prometheus /metrics port (0 = disabled)", check=_port)
    authenticate: bool = opt(
        True,
        doc="verify each request's user token with mgmtd (false: trust the uid/gid sent, and refuse"
        " clients on user connections, see the client's user_auth)",
    )
    token_stale_s: float = opt(
        3600.0,
        doc="how long after mgmtd last confirmed a user token it is still taken while mgmtd cannot "
        "answer (hung, restarting, unreachable): users keep working through a mgmtd outage this "
        "long, and a token revoked meanwhile works this long at this server; 0: never (every "
        "token check waits for mgmtd once its minute in the cache ends)",
        check=_non_negative,
    )
    # the root directory takes these three when the file system is made, and every new directory
    # its parent's: afterwards 'fs3 admin set-layout' changes a directory's, not these
    default_chain_table: int = opt(
        1,
        doc="chain table of the root directory's layout when the file system is made (see set-layout)",
        check=lambda v: None if 0 < v < 1 << 32 else "must be a chain table id 1..4294967295",
    )
    default_chunk_size: int = opt(
        1 << 20,
        doc="chunk size (power of two, 64 KiB..64 MiB) of the root directory's layout when the file "
        "system is made (see set-layout)",
        check=_chunk_size,
    )
    default_stripe: int = opt(
        1,
        doc="chains per file of the root directory's layout when the file system is made (see set-layout)",
        check=_positive,
    )
    idem_ttl_s: float = opt(
        1800.0, doc="how long a non-idempotent request's result is kept for retries", check=_seconds
    )
    capability_ttl_s: float = opt(
        600.0,
        doc="how long a capability meta issues at open (to clients on user connections, see the client's"
        " user_auth) lets storage serve the file; a client renews it, and loses access it lost"
        " (chmod, chown) at the latest this long after, plus the minute of clock skew storage allows",
        # a capability carries whole seconds: 1.9 was taken as 1
        check=lambda v: (
            None if 1 <= v < 1 << 32 and v == int(v) else "must be whole seconds from 1 to 2^32-1"
        ),
    )
    kv: KvConfig = opt(doc="metadata store", factory=KvConfig)
    log: LogConfig = opt(doc="logging", factory=LogConfig)

    def problem(self) -> str | None:
        """What is wrong across fields (see :func:`load_config`), or None."""
        if self.authenticate and not self.mgmtd_addresses:
            return "authenticate = true needs mgmtd_addresses to verify tokens"
        return None


@dataclass(slots=True)
class StorageConfig:
    """fs3-storage: the storage daemon."""

    node_id: int = opt(10001, doc="this node's id, unique in the cluster", check=_node_id)
    listen_host: str = opt("127.0.0.1", doc="address for client traffic")
    listen_port: int = opt(8200, doc="fs3 RPC port for client traffic (0 = any free port)", check=_port)
    backend_host: str = opt("", doc="address for chain-replication traffic ('' = listen_host)")
    advertise_host: str = opt(
        "",
        doc="host that clients and other storage daemons use to reach this one ('' = listen_host; "
        "this host's name when that is a wildcard such as 0.0.0.0 or ::)",
    )
    backend_port: int = opt(0, doc="port for chain-replication traffic (0 = share listen_port)", check=_port)
    mgmtd_addresses: list[str] = opt(
        doc="host:port of every mgmtd", factory=lambda: ["127.0.0.1:8000"], check=_some_addresses
    )
    cluster_id: str = opt(
        "fs3", doc="cluster name, for people and logs: not checked (the cluster secret tells clusters apart)"
    )
    cluster_secret_file: str = opt("", doc="file holding the shared cluster secret")
    transport: str = opt("auto", doc="auto, tcp or rdma", check=_choice("auto", "tcp", "rdma"))
    rdma: RdmaConfig = opt(doc="RDMA transport", factory=RdmaConfig)
    target_paths: list[str] = opt(doc="one directory per target (one disk each)", factory=list)
    target_ids: list[int] = opt(
        doc="the target id of each target_paths entry, in the same order (created in mgmtd beforehand)",
        factory=list,
    )
    heartbeat_interval_s: float = opt(2.0, doc="heartbeat to mgmtd every this many seconds", check=_seconds)
    routing_refresh_interval_s: float = opt(
        1.0,
        doc="poll mgmtd for routing changes every this many seconds (and at once when told)",
        check=_seconds,
    )
    mgmtd_connect_timeout_s: float = opt(
        30.0, doc="at startup, give up (exit non-zero) when no mgmtd answered for this long", check=_seconds
    )
    sync_writes: bool = opt(
        True, doc="fsync chunk data and metadata before acknowledging (off: throwaway data)"
    )
    direct_io: bool = opt(
        True,
        doc="O_DIRECT for chunk files written whole and for reads, both of 256 KiB or more",
    )
    keep_free: float = opt(
        0.02,
        doc="fraction of each target's file system kept free: a write that would use it is refused "
        "with ENOSPC and the target stays online (reads, removes and truncates go on); 0 = write "
        "until the disk is full (writes then fail as well, and the target stays online)",
        check=_fraction,
    )
    io_threads: int = opt(
        16,
        doc="threads doing each target's disk I/O (each target has its own: a disk that hangs "
        "holds only its own)",
        check=lambda v: None if 0 < v <= 1024 else "must be 1..1024",
    )
    disk_stall_s: float = opt(
        30.0,
        doc="a target whose disk leaves a call unanswered this many seconds is taken offline, as "
        "after a disk error (its chains go on with the other replicas; it comes back, resynced, "
        "when the daemon restarts); 0: never",
        check=_non_negative,
    )
    chunk_meta_map_size: int = opt(
        256 << 30,
        doc="largest size of each target's chunk metadata store (LMDB; address space only, the "
        "file grows as needed): a chunk of 1 MiB takes about 2 KiB, so the default holds about "
        "128 TiB of such chunks; a full store takes its target offline",
        check=_map_size,
    )
    aio_reads: bool = opt(
        True,
        doc="read page-cache misses of small reads with native AIO (O_DIRECT, batched) on the "
        "event loop instead of waiting for the disk there or in the I/O threads",
    )
    aio_depth: int = opt(
        128,
        doc="AIO reads in flight at once (128 KiB of buffer each); more wait their turn in the I/O threads",
        check=_positive,
    )
    forward_timeout_s: float = opt(
        30.0, doc="how long a replica retries forwarding an update along the chain", check=_seconds
    )
    rpc_timeout_s: float = opt(
        10.0,
        doc="deadline of each call to another storage daemon (an update forwarded along the chain, a"
        " resync, a CRAQ version query); a forward that fails is retried within forward_timeout_s",
        check=_seconds,
    )
    resync_interval_s: float = opt(
        0.5, doc="how often to look for SYNCING successors to resync", check=_seconds
    )
    scrub_mib_per_s: float = opt(
        0.0,
        doc="scrub: read every committed chunk copy of this daemon's targets back at most this fast "
        "(MiB/s for the whole daemon; 16 is a gentle rate), repairing those failing their checksums "
        "from another replica (reads repair the copies they find damaged; scrub finds those nobody "
        "reads). A read error (EIO) takes the target offline, as for a client's read. 0: off",
        check=_non_negative,
    )
    scrub_interval_s: float = opt(
        86400.0,
        doc="a scrub pass starts this long after the previous one started (at once if that one took longer)",
        check=_seconds,
    )
    scrub_start_delay_s: float = opt(
        600.0, doc="the first scrub pass starts this long after the daemon starts", check=_non_negative
    )
    metrics_port: int = opt(0, doc="Prometheus /metrics port (0 = disabled)", check=_port)
    token_stale_s: float = opt(
        3600.0,
        doc="user connections: how long after mgmtd last confirmed a user token it is still taken "
        "while mgmtd cannot answer (see meta's token_stale_s); 0: never",
        check=_non_negative,
    )
    log: LogConfig = opt(doc="logging", factory=LogConfig)

    def problem(self) -> str | None:
        """What is wrong across fields (see :func:`load_config`), or None."""
        if len(self.target_ids) != len(self.target_paths):
            return f"{len(self.target_paths)} target_paths but {len(self.target_ids)} target_ids"
        if len(set(self.target_ids)) != len(self.target_ids) or any(
            not 0 < t <= MAX_TARGET_ID for t in self.target_ids
        ):
            return f"target_ids must be distinct numbers from 1 to {MAX_TARGET_ID}"
        return None


@dataclass(slots=True)
class ClientConfig:
    """The FUSE mount and the native client."""

    mgmtd_addresses: list[str] = opt(
        doc="host:port of every mgmtd", factory=lambda: ["127.0.0.1:8000"], check=_some_addresses
    )
    cluster_id: str = opt(
        "fs3", doc="cluster name, for people and logs: not checked (the cluster secret tells clusters apart)"
    )
    token_file: str = opt("", doc="file holding this client's user token")
    user_auth: bool = opt(
        False,
        doc="authenticate connections with the user token in token_file instead of the cluster secret:"
        " for clients not trusted with the secret; meta then acts only as the token's user and storage"
        " needs the capability meta issues at open (cluster_secret_file is not read; connections go over"
        " TCP, as servers take no user connections over RDMA)",
    )
    inode_handles: int = opt(
        1 << 20,
        doc="user_auth with a non-root token: how many inode handles (what meta asks of such a client's"
        " requests that name an inode by id) to keep beyond those of open files and, for a mount,"
        " inodes the kernel holds; about 120 bytes each",
        check=_positive,
    )
    transport: str = opt("auto", doc="auto, tcp or rdma", check=_choice("auto", "tcp", "rdma"))
    rdma: RdmaConfig = opt(doc="RDMA transport", factory=RdmaConfig)
    attr_timeout_s: float = opt(1.0, doc="kernel attribute cache timeout", check=_seconds)
    entry_timeout_s: float = opt(1.0, doc="kernel directory entry cache timeout", check=_seconds)
    file_entry_timeout_s: float = opt(
        0.0,
        doc="kernel directory entry cache timeout of regular files: 0 makes the kernel look a file's"
        " name up again each time a path names it (an open, a stat), so that a file another client"
        " wrote and closed opens with its new length and O_APPEND lands after its end, and a name"
        " replaced meanwhile opens the new file (NFS's close-to-open); one meta lookup per open",
        check=_non_negative,
    )
    write_buffer_bytes: int = opt(4 << 20, doc="per-open-file write buffer", check=_positive)
    write_scatter_bytes: int = opt(
        64 << 20,
        doc="per open file: small writes elsewhere than where the last one ended (random writes) are "
        "gathered up to this many bytes, then sent as one update per chunk",
        check=_positive,
    )
    rpc_timeout_s: float = opt(30.0, doc="deadline of each RPC", check=_seconds)
    metrics_port: int = opt(0, doc="Prometheus /metrics port (0 = disabled)", check=_port)
    metrics_host: str = opt(
        "127.0.0.1",
        doc="address the mount's /metrics binds: 0.0.0.0 (or this host's address) for a Prometheus"
        " on another host",
    )
    log: LogConfig = opt(doc="logging", factory=LogConfig)
    cluster_secret_file: str = opt(
        "", doc="file holding the shared cluster secret ('' = the development secret)"
    )
    meta_addresses: list[str] = opt(
        doc="host:port of meta servers (empty = the meta nodes in mgmtd's routing info)", factory=list
    )
    negative_timeout_s: float = opt(
        0.5,
        doc="kernel cache timeout of a failed lookup (0 = none)",
        check=lambda v: None if v >= 0 else "must be >= 0",
    )
    read_ahead_kb: int = opt(
        4096,
        doc="the mount's kernel readahead (bdi read_ahead_kb; 0 = leave the kernel's)",
        check=lambda v: None if v >= 0 else "must be >= 0",
    )
    memory_trim_interval_s: float = opt(
        10.0,
        doc="the mount gives the memory it freed back to the system (glibc's malloc_trim; write buffers"
        " of a burst of random writes stay mapped otherwise) once it has been idle this long after"
        " reads or writes; 0 = never",
        check=lambda v: None if v == 0 or v >= 1 else "must be 0 (never) or at least 1 (seconds)",
    )
    direct_io: bool = opt(
        False,
        doc="bypass the kernel page cache for every open file (such files cannot be mapped "
        "shared: mmap fails with ENODEV)",
    )
    write_scatter_total_bytes: int = opt(
        256 << 20,
        doc="what the gathered small writes of all open files may hold together (with their flushes "
        "in flight); a file whose write finds it spent flushes its own",
        check=_positive,
    )
    read_coalesce_turns: int = opt(
        48,
        doc="reads of up to 64 KiB arriving within this many event-loop turns of each other, while "
        "others are at storage, go to storage as one batch per node (0 = each read alone)",
        check=lambda v: None if v >= 0 else "must be >= 0",
    )
    max_flushes_in_flight: int = opt(
        4, doc="write-buffer flushes one open file keeps in flight", check=_positive
    )
    tune_malloc: bool = opt(
        False,
        doc="fix glibc's malloc thresholds (mmap 4 MiB, trim 64 MiB) for the whole process on connect:"
        " reads of ~1 MiB into new bytes stop faulting their pages in afresh (fs3.memory); the"
        " process then keeps up to 64 MiB of freed memory mapped per arena",
    )


SERVICE_CONFIGS: dict[str, type] = {
    "mgmtd": MgmtdConfig,
    "meta": MetaConfig,
    "storage": StorageConfig,
    "client": ClientConfig,
}


def _config_error(msg: str) -> FS3Error:
    return FS3Error(StatusCode.CONFIG_INVALID, msg)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the field type ``tp``; ints widen to floats. Raises CONFIG_INVALID."""
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        (item_tp,) = typing.get_args(tp)[:1]
        if not isinstance(value, list):
            raise _config_error(f"{where}: expected a list, got {type(value).__name__}")
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for alt in typing.get_args(tp):
            try:
                return _coerce(value, alt, where)
            except FS3Error:
                continue
        raise _config_error(f"{where}: {value!r} is not a valid {tp}")
    if tp is type(None):
        if value is None:
            return None
        raise _config_error(f"{where}: expected nothing, got {value!r}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool):
        raise _config_error(f"{where}: expected true or false, got {value!r}")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _config_error(f"{where}: expected an integer, got {value!r}")
    if tp in (str, float) and not isinstance(value, tp):
        raise _config_error(f"{where}: expected a {tp.__name__}, got {value!r}")
    return value


def _build(cls: type[C], data: Mapping[str, Any], source: str, prefix: str = "") -> C:
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key not in known:
            raise _config_error(f"unknown key '{dotted}' in {source}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise _config_error(f"'{dotted}' in {source} must be a table")
            kwargs[key] = _build(tp, value, source, f"{dotted}.")
            continue
        value = _coerce(value, tp, f"'{dotted}' in {source}")
        if isinstance(value, float) and not math.isfinite(value):  # TOML has inf and nan
            raise _config_error(f"'{dotted}' in {source} must be a finite number (got {value!r})")
        check = known[key].metadata.get("check")
        if check is not None and (problem := check(value)):
            raise _config_error(f"'{dotted}' in {source} {problem} (got {value!r})")
        kwargs[key] = value
    return cls(**kwargs)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _env_overrides(cls: type, environ: Mapping[str, str]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split("__")
        tp: Any = cls
        target = out
        ok = True
        for i, part in enumerate(parts):
            if not dataclasses.is_dataclass(tp):
                ok = False
                break
            sub_hints = hints if tp is cls else typing.get_type_hints(tp)
            if part not in sub_hints:
                ok = False
                break
            tp = sub_hints[part]
            if i < len(parts) - 1:
                target = target.setdefault(part, {})
        if not ok or dataclasses.is_dataclass(tp):
            continue
        target[parts[-1]] = _parse_env_value(raw, tp)
    return out


def overriding_variables(cls: type, environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``FS3_*`` variables of ``environ`` (default: this process's) that :func:`load_config` of
    ``cls`` applies over its file, sorted: for a daemon to say where a setting came from."""
    environ = os.environ if environ is None else environ
    return sorted(
        name for name in environ if name.startswith(ENV_PREFIX) and _env_overrides(cls, {name: environ[name]})
    )


def env_list(raw: str) -> list[Any] | Any:
    """A list from an environment variable: a TOML array (``["a:1", "b:2"]``) or, as shells and
    ``fs3 admin`` write it, comma-separated words (``a:1,b:2``)."""
    if raw.strip().startswith("["):
        try:
            return tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            return raw  # refused by the type check, naming the variable's key
    return [x.strip() for x in raw.split(",") if x.strip()]


def _parse_env_value(raw: str, tp: Any) -> Any:
    if tp is str:
        return raw
    if typing.get_origin(tp) is list:
        items = env_list(raw)
        if isinstance(items, list) and not raw.strip().startswith("[") and typing.get_args(tp) != (str,):
            # comma-separated words of another type (target_ids = 1,2): read as TOML each
            items = [_parse_env_value(x, typing.get_args(tp)[0]) for x in items]
        return items
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def load_config(
    cls: type[C], path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> C:
    """Build ``cls`` from defaults, then the TOML file at ``path`` (if any), then ``FS3_*`` variables.

    Raises FS3Error(CONFIG_INVALID) with one line naming the key and the file (or variable) at fault,
    or the file that is missing or does not parse."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            with p.open("rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise _config_error(f"config file {p} does not exist") from None
        except IsADirectoryError:
            raise _config_error(f"config file {p} is a directory") from None
        except PermissionError:
            raise _config_error(f"config file {p} is not readable") from None
        except tomllib.TOMLDecodeError as e:
            raise _config_error(f"config file {p} is not valid TOML: {e}") from None
        except UnicodeDecodeError as e:
            raise _config_error(f"config file {p} is not valid UTF-8 (byte {e.start})") from None
    source = str(path) if path is not None else "defaults"
    cfg = _build(cls, data, source)
    environ = os.environ if environ is None else environ
    env = _env_overrides(cls, environ)
    if env:
        try:
            cfg = _build(cls, _merge(data, env), f"{source} with FS3_* environment overrides")
        except FS3Error:
            _name_bad_variable(cls, data, environ)
            raise
        source = f"{source} with FS3_* environment overrides"
    # rules across fields: a config that passes here is one the service starts with (the daemons,
    # config-template --check in a unit's ExecStartPre, and admin config set all ask this)
    problem = getattr(cfg, "problem", None)
    if problem is not None and (why := problem()):
        raise _config_error(f"{source}: {why}")
    return cfg


_NO_SOURCE = "\x00source\x00"  # named by the caller instead


def _name_bad_variable(cls: type, data: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """Raise the error of the first ``FS3_*`` variable that alone makes ``data`` invalid, naming the
    variable (the caller raises the combined error when none does alone)."""
    for name in sorted(environ):
        one = _env_overrides(cls, {name: environ[name]}) if name.startswith(ENV_PREFIX) else {}
        if not one:
            continue
        try:
            _build(cls, _merge(data, one), _NO_SOURCE)
        except FS3Error as e:
            detail = e.message.replace(f" in {_NO_SOURCE}", "")
            raise _config_error(f"environment variable {name}={environ[name]!r}: {detail}") from None


def pushed_settings(cls: type, content: str, source: str) -> dict[str, Any]:
    """The settings a config mgmtd pushes names (``content``: TOML naming some keys of ``cls``, as
    ``fs3 admin config set`` stored it), by dotted key (``log.level``), checked as
    :func:`load_config` checks a file (FS3Error CONFIG_INVALID naming ``source`` otherwise)."""
    try:
        data = tomllib.loads(content)
    except tomllib.TOMLDecodeError as e:
        raise _config_error(f"{source} is not valid TOML: {e}") from None
    pushed = _build(cls, data, source)
    out: dict[str, Any] = {}

    def walk(named: Mapping[str, Any], built: Any, prefix: str) -> None:
        for key, value in named.items():
            if isinstance(value, Mapping):
                walk(value, getattr(built, key), f"{prefix}{key}.")
            else:
                out[prefix + key] = getattr(built, key)

    walk(data, pushed, "")
    return out


def get_dotted(cfg: Any, key: str) -> Any:
    """``cfg``'s field ``key`` (``log.level``: a field of a table)."""
    for name in key.split("."):
        cfg = getattr(cfg, name)
    return cfg


def set_dotted(cfg: Any, key: str, value: Any) -> None:
    """Set ``cfg``'s field ``key`` (``log.level``: a field of a table) to ``value``."""
    *tables, name = key.split(".")
    for table in tables:
        cfg = getattr(cfg, table)
    setattr(cfg, name, value)


def to_toml(cfg: Any, *, with_docs: bool = True) -> str:
    """Render a config dataclass as a TOML document, every option with its documentation."""
    lines: list[str] = []
    tables: list[tuple[str, Any, str]] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            tables.append((f.name, value, f.metadata.get("doc", "")))
            continue
        if with_docs and f.metadata.get("doc"):
            lines.append(f"# {f.metadata['doc']}")
        lines.append(f"{f.name} = {_toml_value(value)}")
    for name, value, doc in tables:
        lines.append("")
        if with_docs and doc:
            lines.append(f"# {doc}")
        lines.append(f"[{name}]")
        for f in dataclasses.fields(value):
            if with_docs and f.metadata.get("doc"):
                lines.append(f"# {f.metadata['doc']}")
            lines.append(f"{f.name} = {_toml_value(getattr(value, f.name))}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot render {v!r} as TOML")
