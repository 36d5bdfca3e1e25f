"""Chunk metadata: the versions a chunk holds, their checksums, and how they are stored in LMDB.

A chunk holds at most two versions: the *committed* one, which readers are served, and one *pending*
one, written by an update that the chain has not committed yet (CRAQ). Each version records its
length, the CRC32C of its whole content (compared between replicas and during resync), one CRC32C
per checksum block of the version (4 KiB or 64 KiB, see :func:`block_size`; so that a small read
reads and verifies only the blocks it covers) and the id of the data file that holds it. A pending version may also be a *removal*: committing it deletes the
chunk.

A version may also be *layered*: its bytes are those of its data file except for some runs of
whole checksum blocks (one, ``[overlay_first, overlay_end)``, or several, ``overlay_runs``), which an
*overlay* file holds back to back (a small overwrite, or a write of several small ranges, writes only
the blocks it touches instead of copying the chunk; see
:meth:`fs3.storage.chunk_engine.ChunkEngine.update`).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import crc32c as _crc32c

from fs3.errors import FS3Error, StatusCode

KiB = 1024
MiB = 1024 * KiB

MIN_CHUNK_SIZE = 64 * KiB
MAX_CHUNK_SIZE = 64 * MiB
#: Granularity of the per-block checksums: part of the on-disk format. Formats 1 and 2 know only
#: CHECKSUM_BLOCK; format 3 also has FINE_BLOCK (a flag of each version says which it uses), which
#: new versions of chunks up to FINE_MAX_CHUNK get (see block_size): a small read then reads and
#: verifies 4 KiB, not 64, and a small overwrite's overlay is 4 KiB too, while the checksums of a
#: version stay at most 4 KiB of metadata.
CHECKSUM_BLOCK = 64 * KiB
FINE_BLOCK = 4 * KiB
FINE_MAX_CHUNK = 4 * MiB
#: Chunk ids are opaque byte strings that sort like the chunks of a file (fixed-width big-endian
#: inode id + chunk index); LMDB keys may not exceed 511 bytes, and nobody needs more than this.
MAX_CHUNK_ID_LEN = 64
#: 2 added layered versions (flag bit 1 and an overlay record); 3 added FINE_BLOCK versions (flag
#: bit 2); 4 added layered versions of several block runs (flag bit 3 and a run list); 5 added lost
#: versions (flag bit 4). Each format reads as the next.
FORMAT_VERSION = 5
READABLE_FORMATS = (1, 2, 3, 4, 5)


#: ``crc32c(data, value=0)``: CRC32C (Castagnoli) of ``data``, continuing from ``value`` (the CRC
#: of the preceding bytes). The C function itself, not a Python wrapper around it: a chunk of 4 KiB
#: checksum blocks takes one call per block (block_crcs of 1 MiB: 106-112 µs through a wrapper,
#: 97-101 without).
crc32c: Callable[..., int] = _crc32c.crc32c


def check_chunk_size(chunk_size: int) -> None:
    """Refuse a chunk size that is not a power of two from 64 KiB to 64 MiB."""
    if (
        not isinstance(chunk_size, int)
        or chunk_size < MIN_CHUNK_SIZE
        or chunk_size > MAX_CHUNK_SIZE
        or chunk_size & (chunk_size - 1)
    ):
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"chunk size {chunk_size!r} is not a power of two from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE}",
        )


def check_chunk_id(chunk_id: bytes) -> None:
    """Refuse chunk ids that are not non-empty bytes of at most MAX_CHUNK_ID_LEN."""
    if not isinstance(chunk_id, bytes) or not 0 < len(chunk_id) <= MAX_CHUNK_ID_LEN:
        raise FS3Error(StatusCode.INVALID_ARGUMENT, f"bad chunk id {chunk_id!r}")


def block_size(chunk_size: int) -> int:
    """The checksum block of a new (not layered or appended) version of a chunk of this size."""
    return FINE_BLOCK if chunk_size <= FINE_MAX_CHUNK else CHECKSUM_BLOCK


def block_runs(extents: Sequence[tuple[int, int]], block: int) -> list[tuple[int, int]]:
    """The runs of whole ``block``-byte blocks ``[first, end)`` that byte ranges ``(offset,
    length)`` (increasing) touch: increasing, apart (touching runs joined)."""
    runs: list[list[int]] = []
    for offset, length in extents:
        first, end = offset // block, block_count(offset + length, block)
        if runs and first <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([first, end])
    return [(first, end) for first, end in runs]


def block_count(length: int, block: int = CHECKSUM_BLOCK) -> int:
    return -(-length // block)


def block_crcs(data: bytes | bytearray | memoryview, block: int = CHECKSUM_BLOCK) -> bytes:
    """The per-block CRC32Cs of ``data`` (the last block may be short), packed little-endian u32."""
    view = memoryview(data)
    crcs = [crc32c(view[i : i + block]) for i in range(0, len(view), block)]
    return struct.pack(f"<{len(crcs)}I", *crcs)


class ChunkState(enum.IntEnum):
    """COMMITTED: no update in flight. PENDING: a pending version (or removal) awaits commit/abort."""

    COMMITTED = 1
    PENDING = 2


@dataclass(slots=True, frozen=True)
class ChunkVersion:
    """One version of a chunk. ``file_id`` names its data file; a removal has no file (0).

    A layered version (``overlay_file_id`` not 0) takes blocks ``[overlay_first, overlay_end)``
    from the overlay file (which holds just those, from its offset 0) and the rest from its data
    file; or, where ``overlay_runs`` is given, the block runs ``[first, end)`` it lists (increasing
    and apart; ``overlay_first`` and ``overlay_end`` are then the first's first and the last's end),
    which the overlay file holds back to back. ``block`` is its checksum block (CHECKSUM_BLOCK or
    FINE_BLOCK).

    A lost version (``lost``) is one the chain committed and then could not read on any replica
    when it resynced a target: that target records its number, length and CRC32C without any data
    (no file, no block checksums), so that its reads fail as the unreadable copies do instead of
    serving an older version or a hole; only a write of the whole content replaces it.
    """

    version: int
    chain_ver: int
    length: int
    crc: int
    file_id: int
    block_crcs: bytes = field(default=b"", repr=False)
    removal: bool = False
    overlay_file_id: int = 0
    overlay_first: int = 0
    overlay_end: int = 0
    block: int = CHECKSUM_BLOCK
    overlay_runs: tuple[tuple[int, int], ...] = ()
    lost: bool = False

    def block_crc(self, index: int) -> int:
        return struct.unpack_from("<I", self.block_crcs, 4 * index)[0]

    @property
    def layered(self) -> bool:
        return self.overlay_file_id != 0

    def overlay_spans(self) -> list[tuple[int, int]]:
        """The byte ranges ``[start, end)`` of the version that the overlay file holds, in the order
        it holds them (none for a version that is not layered)."""
        block, length = self.block, self.length
        return [(first * block, min(end * block, length)) for first, end in self._runs()]

    def overlay_size(self) -> int:
        """Bytes in the overlay file."""
        block, length = self.block, self.length
        return sum(min(end * block, length) - first * block for first, end in self._runs())

    def _runs(self) -> tuple[tuple[int, int], ...]:
        """The overlay's block runs (none for a version that is not layered)."""
        if not self.layered:
            return ()
        return self.overlay_runs or ((self.overlay_first, self.overlay_end),)


@dataclass(slots=True, frozen=True)
class ChunkMeta:
    """What a target knows about one chunk: its size class and its committed and pending versions.

    A chunk that was created by an update that is not committed yet has ``committed is None``; it
    does not exist for readers until it commits.
    """

    chunk_id: bytes
    chunk_size: int
    committed: ChunkVersion | None
    pending: ChunkVersion | None

    @property
    def committed_ver(self) -> int:
        """The committed version, 0 if none."""
        return self.committed.version if self.committed else 0

    @property
    def pending_ver(self) -> int:
        """The pending version, 0 if none."""
        return self.pending.version if self.pending else 0

    @property
    def update_ver(self) -> int:
        """The newest version this target holds (pending if any, else committed): 3FS's updateVer."""
        return self.pending_ver or self.committed_ver

    @property
    def chain_ver(self) -> int:
        """The chain version stamped on the newest version."""
        newest = self.pending or self.committed
        return newest.chain_ver if newest else 0

    @property
    def length(self) -> int:
        """Length of the committed version (0 if none)."""
        return self.committed.length if self.committed else 0

    @property
    def crc(self) -> int:
        """CRC32C of the committed version's content (0 if none)."""
        return self.committed.crc if self.committed else 0

    @property
    def state(self) -> ChunkState:
        return ChunkState.PENDING if self.pending else ChunkState.COMMITTED

    def file_lengths(self) -> dict[int, int]:
        """The data files this chunk uses, each with the length its longest user needs.

        Two versions share a file only after an in-place append (pending extends committed).
        """
        sizes: dict[int, int] = {}
        for v in (self.committed, self.pending):
            if v is not None and not v.removal and not v.lost:
                sizes[v.file_id] = max(sizes.get(v.file_id, 0), v.length)
                if v.layered:
                    sizes[v.overlay_file_id] = v.overlay_size()
        return sizes

    def physical_bytes(self) -> int:
        """Bytes of data files this chunk holds."""
        return sum(self.file_lengths().values())


# -- encoding -------------------------------------------------------------------------------------
# value := header(format u8, log2(chunk_size) u8, flags u8) [committed] [pending]
# version := version u64, chain_ver u32, length u32, crc u32, file_id u64, kind u8, block crcs,
#            [overlay file_id u64, first block u32, end block u32]   (format 2, kind bit 1)
#            [run count u32, (first block u32, end block u32) * count]   (format 4, kind bit 3)
# kind: bit 0 a removal, bit 1 layered, bit 2 FINE_BLOCK checksums, bit 3 several overlay runs,
# bit 4 lost (no block crcs then) (format 1 has only bit 0, format 2 bits 0 and 1, format 3 bits 0
# to 2, format 4 bits 0 to 3)
_HEADER = struct.Struct("<BBB")
_VERSION = struct.Struct("<QIIIQB")
_OVERLAY = struct.Struct("<QII")
_COUNT = struct.Struct("<I")
_HAS_COMMITTED = 1
_HAS_PENDING = 2
_REMOVAL = 1
_LAYERED = 2
_FINE = 4
_RUNS = 8
_LOST = 16


def encode_meta(meta: ChunkMeta) -> bytes:
    flags = (_HAS_COMMITTED if meta.committed else 0) | (_HAS_PENDING if meta.pending else 0)
    parts = [_HEADER.pack(FORMAT_VERSION, meta.chunk_size.bit_length() - 1, flags)]
    for v in (meta.committed, meta.pending):
        if v is not None:
            kind = (_REMOVAL if v.removal else 0) | (_LAYERED if v.layered else 0)
            if v.overlay_runs:
                kind |= _RUNS
            if v.lost:
                kind |= _LOST
            if v.block == FINE_BLOCK:
                kind |= _FINE
            elif v.block != CHECKSUM_BLOCK:
                raise ValueError(f"checksum block {v.block}")
            parts.append(_VERSION.pack(v.version, v.chain_ver, v.length, v.crc, v.file_id, kind))
            parts.append(v.block_crcs)
            if v.layered:
                parts.append(_OVERLAY.pack(v.overlay_file_id, v.overlay_first, v.overlay_end))
                if v.overlay_runs:
                    flat = [i for run in v.overlay_runs for i in run]
                    parts.append(struct.pack(f"<I{len(flat)}I", len(v.overlay_runs), *flat))
    return b"".join(parts)


def decode_meta(chunk_id: bytes, value: bytes | memoryview) -> ChunkMeta:
    fmt, size_log2, flags = _HEADER.unpack_from(value, 0)
    if fmt not in READABLE_FORMATS:
        raise FS3Error(StatusCode.STORAGE_IO_ERROR, f"chunk {chunk_id.hex()}: metadata format {fmt}")
    pos = _HEADER.size
    versions: list[ChunkVersion | None] = []
    for bit in (_HAS_COMMITTED, _HAS_PENDING):
        if not flags & bit:
            versions.append(None)
            continue
        version, chain_ver, length, crc, file_id, kind = _VERSION.unpack_from(value, pos)
        pos += _VERSION.size
        removal = bool(kind & _REMOVAL)
        lost = bool(kind & _LOST)
        block = FINE_BLOCK if kind & _FINE else CHECKSUM_BLOCK
        n = 0 if removal or lost else 4 * block_count(length, block)
        crcs = bytes(value[pos : pos + n])
        pos += n
        overlay = (0, 0, 0)
        runs: tuple[tuple[int, int], ...] = ()
        if kind & _LAYERED:
            overlay = _OVERLAY.unpack_from(value, pos)
            pos += _OVERLAY.size
            if kind & _RUNS:
                (count,) = _COUNT.unpack_from(value, pos)
                flat = struct.unpack_from(f"<{2 * count}I", value, pos + _COUNT.size)
                pos += _COUNT.size + 8 * count
                runs = tuple(zip(flat[::2], flat[1::2], strict=True))
        versions.append(
            ChunkVersion(version, chain_ver, length, crc, file_id, crcs, removal, *overlay, block, runs, lost)
        )
    return ChunkMeta(chunk_id, 1 << size_log2, versions[0], versions[1])


# -- version rules --------------------------------------------------------------------------------


def select_version(chunk_id: bytes, meta: ChunkMeta | None, version: int | None) -> ChunkVersion:
    """The version a read wants: committed (``version=None``) or the one numbered ``version``."""
    if meta is None or (version is None and meta.committed is None):
        raise FS3Error(StatusCode.STORAGE_CHUNK_NOT_FOUND, f"chunk {chunk_id.hex()} has no committed version")
    if version is None:
        assert meta.committed is not None
        return meta.committed
    for v in (meta.committed, meta.pending):
        if v is not None and v.version == version and not v.removal:
            return v
    raise FS3Error(
        StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
        f"chunk {chunk_id.hex()} has no version {version} "
        f"(committed {meta.committed_ver}, pending {meta.pending_ver or 'none'})",
    )


def next_version(chunk_id: bytes, meta: ChunkMeta | None, version: int | None) -> int:
    """The version an update creates: always committed + 1. ``version`` (from a predecessor) must
    be that number, and a pending version must be that number too (a retry) or be settled first.

    CRAQ's finer outcomes (a stale update already committed or pending, treated as success; a
    missing one, an error) are the service's to decide, with :func:`check_update`, before calling."""
    expected = (meta.committed_ver if meta else 0) + 1
    if version is not None and version != expected:
        raise FS3Error(
            StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
            f"chunk {chunk_id.hex()}: update to version {version} but {expected - 1} is committed",
        )
    if meta is not None and meta.pending is not None and meta.pending.version != expected:
        raise FS3Error(
            StatusCode.STORAGE_CHUNK_VERSION_MISMATCH,
            f"chunk {chunk_id.hex()}: pending version {meta.pending.version} must be committed or aborted first",
        )
    return expected


def check_size_class(chunk_id: bytes, meta: ChunkMeta | None, chunk_size: int) -> None:
    if meta is not None and meta.chunk_size != chunk_size:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"chunk {chunk_id.hex()} has chunk size {meta.chunk_size}, not {chunk_size}",
        )


def check_fits(chunk_id: bytes, end: int, chunk_size: int) -> None:
    if end > chunk_size:
        raise FS3Error(
            StatusCode.STORAGE_CHUNK_TOO_LARGE,
            f"chunk {chunk_id.hex()}: {end} bytes do not fit in a chunk of {chunk_size}",
        )


def write_end(offset: int, length: int, extents: Sequence[tuple[int, int]] = ()) -> int:
    """Where a write ends in its chunk: after ``length`` bytes at ``offset``, or after the last of
    its ``extents`` (a write of several ranges)."""
    return extents[-1][0] + extents[-1][1] if extents else offset + length


def check_extents(offset: int, length: int, extents: Sequence[tuple[int, int]]) -> None:
    """The ranges of a write of several (UpdateIO.extents): increasing and apart, none empty, the
    first at ``offset``, ``length`` bytes in all. Raises INVALID_ARGUMENT."""
    end = -1
    for start, n in extents:
        if n <= 0 or start <= end:
            raise FS3Error(
                StatusCode.INVALID_ARGUMENT,
                f"write range {start}+{n} is empty or not after the previous one (ending at {end})",
            )
        end = start + n
    if not extents or extents[0][0] != offset or sum(n for _, n in extents) != length:
        raise FS3Error(
            StatusCode.INVALID_ARGUMENT,
            f"write ranges {list(extents)[:4]}... do not start at offset {offset} and hold length {length}",
        )


def check_checksum(chunk_id: bytes, data: bytes | bytearray | memoryview, checksum: int | None) -> None:
    if checksum is not None and crc32c(data) != checksum:
        raise FS3Error(
            StatusCode.STORAGE_CHECKSUM_MISMATCH,
            f"chunk {chunk_id.hex()}: data received does not match the sender's CRC32C",
        )


class UpdateCheck(enum.Enum):
    """How a replica should treat an update its predecessor numbered (3FS's rules)."""

    APPLY = "apply"  # the next version: store it
    COMMITTED = "committed"  # at or below the committed version: already done, answer success
    STALE = "stale"  # at or below the pending version: a retry already stored, answer success
    MISSING = "missing"  # beyond committed + 1: this replica missed updates and needs resync


def check_update(meta: ChunkMeta | None, version: int) -> UpdateCheck:
    """Classify an update numbered ``version`` against what this replica holds of the chunk."""
    committed = meta.committed_ver if meta else 0
    if version <= committed:
        return UpdateCheck.COMMITTED
    if version <= (meta.update_ver if meta else 0):
        return UpdateCheck.STALE
    if version > committed + 1:
        return UpdateCheck.MISSING
    return UpdateCheck.APPLY
