"""``fs3 meta`` / ``python -m fs3.meta``: run the metadata service daemon.

The daemon is stateless: any number of them may serve one store. With ``mgmtd_addresses`` set it
registers and heartbeats as a meta node, takes chain tables for new files' layouts from mgmtd's
routing info, and (with ``authenticate``) verifies users' tokens with mgmtd and serves clients on
user connections (a token instead of the cluster secret: see :mod:`fs3.meta.service`); with
``mgmtd_addresses = []`` it runs alone (no layouts with chains, and ``authenticate`` must be off).

Exits 0 after a clean shutdown on SIGTERM, SIGINT or SIGHUP (also one that comes while it
starts), and non-zero with one line on standard error
when it cannot start (unreadable or invalid config, port in use, store that cannot be opened), or
with 1 once its store can commit nothing any more (an fsync error: see fs3.kv.lmdb_engine).
"""

from __future__ import annotations

import logging

from fs3 import daemon
from fs3.config import MetaConfig
from fs3.daemon import read_secret, settle_gc, wait_for_shutdown, write_port_file

log = logging.getLogger(__name__)


async def serve(cfg: MetaConfig, *, port_file: str | None = None) -> int:
    """Run one meta daemon until a stop signal (SIGTERM, SIGINT, SIGHUP). Raises FS3Error when it cannot start."""
    from fs3 import metrics
    from fs3.meta.daemon import MetaDaemon

    meta_daemon = MetaDaemon(cfg, secret=read_secret(cfg.cluster_secret_file), registry=metrics.registry())
    await meta_daemon.start()
    settle_gc()
    try:
        if port_file:
            write_port_file(port_file, meta_daemon.port)
        return await wait_for_shutdown(meta_daemon.db)
    finally:
        await meta_daemon.stop()


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 meta``; returns the exit status."""
    p = daemon.parser("meta", "Run the fs3 metadata service.")
    return daemon.run("meta", MetaConfig, argv, p, serve)
