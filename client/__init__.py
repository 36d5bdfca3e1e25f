"""The client library (routing cache, mgmtd/meta/storage clients, native file API) and the FUSE mount.

``fs3.client.FileSystem`` (async, :mod:`fs3.client.filesystem`) and ``fs3.client.SyncFileSystem``
(:mod:`fs3.client.sync_api`) are the native file API; they are imported on first use, so services
that import only the mgmtd or storage client do not load the whole client.
"""

import importlib
from typing import Any

_LAZY = {
    "FileSystem": "filesystem",
    "File": "filesystem",
    "StatResult": "filesystem",
    "SyncFileSystem": "sync_api",
    "SyncFile": "sync_api",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"fs3.client.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'fs3.client' has no attribute {name!r}")
