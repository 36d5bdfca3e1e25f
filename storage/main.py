"""``fs3 storage`` / ``python -m fs3.storage``: run the storage daemon.

Exits 0 after a clean shutdown on SIGTERM, SIGINT or SIGHUP (also one that comes while it
starts), and non-zero with one line on standard error
when it cannot start (invalid config, unreadable secret, port in use, a target directory that
cannot be created or written, a target directory that belongs to another target).
"""

from __future__ import annotations

import logging
import os

from fs3 import daemon
from fs3.config import StorageConfig
from fs3.daemon import read_secret, settle_gc, wait_for_shutdown, write_port_file

log = logging.getLogger(__name__)


async def serve(cfg: StorageConfig, *, port_file: str | None = None) -> int:
    """Run one storage daemon until a stop signal (SIGTERM, SIGINT, SIGHUP). Raises FS3Error when it cannot start."""
    from fs3 import metrics
    from fs3.storage.daemon import StorageDaemon

    storage_daemon = StorageDaemon(cfg, secret=read_secret(cfg.cluster_secret_file))
    # on the daemon's address, as mgmtd and meta do: Prometheus scrapes it from another host
    metrics_server = metrics.serve(cfg.metrics_port, cfg.listen_host) if cfg.metrics_port else None
    try:
        await storage_daemon.start()
    except BaseException:
        if metrics_server is not None:
            metrics_server.close()
        raise
    settle_gc()
    try:
        if port_file:
            write_port_file(port_file, storage_daemon.port)
        await wait_for_shutdown()
    finally:
        if metrics_server is not None:
            metrics_server.close()
        await storage_daemon.stop()
        log.info("stopped")
    if storage_daemon.io_abandoned:
        # an I/O thread hangs in a disk call (see StorageDaemon.stop): exit now, not at its end,
        # so that the target locks are released for a restart
        logging.shutdown()
        os._exit(0)
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 storage``; returns the exit status."""
    p = daemon.parser("storage", "Run an fs3 storage daemon.", listen_host=False, kv=False)
    return daemon.run("storage", StorageConfig, argv, p, serve)
