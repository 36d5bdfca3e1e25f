"""The client library (routing cache, mgmtd/meta/storage clients, native file API) and the FUSE mount.

``fs3.client.FileSystem`` (async) and ``fs3.client.SyncFileSystem`` are the native file API
(:mod:`fs3.client.filesystem`); they are imported on first use, so services that import only the
mgmtd or storage client do not load the whole client.
"""

from typing import Any

_LAZY = {"FileSystem", "File", "SyncFileSystem", "SyncFile", "StatResult"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from fs3.client import filesystem

        return getattr(filesystem, name)
    raise AttributeError(f"module 'fs3.client' has no attribute {name!r}")
