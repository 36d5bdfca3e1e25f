"""The lmdb engine shared by real processes: conflicts across processes, no lost updates, and every
acknowledged commit surviving SIGKILL."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kv_worker import COUNTER, crash_value

from fs3.kv import open_database_sync

WORKER = str(Path(__file__).with_name("kv_worker.py"))

Spawn = Callable[..., subprocess.Popen]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start kv_worker.py children; any still running at teardown are killed by PID."""
    children: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        child = subprocess.Popen(
            [sys.executable, WORKER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        for stream in (child.stdin, child.stdout, child.stderr):
            if stream:
                stream.close()


def read_all(db_path: Path) -> dict[bytes, bytes]:
    async def scan() -> dict[bytes, bytes]:
        db = open_database_sync("lmdb", path=str(db_path))
        try:
            pairs = await db.run(lambda tr: tr.get_range(b"", b"\xff"), read_only=True)
            return dict(pairs)
        finally:
            await db.close()

    return asyncio.run(scan())


@pytest.mark.timeout(120)
def test_two_processes_increment_without_lost_update(spawn: Spawn, tmp_path: Path) -> None:
    tasks, count = 4, 150
    children = [spawn("incr", str(tmp_path), str(tasks), str(count)) for _ in range(2)]
    retries = 0
    for child in children:
        out, err = child.communicate(timeout=100)
        assert child.returncode == 0, err.decode()
        lines = out.decode().split()
        assert lines[-1] == "done"
        retries += int(lines[0])
    assert read_all(tmp_path)[COUNTER] == b"%d" % (2 * tasks * count)
    assert retries > 0  # the increments really did collide


@pytest.mark.timeout(60)
def test_conflict_detected_across_processes(spawn: Spawn, tmp_path: Path) -> None:
    holder = spawn("hold", str(tmp_path))
    assert holder.stdout.readline() == b"read\n"  # its snapshot is taken

    async def rival(tr) -> None:
        tr.set(b"held", b"rival")

    async def commit_rival() -> None:
        db = open_database_sync("lmdb", path=str(tmp_path))
        try:
            await db.run(rival)
        finally:
            await db.close()

    asyncio.run(commit_rival())
    out, err = holder.communicate(b"go\n", timeout=30)
    assert out == b"KV_CONFLICT\n", err.decode()
    assert read_all(tmp_path)[b"held"] == b"rival"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_acknowledged_commits_survive_sigkill(spawn: Spawn, tmp_path: Path) -> None:
    rng = random.Random()
    acknowledged: list[bytes] = []
    for _ in range(10):
        child = spawn("crash", str(tmp_path), "8")
        # Kill after a random number of acknowledgements, while commits are in flight.
        for _ in range(rng.randint(1, 3000)):
            line = child.stdout.readline()
            assert line, child.stderr.read().decode()
            acknowledged.append(line.rstrip(b"\n"))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        acknowledged += child.stdout.read().split()  # printed before the kill: acknowledged too
        stored = read_all(tmp_path)
        missing = [k for k in acknowledged if stored.get(k) != crash_value(k)]
        assert not missing, f"{len(missing)} acknowledged keys lost, e.g. {missing[:3]}"
