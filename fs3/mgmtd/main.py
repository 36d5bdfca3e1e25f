"""``fs3 mgmtd`` / ``python -m fs3.mgmtd``: run the cluster manager daemon.

Exits 0 after a clean shutdown on SIGTERM, SIGINT or SIGHUP (also one that comes while it
starts), and non-zero with one line on standard error
when it cannot start (unreadable or invalid config, port in use, store that cannot be opened).
"""

from __future__ import annotations

import logging

from fs3 import daemon
from fs3.config import MgmtdConfig
from fs3.daemon import read_secret, settle_gc, wait_for_shutdown, write_port_file

log = logging.getLogger(__name__)


async def serve(cfg: MgmtdConfig, *, port_file: str | None = None) -> int:
    """Run one mgmtd until a stop signal (SIGTERM, SIGINT, SIGHUP). Raises FS3Error when it cannot start."""
    from fs3.kv import open_daemon_store
    from fs3.mgmtd.server import MgmtdServer

    secret = read_secret(cfg.cluster_secret_file)
    if secret is None:
        log.warning(
            "no cluster_secret_file: mgmtd takes calls that need the cluster secret from anyone who"
            " can reach it (init-cluster, heartbeats, routing); set one outside tests"
        )
    db = await open_daemon_store(cfg.kv)
    from fs3 import metrics

    server = MgmtdServer(cfg, db, secret=secret, registry=metrics.registry())
    try:
        await server.start()
    except BaseException:
        await db.close()
        raise
    settle_gc()
    try:
        if port_file:
            write_port_file(port_file, server.port)
        return await wait_for_shutdown(db)
    finally:
        await server.stop()
        await db.close()


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 mgmtd``; returns the exit status."""
    p = daemon.parser("mgmtd", "Run the fs3 cluster manager (mgmtd).")
    return daemon.run("mgmtd", MgmtdConfig, argv, p, serve)
