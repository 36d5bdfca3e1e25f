"""``fs3 mgmtd`` / ``python -m fs3.mgmtd``: run the cluster manager daemon.

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

from fs3.config import MgmtdConfig, load_config
from fs3.errors import FS3Error, StatusCode

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fs3 mgmtd", description="Run the fs3 cluster manager (mgmtd).")
    p.add_argument("--config", metavar="PATH", help="TOML config file (default: built-in defaults)")
    p.add_argument("--node-id", type=int, help="override node_id")
    p.add_argument("--listen-host", help="override listen_host")
    p.add_argument("--port", type=int, help="override listen_port (0 = any free port)")
    p.add_argument("--kv-engine", choices=("lmdb", "fdb", "mem"), help="override kv.engine")
    p.add_argument("--kv-path", help="override kv.path")
    p.add_argument("--log-level", help="override log.level")
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here once serving")
    return p


def _apply_overrides(cfg: MgmtdConfig, args: argparse.Namespace) -> MgmtdConfig:
    top = {
        "node_id": args.node_id,
        "listen_host": args.listen_host,
        "listen_port": args.port,
    }
    cfg = dataclasses.replace(cfg, **{k: v for k, v in top.items() if v is not None})
    kv = {"engine": args.kv_engine, "path": args.kv_path}
    if any(v is not None for v in kv.values()):
        cfg.kv = dataclasses.replace(cfg.kv, **{k: v for k, v in kv.items() if v is not None})
    if args.log_level is not None:
        cfg.log = dataclasses.replace(cfg.log, level=args.log_level)
    if cfg.node_id <= 0 or not 0 <= cfg.listen_port <= 65535:
        raise FS3Error(StatusCode.CONFIG_INVALID, "node id must be > 0 and port 0..65535")
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


async def serve(cfg: MgmtdConfig, *, port_file: str | None = None) -> int:
    """Run one mgmtd until SIGTERM/SIGINT. Raises FS3Error when it cannot start."""
    from fs3.kv import open_database
    from fs3.mgmtd.server import MgmtdServer

    secret = read_secret(cfg.cluster_secret_file)
    if cfg.kv.engine == "lmdb" and not cfg.kv.path:
        raise FS3Error(StatusCode.CONFIG_INVALID, "kv.path must name a directory for the lmdb engine")
    try:
        db = await open_database(cfg.kv)
    except (OSError, TypeError, ValueError, ImportError) as e:
        raise FS3Error(StatusCode.CONFIG_INVALID, f"cannot open the {cfg.kv.engine} store: {e}") from None
    from fs3 import metrics

    server = MgmtdServer(cfg, db, secret=secret, registry=metrics.registry())
    try:
        await server.start()
    except BaseException:
        await db.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if port_file:
        _write_port_file(port_file, server.port)
    try:
        await stop.wait()
        log.info("shutdown requested")
    finally:
        await server.stop()
        await db.close()
    return 0


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 mgmtd``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        cfg = _apply_overrides(load_config(MgmtdConfig, args.config), args)
    except FS3Error as e:
        sys.stderr.write(f"fs3 mgmtd: {e.message}\n")
        return 2
    from fs3.log import setup_logging

    try:
        setup_logging(cfg.log, "mgmtd")
    except OSError as e:
        sys.stderr.write(f"fs3 mgmtd: cannot open log file {cfg.log.file}: {e.strerror}\n")
        return 2
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # uvloop is a dependency; plain asyncio still works without it
        runner = asyncio.run
    try:
        return runner(serve(cfg, port_file=args.port_file))
    except FS3Error as e:
        log.error("mgmtd failed to start: %s", e.message)
        sys.stderr.write(f"fs3 mgmtd: {e.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130
