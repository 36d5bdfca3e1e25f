"""``fs3 storage`` / ``python -m fs3.storage``: run the storage daemon.

Exits 0 after a clean shutdown on SIGTERM or SIGINT, and non-zero with one line on standard error
when it cannot start (invalid config, unreadable secret, port in use, a target directory that
cannot be created or written, a target directory that belongs to another target).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from fs3.config import StorageConfig, load_config
from fs3.errors import FS3Error, StatusCode

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fs3 storage", description="Run an fs3 storage daemon.")
    p.add_argument("--config", metavar="PATH", help="TOML config file (default: built-in defaults)")
    p.add_argument("--node-id", type=int, help="override node_id")
    p.add_argument("--port", type=int, help="override listen_port (0 = any free port)")
    p.add_argument("--log-level", help="override log.level")
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here once serving")
    return p


def read_secret(path: str) -> bytes | None:
    """The cluster secret from ``path`` (surrounding whitespace removed); None when ``path`` is ''."""
    if not path:
        return None
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise FS3Error(
            StatusCode.CONFIG_INVALID, f"cannot read cluster secret file {path}: {e.strerror}"
        ) from None
    if len(secret) < 16:
        raise FS3Error(StatusCode.CONFIG_INVALID, f"cluster secret in {path} is shorter than 16 bytes")
    return secret


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(f"{port}\n")
    os.replace(tmp, path)  # readers never see a half-written file


async def serve(cfg: StorageConfig, *, port_file: str | None = None) -> int:
    """Run one storage daemon until SIGTERM/SIGINT. Raises FS3Error when it cannot start."""
    from fs3 import metrics
    from fs3.storage.daemon import StorageDaemon

    daemon = StorageDaemon(cfg, secret=read_secret(cfg.cluster_secret_file))
    metrics_server = metrics.serve(cfg.metrics_port) if cfg.metrics_port else None
    try:
        await daemon.start()
    except BaseException:
        if metrics_server is not None:
            metrics_server.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Everything allocated so far lives as long as the daemon; the hot path allocates many small
    # short-lived objects (messages, futures), so collections are made rarer and skip the former.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    if port_file:
        _write_port_file(port_file, daemon.port)
    try:
        await stop.wait()
        log.info("shutdown requested")
    finally:
        if metrics_server is not None:
            metrics_server.close()
        await daemon.stop()
        log.info("stopped")
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 storage``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(StorageConfig, args.config)
        top = {"node_id": args.node_id, "listen_port": args.port}
        cfg = dataclasses.replace(cfg, **{k: v for k, v in top.items() if v is not None})
        if args.log_level is not None:
            cfg.log = dataclasses.replace(cfg.log, level=args.log_level)
    except FS3Error as e:
        sys.stderr.write(f"fs3 storage: {e.message}\n")
        return 2
    from fs3.log import setup_logging

    try:
        setup_logging(cfg.log, "storage")
    except OSError as e:
        sys.stderr.write(f"fs3 storage: cannot open log file {cfg.log.file}: {e.strerror}\n")
        return 2
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is a dependency; plain asyncio still works without it
        runner = asyncio.run
    try:
        return runner(serve(cfg, port_file=args.port_file))
    except FS3Error as e:
        log.error("storage failed to start: %s", e.message)
        sys.stderr.write(f"fs3 storage: {e.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130
