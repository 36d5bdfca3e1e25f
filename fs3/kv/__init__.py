"""fs3.kv: one transactional, ordered key-value interface with FoundationDB's semantics.

Open a store with :func:`open_database` (from a coroutine) or :func:`open_database_sync`::

    from fs3.kv import open_database

    db = await open_database("lmdb", path="/var/lib/fs3/meta")   # or "mem", or
    db = await open_database("fdb", cluster_file="/etc/foundationdb/fdb.cluster")
    db = await open_database(config.kv)                           # a KvConfig-like object

    async def create(tr):
        if await tr.get(b"INOD" + ino) is None:
            tr.set(b"INOD" + ino, inode_bytes)
    await db.run(create)        # retried on conflict, returns once durable
    ...
    await db.close()

Engines and their settings (unknown settings raise ``TypeError``):

``"mem"``
    In-process, for unit tests. No settings.
``"lmdb"``
    The embedded default; ``path`` (a directory, created if missing) is required. Several processes
    on one host may open the same ``path`` at once. ``map_size`` (bytes, default 256 GiB; address
    space only, the file grows with the data) bounds the store's size. ``group_commit_interval_ms``
    bounds how long a committed batch waits for its fsync; the engine's flush thread starts that
    fsync at once, so the bound always holds and no commit waits for a timer (batching needs no
    wait: transactions queue up while the previous batch is being synced). ``max_readers``
    (default 1024) bounds the transactions open at once on the host, across processes.
``"fdb"``
    FoundationDB via the official binding; ``cluster_file`` (default: the binding's default lookup).

See :mod:`fs3.kv.base` for the semantics every engine provides.
"""

from __future__ import annotations

import asyncio
import errno
from typing import Any

from fs3.kv.base import (
    MAX_KEY_SIZE,
    MAX_TXN_SIZE,
    MAX_VALUE_SIZE,
    CommitStats,
    Database,
    KeyValue,
    ReadView,
    StoreSpace,
    Transaction,
    prefix_end,
)

__all__ = [
    "ENGINES",
    "CommitStats",
    "MAX_KEY_SIZE",
    "MAX_TXN_SIZE",
    "MAX_VALUE_SIZE",
    "Database",
    "KeyValue",
    "ReadView",
    "StoreSpace",
    "Transaction",
    "open_daemon_store",
    "open_database",
    "open_database_sync",
    "prefix_end",
]

ENGINES = ("mem", "lmdb", "fdb")

# Fields a KvConfig-like object may carry; None means "engine default".
_CONFIG_FIELDS = ("path", "cluster_file", "group_commit_interval_ms", "map_size", "max_readers")
_ENGINE_SETTINGS: dict[str, set[str]] = {
    "mem": set(),
    "lmdb": {"path", "group_commit_interval_ms", "map_size", "max_readers"},
    "fdb": {"cluster_file"},
}


def open_database_sync(
    engine: str | Any,
    *,
    path: str | None = None,
    cluster_file: str | None = None,
    group_commit_interval_ms: float | None = None,
    map_size: int | None = None,
    max_readers: int | None = None,
) -> Database:
    """Open a store without awaiting (usable before an event loop runs).

    ``engine`` is ``"mem"``, ``"lmdb"`` or ``"fdb"``, or a config object with an ``engine``
    attribute and any of ``path``, ``cluster_file``, ``group_commit_interval_ms``, ``map_size``,
    ``max_readers`` (keyword arguments given here override its fields).
    """
    explicit: dict[str, Any] = {
        "path": path,
        "cluster_file": cluster_file,
        "group_commit_interval_ms": group_commit_interval_ms,
        "map_size": map_size,
        "max_readers": max_readers,
    }
    explicit = {k: v for k, v in explicit.items() if v is not None}
    settings = dict(explicit)
    if not isinstance(engine, str):
        # A config object carries every engine's fields; take those it sets, ignore the rest.
        config, engine = engine, engine.engine
        for name in _CONFIG_FIELDS:
            value = getattr(config, name, None)
            if name not in settings and value is not None and value != "":
                settings[name] = value
    if engine not in _ENGINE_SETTINGS:
        raise ValueError(f"unknown kv engine {engine!r} (expected one of {', '.join(ENGINES)})")
    allowed = _ENGINE_SETTINGS[engine]
    extra = sorted(set(explicit) - allowed)
    if extra:
        raise TypeError(f"kv engine {engine!r} takes no setting(s) {', '.join(extra)}")
    settings = {k: v for k, v in settings.items() if k in allowed}

    if engine == "mem":
        from fs3.kv.memory import MemoryDatabase

        return MemoryDatabase()
    if engine == "lmdb":
        from fs3.kv.lmdb_engine import LmdbDatabase

        if "path" not in settings:
            raise TypeError("kv engine 'lmdb' needs a path")
        return LmdbDatabase(**settings)
    from fs3.kv.fdb_engine import FdbDatabase

    return FdbDatabase(**settings)


async def open_database(
    engine: str | Any,
    *,
    path: str | None = None,
    cluster_file: str | None = None,
    group_commit_interval_ms: float | None = None,
    map_size: int | None = None,
    max_readers: int | None = None,
) -> Database:
    """Open a store; the same arguments as :func:`open_database_sync`, without blocking the loop."""
    return await asyncio.to_thread(
        open_database_sync,
        engine,
        path=path,
        cluster_file=cluster_file,
        group_commit_interval_ms=group_commit_interval_ms,
        map_size=map_size,
        max_readers=max_readers,
    )


async def open_daemon_store(kv: Any) -> Database:
    """Open the store of a daemon's ``kv`` config section (mgmtd's, meta's), or raise
    FS3Error(CONFIG_INVALID) saying what is wrong with it.

    An lmdb store's own directory is made if missing, never its parents: the store's parent is on
    its disk, and a disk that failed to mount at boot (or a mistyped path) leaves no parent; making
    the path there would start an empty store, and a meta on an empty store would serve clients an
    empty file system of its own (whose new files' chunk ids are those of the real one's)."""
    return await asyncio.to_thread(_open_daemon_store, kv)


def _open_daemon_store(kv: Any) -> Database:
    from pathlib import Path

    from fs3.errors import FS3Error, StatusCode

    if kv.engine == "lmdb":
        if not kv.path:
            raise FS3Error(StatusCode.CONFIG_INVALID, "kv.path must name a directory for the lmdb engine")
        path = Path(kv.path)
        if not path.exists() and not path.parent.is_dir():
            raise FS3Error(
                StatusCode.CONFIG_INVALID,
                f"kv.path {path}: its parent {path.parent} is not an existing directory (is the "
                "store's disk mounted? make the parent once; fs3 creates only the store's directory)",
            )
    try:
        return open_database_sync(kv)
    except (OSError, TypeError, ValueError, ImportError) as e:
        # A disk error or a full disk is no config's fault: the daemon fails (exit 1), and is
        # started again; a path that cannot be the store's is (exit 2, not started again).
        transient = isinstance(e, OSError) and e.errno in (
            errno.EIO,
            errno.ENOSPC,
            errno.ENOMEM,
            errno.EAGAIN,
        )
        code = StatusCode.UNAVAILABLE if transient else StatusCode.CONFIG_INVALID
        raise FS3Error(code, f"cannot open the {kv.engine} store: {e}") from None
