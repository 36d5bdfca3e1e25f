"""A key-value cache whose values live in fs3 files (for inference KV caches, embeddings, samples).

Each value is one file, named by the SHA-256 of its key, in one of 256 shard directories under the
cache's root directory::

    <root>/<first two hex digits>/<64 hex digits>       an entry
    <root>/<first two hex digits>/<64 hex digits>.<pid>-<12 hex digits>.tmp   an entry being written

The cache touches nothing else under its root: other files, and directories that are not shards,
are neither read, counted nor evicted (so even a root of ``/`` is safe, if untidy).

An entry starts with a header -- magic, key length, value length, a CRC32C of the key and the
value -- then the key itself, then the value, so a read checks that the file holds the key asked
for (not a hash collision or a foreign file), all of its value, and the bytes that were written.
A put writes a temporary file, closes it (which settles its length in meta) and renames it over
the entry's name: meta's rename is atomic, so readers in any process see the old value or the new
one, never a part. Several clients, on any number of nodes, can share one cache; the last put of
a key wins.

A read finds an entry by path, then reads its chunks from storage. If the entry is unlinked in
between (evicted, deleted, or replaced by a put), meta collects its chunks and those read as
zeros; the checksum catches that, and the entry is read once more, by path: the new value, or a
miss if the key is gone. An entry whose checksum still fails reads as a miss, logged as a warning,
never as its bytes: the cache only holds what its callers can recompute, and their next put
replaces the bad entry. Entries of format version 1 (no checksum; the version is the magic's last
two bytes) read as misses too, for the same reason; eviction counts and removes them like the
others.

:meth:`KVCache.get_many` is the sample-loading path: one lookup per key (concurrently) and one
batched storage read spread over every storage node, as :meth:`FileSystem.read_batch` does.

The index is the namespace itself (no separate map to keep consistent, and nothing to rebuild
after a crash). Eviction is explicit: :meth:`KVCache.evict` removes the entries with the oldest
modification time until the cache fits a byte budget, and the temporary files of puts that died.
With ``touch_on_get=True`` a hit refreshes the entry's modification time (one metadata update per
hit), which makes eviction least-recently-used instead of oldest-written-first.

Permissions: shard directories and entries take the permission bits of the cache's root directory
as the first put of a :class:`KVCache` finds it (directories all of them, setgid and sticky
included; entries the read and write bits), so a root made group-writable and setgid (``chmod 2775``,
group the team's) is a cache every member of that group can put into, replace and evict, whoever
made a shard first. A root that does not exist yet is made 0755 (entries 0644), writable by its
maker alone. ``dir_mode`` and ``file_mode`` set the bits instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import struct
import time
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import crc32c as _crc32c

from fs3.errors import FS3Error, StatusCode, call_os_flavoured
from fs3.proto import meta_pb2 as m

if TYPE_CHECKING:
    from .filesystem import FileSystem, SyncFileSystem

T = TypeVar("T")
log = logging.getLogger(__name__)

_MAGIC = b"fs3kv\x00\x02\x00"  # the format version is its last two bytes
_OLD_MAGICS = (b"fs3kv\x00\x01\x00",)  # formats this module no longer writes: read as misses
# magic, key length, value length, CRC32C of the key and the value; then the key, then the value
_HEADER = struct.Struct("<8sIQI")
MAX_KEY_BYTES = 4096
_WHOLE_FILE = 1 << 62  # a read length that the client clamps to the file's length
# The names this module makes (see the module docstring), and so the only ones evict() removes.
_SHARD_NAME = re.compile(r"[0-9a-f]{2}")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
_TMP_NAME = re.compile(r"([0-9a-f]{64})\.[0-9a-f]+-[0-9a-f]{12}\.tmp")


@dataclass(slots=True, frozen=True)
class CacheUsage:
    entries: int
    bytes: int  # file bytes of the entries (headers and keys included)
    temporary_files: int


@dataclass(slots=True, frozen=True)
class EvictReport:
    removed: int  # entries removed
    freed: int  # their bytes
    temporary_removed: int  # abandoned temporary files removed
    remaining_bytes: int


@dataclass(slots=True, frozen=True)
class _File:
    path: str
    inode: int
    size: int
    mtime_ns: int
    temporary: bool


def entry_name(key: bytes) -> str:
    """The file name of ``key``'s entry (the hex SHA-256 of the key)."""
    return hashlib.sha256(key).hexdigest()


def encode_entry(key: bytes, value: bytes | bytearray | memoryview) -> bytes:
    """The bytes of an entry file holding ``value`` (any buffer: its bytes, in order) for ``key``."""
    view = _value_bytes(value)
    crc = _crc32c.crc32c(view, _crc32c.crc32c(key))
    return b"".join((_HEADER.pack(_MAGIC, len(key), len(view), crc), key, view))


def _value_bytes(value: bytes | bytearray | memoryview) -> memoryview:
    """``value``'s bytes as a flat byte view: an array('i') or a 2-D view counts its bytes, not its
    items (the header said 2 for an array of two ints holding 8: an entry never read back)."""
    view = memoryview(value)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def decode_entry(key: bytes, data: bytes, where: str) -> bytes | None:
    """The value in entry file bytes ``data``, checked to be ``key``'s, whole and as written.

    None for bytes that may be what an entry of ``key`` reads as but whose value cannot be
    trusted: a checksum that fails (chunks collected under a racing reader, or corruption), a
    header of zeros (the first chunk collected), an entry cut short (an empty file included) or
    grown past its header's length, or an older format with no checksum. Raises
    INVALID_ARGUMENT for a file that is not ``key``'s entry at all."""
    return _decode(key, data, where)[0]


_OLD_FORMAT = "an older format"


def _decode(key: bytes, data: bytes, where: str) -> tuple[bytes | None, str]:
    """(value, "") or (None, why the bytes read as a miss); see :func:`decode_entry`."""
    if data[: len(_MAGIC)] in _OLD_MAGICS:
        return None, _OLD_FORMAT
    if len(data) < _HEADER.size:
        if _MAGIC.startswith(data[: len(_MAGIC)]):  # what is left of one (empty too): no whole value
            return None, f"{len(data)} bytes, a header's start at most"
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{where}: not a cache entry ({len(data)} bytes)")
    magic, key_len, value_len, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        if not any(data[: _HEADER.size]):
            # no put writes this: the entry's first chunk is gone (collected, see the docstring)
            return None, "a header of zeros"
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{where}: not a cache entry (bad magic)")
    start = _HEADER.size + key_len
    if len(data) - start != value_len:
        # an entry cut short or grown (not by a put: each writes a whole one): a miss, which a
        # put of the key replaces, not an error for every get of it until then
        return None, f"{len(data) - start} value bytes where its header says {value_len}"
    body = memoryview(data)[_HEADER.size :]
    if _crc32c.crc32c(body) != crc:
        # before the key check: the key is in the chunks that a racing removal collects as well
        return None, "a checksum that fails"
    if body[:key_len] != key:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"{where}: the entry holds another key")
    return data[start:], ""


def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        k = key.encode()
    elif isinstance(key, bytes | bytearray | memoryview):
        k = bytes(key)
    else:  # bytes(3) would be three zero bytes: another key than the caller meant
        raise TypeError(f"a cache key is bytes or str, not {type(key).__name__}")
    if not k or len(k) > MAX_KEY_BYTES:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT, f"a cache key must be 1..{MAX_KEY_BYTES} bytes, not {len(k)}"
        )
    return k


class KVCache:
    """Values by key in files under ``root`` (made on first put) of an fs3 :class:`FileSystem`."""

    def __init__(
        self,
        fs: FileSystem,
        root: str | os.PathLike[str] = "/kvcache",
        *,
        concurrency: int = 64,
        touch_on_get: bool = False,
        tmp_grace_s: float = 600.0,
        dir_mode: int | None = None,
        file_mode: int | None = None,
    ) -> None:
        root = os.fsdecode(root)  # a pathlib.Path too
        if not root.startswith("/"):
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"the cache root must be an absolute path: {root!r}")
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self._prefix = root.rstrip("/")  # what shard directory paths start with ("" for "/")
        self.touch_on_get = touch_on_get
        self.tmp_grace_s = tmp_grace_s
        self._sem = asyncio.Semaphore(concurrency)
        self._shards_made: set[str] = set()
        for what, mode in (("dir_mode", dir_mode), ("file_mode", file_mode)):
            if mode is not None and not 0 <= mode <= 0o7777:
                raise FS3Error(
                    StatusCode.INVALID_ARGUMENT, f"{what} must be permission bits (0 to 0o7777): {mode!r}"
                )
        self._modes_given = (dir_mode, file_mode)
        self._dir_mode, self._file_mode = 0o755, 0o644  # until _learn_modes has settled them
        self._modes_learned = False
        self._modes_lock = asyncio.Lock()

    def path_of(self, key: bytes | str) -> str:
        """Where ``key``'s entry lives."""
        name = entry_name(_key_bytes(key))
        return f"{self._shard_dir(name)}/{name}"

    def _shard_dir(self, name: str) -> str:
        return f"{self._prefix}/{name[:2]}"

    # -- writes -----------------------------------------------------------------------------------

    async def put(self, key: bytes | str, value: bytes | bytearray | memoryview) -> None:
        """Store ``value`` under ``key`` (replacing what it held), visible to every client once
        this returns."""
        k = _key_bytes(key)
        name = entry_name(k)
        shard = self._shard_dir(name)
        tmp = f"{shard}/{name}.{os.getpid():x}-{os.urandom(6).hex()}.tmp"  # as _TMP_NAME says
        data = encode_entry(k, value)
        async with self._sem:
            await self._ensure_shard(shard)
            try:
                try:
                    await self.fs.write_file(tmp, data, self._file_mode)
                except FS3Error as e:
                    if e.code != StatusCode.NOT_FOUND:
                        raise
                    # the shard directory went away (someone removed the cache): make it again
                    self._shards_made.discard(shard)
                    await self._ensure_shard(shard)
                    await self.fs.write_file(tmp, data, self._file_mode)
                await self.fs.rename(tmp, f"{shard}/{name}")
            except BaseException:
                try:
                    await self.fs.unlink(tmp)
                except Exception:  # noqa: BLE001 - the write's error matters, evict() sweeps leftovers
                    pass
                raise

    async def put_many(self, items: Iterable[tuple[bytes | str, bytes | bytearray | memoryview]]) -> None:
        """Store many values concurrently (at most ``concurrency`` at a time). A key given more
        than once keeps its last value, as a dict would. Every item is checked before any is
        stored (a bad key or value stores nothing), and the call returns once every put has
        ended: an error (the first) is raised then, not while other puts still run."""
        latest: dict[bytes, bytes | bytearray | memoryview] = {}
        for key, value in items:
            k = _key_bytes(key)
            memoryview(value)  # TypeError for what is no buffer, before anything is stored
            latest.pop(k, None)  # the last one given, in its place in the order
            latest[k] = value
        results = await asyncio.gather(*(self.put(k, v) for k, v in latest.items()), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _ensure_shard(self, shard: str) -> None:
        await self._learn_modes()
        if shard in self._shards_made:
            return
        await self.fs.mkdir(shard, self._dir_mode, parents=True)
        self._shards_made.add(shard)

    async def _learn_modes(self) -> None:
        """Settle the modes of new shards and entries (see the module docstring), once."""
        if self._modes_learned:
            return
        async with self._modes_lock:  # the first put asks; those racing it wait for its answer
            if self._modes_learned:
                return
            dir_mode, file_mode = self._modes_given
            if dir_mode is None or file_mode is None:
                try:
                    root = (await self.fs.stat(self.root)).st_mode & 0o7777
                except FS3Error as e:
                    if e.code != StatusCode.NOT_FOUND:
                        raise
                    root = 0o755  # what the first shard's mkdir makes it
                dir_mode = root if dir_mode is None else dir_mode
                file_mode = root & 0o666 if file_mode is None else file_mode
            self._dir_mode, self._file_mode = dir_mode, file_mode
            self._modes_learned = True

    async def delete(self, key: bytes | str) -> bool:
        """Remove ``key``'s entry; False if there was none."""
        try:
            await self.fs.unlink(self.path_of(key))
        except FS3Error as e:
            if e.code == StatusCode.NOT_FOUND:
                return False
            raise
        return True

    # -- reads ------------------------------------------------------------------------------------

    async def get(self, key: bytes | str) -> bytes | None:
        """``key``'s value, or None if the cache does not hold it."""
        return (await self.get_many([key]))[0]

    async def contains(self, key: bytes | str) -> bool:
        return await self.fs.exists(self.path_of(key))

    async def get_many(self, keys: Sequence[bytes | str]) -> list[bytes | None]:
        """The values of ``keys`` (None for each one not held, or whose entry does not read as a
        whole value: see the module docstring), read as one storage batch."""
        ks = [_key_bytes(k) for k in keys]
        paths = [self.path_of(k) for k in ks]
        try:
            datas: list[bytes | None] = list(await self.fs.read_batch([(p, 0, _WHOLE_FILE) for p in paths]))
        except FS3Error as e:
            if e.code != StatusCode.NOT_FOUND:
                raise
            datas = await self._read_present(paths)
        out: list[bytes | None] = []
        again: list[int] = []  # entries whose bytes were not the value: read them once more
        for i, (k, p, data) in enumerate(zip(ks, paths, datas, strict=True)):
            value, why = (None, "") if data is None else _decode(k, data, p)
            if why == _OLD_FORMAT:
                log.debug("cache entry of an older format read as a miss: path=%s", p)
            elif why:
                log.debug("cache entry read as %s, reading it again: path=%s", why, p)
                again.append(i)
            out.append(value)
        if again:
            # Most likely the entry was unlinked under this read and its chunks collected: a second
            # lookup finds the entry that replaced it, or none.
            for i, data in zip(again, await self._read_present([paths[i] for i in again]), strict=True):
                value, why = (None, "") if data is None else _decode(ks[i], data, paths[i])
                if why:
                    log.warning("cache entry read as a miss, it has %s: path=%s", why, paths[i])
                out[i] = value
        if self.touch_on_get:
            await asyncio.gather(*(self._touch(p) for p, d in zip(paths, out, strict=True) if d is not None))
        return out

    async def _read_present(self, paths: list[str]) -> list[bytes | None]:
        """Some keys are missing: find the present ones, then batch-read those. An entry removed
        between the two steps reads as missing."""
        found = await asyncio.gather(*(self.fs.exists(p) for p in paths))
        present = [p for p, ok in zip(paths, found, strict=True) if ok]
        try:
            got = dict(
                zip(present, await self.fs.read_batch([(p, 0, _WHOLE_FILE) for p in present]), strict=True)
            )
        except FS3Error as e:
            if e.code != StatusCode.NOT_FOUND:
                raise
            got = {}
            for p, r in zip(
                present, await asyncio.gather(*(self._read_one(p) for p in present)), strict=True
            ):
                if r is not None:
                    got[p] = r
        return [got.get(p) for p in paths]

    async def _read_one(self, path: str) -> bytes | None:
        try:
            return (await self.fs.read_batch([(path, 0, _WHOLE_FILE)]))[0]
        except FS3Error as e:
            if e.code == StatusCode.NOT_FOUND:
                return None
            raise

    async def _touch(self, path: str) -> None:
        """Refresh an entry's modification time, for eviction's order only: a reader who may not
        write the entry (another user's, in a cache it may read) gets its values all the same
        (get_many raised PermissionError, and lost every value of the batch)."""
        try:
            await self.fs.utime(path)
        except FS3Error as e:
            if e.code not in (
                StatusCode.NOT_FOUND,
                StatusCode.PERMISSION_DENIED,
                StatusCode.META_NOT_PERMITTED,
            ):
                raise

    # -- upkeep -----------------------------------------------------------------------------------

    async def _names(self, path: str, inode_type: int) -> list[str]:
        """The names of the entries of type ``inode_type`` in directory ``path``; none if it is gone."""
        try:
            return [os.fsdecode(e.name) async for e in self.fs.scandir(path) if e.type == inode_type]
        except FS3Error as e:
            if e.code == StatusCode.NOT_FOUND:
                return []
            raise

    async def _files(self) -> list[_File]:
        """The entries and temporary files of this cache -- only names that this module makes, in
        the shard their name belongs to: whatever else the root holds is someone else's."""
        shards = [s for s in await self._names(self.root, m.INODE_DIRECTORY) if _SHARD_NAME.fullmatch(s)]
        names = await asyncio.gather(*(self._names(f"{self._prefix}/{s}", m.INODE_FILE) for s in shards))
        found: list[tuple[str, bool]] = []
        for shard, ns in zip(shards, names, strict=True):
            for n in ns:
                tmp = _TMP_NAME.fullmatch(n)
                if (tmp or _ENTRY_NAME.fullmatch(n)) and (tmp[1] if tmp else n).startswith(shard):
                    found.append((f"{self._prefix}/{shard}/{n}", tmp is not None))

        async def stat(path: str, temporary: bool) -> _File | None:
            async with self._sem:
                try:
                    st = await self.fs.stat(path, follow_symlinks=False)
                except FS3Error as e:
                    if e.code == StatusCode.NOT_FOUND:
                        return None  # removed meanwhile
                    raise
            return _File(path, st.st_ino, st.st_size, st.st_mtime_ns, temporary)

        return [f for f in await asyncio.gather(*(stat(p, t) for p, t in found)) if f is not None]

    async def usage(self) -> CacheUsage:
        """How many entries the cache holds and their bytes (one stat per file)."""
        files = await self._files()
        entries = [f for f in files if not f.temporary]
        return CacheUsage(len(entries), sum(f.size for f in entries), len(files) - len(entries))

    async def evict(self, max_bytes: int) -> EvictReport:
        """Remove the oldest entries (by modification time) until the entries' bytes are at most
        ``max_bytes``, and temporary files older than ``tmp_grace_s`` (puts that died)."""
        if max_bytes < 0:
            raise FS3Error(StatusCode.INVALID_ARGUMENT, f"negative byte budget {max_bytes}")
        files = await self._files()
        stale_before = time.time_ns() - int(self.tmp_grace_s * 1e9)
        stale = [f for f in files if f.temporary and f.mtime_ns < stale_before]
        entries = sorted((f for f in files if not f.temporary), key=lambda f: f.mtime_ns)
        total = sum(f.size for f in entries)
        victims = []
        for f in entries:
            if total <= max_bytes:
                break
            victims.append(f)
            total -= f.size

        replaced = 0  # bytes of entries that puts wrote over victims since they were chosen

        async def remove(f: _File) -> bool:
            nonlocal replaced
            async with self._sem:
                try:
                    # A put may have renamed a new entry over a victim since the snapshot, and the
                    # unlink goes by path: remove only the file that was chosen. Meta has no
                    # unlink-if-inode, so a put landing between this stat and the unlink (one meta
                    # round trip) still loses its value, which a later get sees as a miss.
                    st = await self.fs.stat(f.path, follow_symlinks=False)
                    if st.st_ino != f.inode:
                        replaced += st.st_size
                        return False
                    await self.fs.unlink(f.path)
                except FS3Error as e:
                    if e.code == StatusCode.NOT_FOUND:
                        return False
                    raise
            return True

        gone = await asyncio.gather(*(remove(f) for f in victims + stale))
        removed = [f for f, ok in zip(victims, gone[: len(victims)], strict=True) if ok]
        return EvictReport(
            len(removed), sum(f.size for f in removed), sum(gone[len(victims) :]), total + replaced
        )


class SyncKVCache:
    """The blocking face of :class:`KVCache`, over a :class:`SyncFileSystem`."""

    def __init__(self, fs: SyncFileSystem, root: str | os.PathLike[str] = "/kvcache", **options: Any) -> None:
        self._fs = fs
        self.aio = call_os_flavoured(KVCache, fs.aio, root, **options)

    def _run(self, coro: Awaitable[T]) -> T:
        return self._fs._loop.run(coro)

    def put(self, key: bytes | str, value: bytes | bytearray | memoryview) -> None:
        self._run(self.aio.put(key, value))

    def put_many(self, items: Iterable[tuple[bytes | str, bytes | bytearray | memoryview]]) -> None:
        self._run(self.aio.put_many(list(items)))

    def get(self, key: bytes | str) -> bytes | None:
        return self._run(self.aio.get(key))

    def get_many(self, keys: Sequence[bytes | str]) -> list[bytes | None]:
        return self._run(self.aio.get_many(list(keys)))

    def contains(self, key: bytes | str) -> bool:
        return self._run(self.aio.contains(key))

    def delete(self, key: bytes | str) -> bool:
        return self._run(self.aio.delete(key))

    def path_of(self, key: bytes | str) -> str:
        return call_os_flavoured(self.aio.path_of, key)

    def usage(self) -> CacheUsage:
        return self._run(self.aio.usage())

    def evict(self, max_bytes: int) -> EvictReport:
        return self._run(self.aio.evict(max_bytes))
