"""mgmtd's records in the KV store (DESIGN §4): key layout and value encoding.

Values are serialized protobuf messages from ``proto/mgmtd.proto``, so that fields can be added
without a migration. Integers in keys are big-endian so that a prefix scan returns ids in order.

=========================================  ===============================================
key                                        value
=========================================  ===============================================
``NODE`` + node id (u32)                   NodeInfo (stored fields only)
``TGIF`` + target id (u64)                 TargetInfo (stored fields only)
``CHIF`` + chain id (u32)                  ChainInfo
``CHIT`` + table id (u32) + version (u32)  ChainTable
``CONF`` + type name + 0 + ~version (u64)  ConfigInfo; newest first in a prefix scan
``USER`` + uid (u32)                       StoredUser (tokens as SHA-256 digests)
``SING`` + ``mgmtd-lease``                 MgmtdLease
``SING`` + ``mgmtd-routing-version``       u64 big-endian
``SING`` + ``mgmtd-cluster``               ClusterRecord (present once the cluster is initialized)
``SING`` + ``mgmtd-fence``                 two f64 big-endian: wall time before which no node
                                           is failed, and the fence's length then (a clean stop)
``SING`` + ``mgmtd-standby-`` + node (u32) f64 big-endian: wall time a standby mgmtd last looked
                                           at the lease (cleared by its clean stop)
=========================================  ===============================================
"""

from __future__ import annotations

import struct

from fs3.proto import common_pb2, mgmtd_pb2

NODE = b"NODE"
TGIF = b"TGIF"
CHIF = b"CHIF"
CHIT = b"CHIT"
CONF = b"CONF"
USER = b"USER"
SING = b"SING"

LEASE_KEY = SING + b"mgmtd-lease"
ROUTING_VERSION_KEY = SING + b"mgmtd-routing-version"
CLUSTER_KEY = SING + b"mgmtd-cluster"
FILE_SYSTEM_KEY = SING + b"mgmtd-file-system"  # a FileSystemRecord (Cluster.claim_file_system)
FENCE_KEY = SING + b"mgmtd-fence"
STANDBY_PREFIX = SING + b"mgmtd-standby-"


def standby_key(node_id: int) -> bytes:
    return STANDBY_PREFIX + struct.pack(">I", node_id)


_U64_MAX = (1 << 64) - 1


def node_key(node_id: int) -> bytes:
    return NODE + struct.pack(">I", node_id)


def target_key(target_id: int) -> bytes:
    return TGIF + struct.pack(">Q", target_id)


def chain_key(chain_id: int) -> bytes:
    return CHIF + struct.pack(">I", chain_id)


def chain_table_key(table_id: int, version: int) -> bytes:
    return CHIT + struct.pack(">II", table_id, version)


def chain_table_prefix(table_id: int) -> bytes:
    return CHIT + struct.pack(">I", table_id)


def config_prefix(node_type: int) -> bytes:
    return CONF + common_pb2.NodeType.Name(node_type).encode() + b"\0"


def config_key(node_type: int, version: int) -> bytes:
    return config_prefix(node_type) + struct.pack(">Q", _U64_MAX - version)


def user_key(uid: int) -> bytes:
    return USER + struct.pack(">I", uid)


def encode_u64(v: int) -> bytes:
    return struct.pack(">Q", v)


def decode_u64(b: bytes | None) -> int:
    return 0 if b is None else struct.unpack(">Q", b)[0]


def encode_f64(v: float) -> bytes:
    return struct.pack(">d", v)


def decode_f64(b: bytes | None) -> float:
    return 0.0 if b is None or len(b) != 8 else struct.unpack(">d", b)[0]


def encode_fence(ends_at: float, seconds: float) -> bytes:
    return struct.pack(">dd", ends_at, seconds)


def decode_fence(b: bytes | None) -> tuple[float, float]:
    """(wall time the stop fence ends, its length when it was set); (0, 0) for none."""
    return (0.0, 0.0) if b is None or len(b) != 16 else struct.unpack(">dd", b)


def stored_node(node: mgmtd_pb2.NodeInfo) -> bytes:
    """The stored form of a node: runtime fields (status, pid, heartbeat age) are not persisted."""
    n = mgmtd_pb2.NodeInfo()
    n.CopyFrom(node)
    n.ClearField("status")
    n.ClearField("pid")
    n.ClearField("last_heartbeat_age_s")
    return n.SerializeToString()


def stored_target(target: mgmtd_pb2.TargetInfo) -> bytes:
    """The stored form of a target: its location only; states and usage are runtime."""
    return mgmtd_pb2.TargetInfo(
        target_id=target.target_id, node_id=target.node_id, disk_index=target.disk_index
    ).SerializeToString()
