"""A meta daemon in the shared :class:`cluster.Cluster` fixture (mgmtd + storage daemons)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from cluster import Cluster, storage_on_tmpfs  # noqa: E402

from fs3.client.meta_client import MetaClient  # noqa: E402
from fs3.proto import common_pb2  # noqa: E402


async def start_meta(c: Cluster, node_id: int = 100, extra: str = "") -> str:
    """Start ``python -m fs3.meta`` in the cluster (killed by its teardown); returns host:port."""
    cfg = c.tmp / f"meta-{node_id}.toml"
    port_file = c.tmp / f"meta-{node_id}.port"
    port_file.unlink(missing_ok=True)  # a restart's: not the old process's port
    cfg.write_text(
        f'node_id = {node_id}\nlisten_port = 0\nmgmtd_addresses = ["{c.mgmtd_address}"]\n'
        f'cluster_secret_file = "{c.secret_file}"\nauthenticate = false\ngc_interval_s = 0.1\n{extra}\n'
        f'[kv]\nengine = "lmdb"\npath = "{c.tmp / "meta-kv"}"\nmap_size = 268435456\n'
    )
    proc = c.spawn(
        f"meta-{node_id}",
        [sys.executable, "-m", "fs3.meta", "--config", str(cfg), "--port-file", str(port_file)],
    )
    port = await c._read_port(port_file, proc)
    return f"127.0.0.1:{port}"


__all__ = ["Cluster", "meta_client", "start_meta", "storage_on_tmpfs"]


def meta_client(c: Cluster, address: str, uid: int = 0, gid: int = 0) -> MetaClient:
    return MetaClient([address], c.secret, user=common_pb2.UserInfo(uid=uid, gid=gid), timeout_s=30)
