"""Recovery when a target is opened: reconcile the data files with the metadata after a crash.

Metadata is the truth. A crash can leave three kinds of debris, all harmless to committed data:
a new version's file written but never recorded (or a replaced version's file recorded as gone but
not yet deleted): removed; bytes appended in place to a committed version's file but never
recorded: trimmed; a committed layered version not yet folded into its data file: reported (the
engine folds it). Pending versions are kept: whether they commit is for the chain to
decide (:meth:`ChunkEngine.pending_chunks`, then commit or abort).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from .chunk_files import ChunkFiles
from .chunk_meta_store import ChunkMetaStore

log = logging.getLogger(__name__)

_BATCH = 1024


@dataclass(slots=True, frozen=True)
class RecoveryReport:
    """What opening the engine found and did."""

    orphans_removed: int
    files_trimmed: int
    unknown_files: int  # files whose names fs3 does not write: left alone, logged
    missing_files: list[tuple[bytes, int]]  # (chunk id, file id) recorded but absent: data lost
    pending: int
    # chunks whose committed version is still layered (a crash between a commit and its fold):
    # the engine folds them when it opens
    layered: list[bytes] = field(default_factory=list)


def recover(store: ChunkMetaStore, files: ChunkFiles) -> tuple[RecoveryReport, int]:
    """Reconcile files with metadata; return the report and the first file id that is safe to use
    (above every id in the metadata and on disk, so no new file can collide with debris)."""
    orphans = trimmed = unknown = 0
    seen: set[tuple[bytes, int]] = set()
    max_fid = store.stats().max_file_id
    for found in files.scan():
        if found.chunk_id is None:
            unknown += 1
            log.warning("unknown file in chunk directory path=%s", found.path)
            continue
        max_fid = max(max_fid, found.file_id)
        meta = store.get(found.chunk_id)
        needed = meta.file_lengths() if meta is not None else {}
        if found.file_id not in needed:
            os.unlink(found.path)
            orphans += 1
            continue
        seen.add((found.chunk_id, found.file_id))
        if found.size > needed[found.file_id]:
            os.truncate(found.path, needed[found.file_id])
            trimmed += 1

    missing: list[tuple[bytes, int]] = []
    layered: list[bytes] = []
    pending = 0
    start = b""
    while True:
        batch = store.scan(start, None, _BATCH)
        for meta in batch:
            pending += meta.pending is not None
            if meta.committed is not None and meta.committed.layered:
                layered.append(meta.chunk_id)
            missing += [
                (meta.chunk_id, fid) for fid in meta.file_lengths() if (meta.chunk_id, fid) not in seen
            ]
        if len(batch) < _BATCH:
            break
        start = batch[-1].chunk_id + b"\0"
    for chunk_id, file_id in missing:
        log.error("data file missing chunk=%s file_id=%x", chunk_id.hex(), file_id)
    return RecoveryReport(orphans, trimmed, unknown, missing, pending, layered), max_fid + 1
