"""``fs3 meta`` / ``python -m fs3.meta``: run the metadata service daemon.

The daemon is stateless: any number of them may serve one store. With ``mgmtd_addresses`` set it
registers and heartbeats as a meta node, takes chain tables for new files' layouts from mgmtd's
routing info, and (with ``authenticate``) verifies users' tokens with mgmtd; with
``mgmtd_addresses = []`` it runs alone (no layouts with chains, and ``authenticate`` must be off).

Exits 0 after a clean shutdown on SIGTERM or SIGINT, and non-zero with one line on standard error
when it cannot start (unreadable or invalid config, port in use, store that cannot be opened).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from pathlib import Path

from fs3.config import MetaConfig, load_config
from fs3.errors import FS3Error, StatusCode

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fs3 meta", description="Run the fs3 metadata service.")
    p.add_argument("--config", metavar="PATH", help="TOML config file (default: built-in defaults)")
    p.add_argument("--node-id", type=int, help="override node_id")
    p.add_argument("--listen-host", help="override listen_host")
    p.add_argument("--port", type=int, help="override listen_port (0 = any free port)")
    p.add_argument("--kv-engine", choices=("lmdb", "fdb", "mem"), help="override kv.engine")
    p.add_argument("--kv-path", help="override kv.path")
    p.add_argument("--log-level", help="override log.level")
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here once serving")
    return p


def _apply_overrides(cfg: MetaConfig, args: argparse.Namespace) -> MetaConfig:
    top = {"node_id": args.node_id, "listen_host": args.listen_host, "listen_port": args.port}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in top.items() if v is not None})
    kv = {"engine": args.kv_engine, "path": args.kv_path}
    if any(v is not None for v in kv.values()):
        cfg.kv = dataclasses.replace(cfg.kv, **{k: v for k, v in kv.items() if v is not None})
    if args.log_level is not None:
        cfg.log = dataclasses.replace(cfg.log, level=args.log_level)
    if cfg.node_id <= 0 or not 0 <= cfg.listen_port <= 65535:
        raise FS3Error(StatusCode.CONFIG_INVALID, "node id must be > 0 and port 0..65535")
    if cfg.authenticate and not cfg.mgmtd_addresses:
        raise FS3Error(
            StatusCode.CONFIG_INVALID, "authenticate = true needs mgmtd_addresses to verify tokens"
        )
    return cfg


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


async def serve(cfg: MetaConfig, *, port_file: str | None = None) -> int:
    """Run one meta daemon until SIGTERM/SIGINT. Raises FS3Error when it cannot start."""
    from fs3 import metrics
    from fs3.meta.daemon import MetaDaemon

    daemon = MetaDaemon(cfg, secret=read_secret(cfg.cluster_secret_file), registry=metrics.registry())
    await daemon.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if port_file:
        _write_port_file(port_file, daemon.port)
    try:
        await stop.wait()
        log.info("shutdown requested")
    finally:
        await daemon.stop()
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 meta``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        cfg = _apply_overrides(load_config(MetaConfig, args.config), args)
    except FS3Error as e:
        sys.stderr.write(f"fs3 meta: {e.message}\n")
        return 2
    from fs3.log import setup_logging

    try:
        setup_logging(cfg.log, "meta")
    except OSError as e:
        sys.stderr.write(f"fs3 meta: cannot open log file {cfg.log.file}: {e.strerror}\n")
        return 2
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is a dependency; plain asyncio still works without it
        runner = asyncio.run
    try:
        return runner(serve(cfg, port_file=args.port_file))
    except FS3Error as e:
        if cfg.log.file:  # otherwise the log is standard error, where the line goes anyway
            log.error("meta failed to start: %s", e.message)
        sys.stderr.write(f"fs3 meta: {e.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130
