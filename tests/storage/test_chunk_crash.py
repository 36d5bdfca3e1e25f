"""Crash test: SIGKILL a process writing chunks at random moments, 20 times; after each kill every
acknowledged commit is intact, the one operation in flight left either nothing, a pending version,
or its commit, and a pending version can be settled either way.

Set FS3_CRASH_SEED to replay a run; the seed is printed on failure.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fs3.storage.chunk_engine import ChunkEngine
from fs3.storage.chunk_meta import crc32c

WORKLOAD = Path(__file__).with_name("chunk_crash_workload.py")
KILLS = 20


@dataclass(frozen=True)
class Acked:
    version: int
    crc: int
    length: int


class Transcript:
    """What the child said: acknowledged states, and the operation in flight when it died."""

    def __init__(self, acked: dict[bytes, Acked | None]) -> None:
        self.acked = acked
        self.in_flight: bytes | None = None
        self.pending: tuple[int, int | None] | None = None  # (version, crc or None for a removal)
        self.acks = 0

    def feed(self, line: str) -> None:
        kind, *rest = line.split()
        if kind == "B":
            self.in_flight, self.pending = bytes.fromhex(rest[0]), None
        elif kind == "P":
            self.pending = (int(rest[1]), None if rest[2] == "removal" else int(rest[2]))
        elif kind in ("C", "R"):
            chunk = bytes.fromhex(rest[0])
            self.acked[chunk] = Acked(int(rest[1]), int(rest[2]), int(rest[3])) if kind == "C" else None
            self.in_flight, self.pending = None, None
            self.acks += 1
        else:
            assert kind == "READY", line


def run_and_kill(
    target: Path,
    seed: int,
    mode: str,
    kill_after: int,
    trigger: str,
    delay: float,
    transcript: Transcript,
    log: Path,
) -> None:
    """Run the workload until it has printed ``kill_after`` lines starting with ``trigger``, then
    SIGKILL it ``delay`` seconds later."""
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(WORKLOAD), str(target), str(seed), mode],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proc.stdout is not None
        seen = 0
        while seen < kill_after:
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                pytest.fail(f"workload exited with {proc.returncode}: {log.read_text()[-3000:]}")
            transcript.feed(line)
            seen += line.startswith(trigger)
        # Not a synchronisation: nothing waits for anything here. The pause only moves the kill to
        # a random point inside the operation the child is busy with (file write, fsync, LMDB
        # commit, unlink), which a kill straight after reading a line would rarely reach.
        time.sleep(delay)
        proc.kill()
        proc.wait()
        for line in proc.stdout:  # printed before the kill, so acknowledged
            transcript.feed(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def verify_and_settle(engine: ChunkEngine, t: Transcript, rng: random.Random) -> str:
    """Check the reopened target against the transcript; settle the pending version; return what
    the crash left behind (for the summary)."""
    assert engine.recovery.missing_files == []
    pending = engine.pending_chunks()
    assert [m.chunk_id for m in pending] in ([], [t.in_flight]), "only the operation in flight may be pending"
    outcome = "clean"
    for chunk in set(t.acked) | ({t.in_flight} if t.in_flight else set()):
        acked = t.acked.get(chunk)
        meta = engine.get_meta(chunk)
        committed = None if meta is None or meta.committed is None else meta.committed
        state = None if committed is None else Acked(committed.version, committed.crc, committed.length)
        if chunk != t.in_flight:
            assert state == acked, f"chunk {chunk.hex()}: acknowledged {acked}, found {state}"
            continue
        # the operation in flight: its commit may or may not have happened, but only after "P"
        if t.pending is not None and state != acked:
            version, crc = t.pending
            if crc is None:
                assert meta is None, f"chunk {chunk.hex()}: the removal committed, yet {meta}"
            else:
                assert state is not None and (state.version, state.crc) == (version, crc), state
                assert meta is not None and meta.pending is None
            t.acked[chunk] = state
            outcome = "commit survived"
            continue
        assert state == acked, f"chunk {chunk.hex()} in flight: acknowledged {acked}, found {state}"
        if meta is None or meta.pending is None:
            assert t.pending is None, "an update that returned must have left its pending version"
            continue
        expected_version = (acked.version if acked else 0) + 1
        assert meta.pending_ver == expected_version
        if t.pending is not None:
            assert (meta.pending_ver, None if meta.pending.removal else meta.pending.crc) == t.pending
        if rng.random() < 0.5:
            after = engine.commit(chunk, meta.pending_ver)
            t.acked[chunk] = None if after is None else Acked(after.committed_ver, after.crc, after.length)
            outcome = "pending committed"
        else:
            engine.abort(chunk, meta.pending_ver)
            outcome = "pending aborted"
    assert engine.pending_chunks() == []
    if engine.recovery.layered:
        outcome += f" (folded at open {len(engine.recovery.layered)})"
    if engine.recovery.orphans_removed or engine.recovery.files_trimmed:
        outcome += f" (orphans {engine.recovery.orphans_removed}, trimmed {engine.recovery.files_trimmed})"
    # every acknowledged chunk reads back whole with the CRC the writer printed, and nothing else exists
    live = {c: a for c, a in t.acked.items() if a is not None}
    assert {m.chunk_id for m in engine.dump_metadata()} == set(live)
    for chunk, acked in live.items():
        got = engine.read(chunk)
        assert (got.version, crc32c(got.data), len(got.data)) == (acked.version, acked.crc, acked.length)
    # the data files are exactly those the metadata names: one per chunk, plus the overlay of a
    # committed layered version only if settling the pending version just committed one
    metas = engine.dump_metadata()
    named = {engine._files.path(m.chunk_id, fid): n for m in metas for fid, n in m.file_lengths().items()}  # noqa: SLF001
    assert not [m for m in metas if m.committed.layered and m.chunk_id != t.in_flight], "folded at open"
    files = {p: p.stat().st_size for p in (engine.path / "chunks").rglob("*") if p.is_file()}
    assert files == named, "no orphans, nothing missing, no bytes past what a version needs"
    space = engine.space_info()
    assert (space.chunk_count, space.used) == (len(live), sum(named.values()))
    return outcome


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["mixed", "small-overwrites"])
def test_sigkill_during_chunk_writes(tmp_path: Path, mode: str) -> None:
    """``small-overwrites`` aims the kills at layered versions: killed while the overlay is written,
    between the commit and the fold, while the fold rewrites the data file, before the overlay is
    deleted."""
    seed = int(os.environ.get("FS3_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    target = tmp_path / "target"
    acked: dict[bytes, Acked | None] = {}
    outcomes: list[str] = []
    for run in range(KILLS):
        transcript = Transcript(acked)
        # 0 kills the child while it starts (possibly mid-recovery); otherwise somewhere after
        # the n-th acknowledged commit, while it is already busy with the next operations
        kill_after = 0 if run % 7 == 3 else rng.randrange(1, 30)
        trigger, delay = rng.choice("BPC"), rng.uniform(0, 0.003)
        try:
            log = tmp_path / f"child-{run}.log"
            run_and_kill(target, seed + run, mode, kill_after, trigger, delay, transcript, log)
            with ChunkEngine(target) as engine:
                outcomes.append(verify_and_settle(engine, transcript, rng))
        except BaseException as exc:
            exc.add_note(f"crash test mode={mode} seed={seed} run={run} (replay with FS3_CRASH_SEED={seed})")
            raise
    print(f"crash test mode={mode} seed={seed}: {len(acked)} chunks; after each kill: {outcomes}")
