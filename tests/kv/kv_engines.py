"""Engines for the fs3.kv tests: one ``db`` per engine present on this machine.

(A module of its own rather than conftest.py so tests can import its helpers without clashing with
other directories' conftest modules; tests/kv/conftest.py re-exports the fixtures.)

The ``fdb`` engine runs where ``libfdb_c``, ``fdbserver`` and ``fdbcli`` are installed (a throwaway
single-process server is started for the session), or against the cluster named by
``FS3_TEST_FDB_CLUSTER_FILE``, which the suite will wipe: point it only at a scratch cluster.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fs3.kv import Database, open_database

# The fdb runs carry the "fdb" marker, so `-m "not fdb"` leaves them out.
ENGINES = ["mem", "lmdb", pytest.param("fdb", marks=pytest.mark.fdb)]


def fdb_missing() -> str | None:
    """Why the fdb engine cannot be tested here, or None when it can."""
    if os.environ.get("FS3_TEST_FDB_CLUSTER_FILE"):
        return None
    missing = [
        name
        for name, found in (
            ("libfdb_c", ctypes.util.find_library("fdb_c")),
            ("fdbserver", shutil.which("fdbserver")),
            ("fdbcli", shutil.which("fdbcli")),
        )
        if not found
    ]
    if missing:
        return f"fdb engine not tested: {', '.join(missing)} not installed (or set FS3_TEST_FDB_CLUSTER_FILE)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def fdb_cluster_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = fdb_missing()
    if reason:
        pytest.skip(reason)
    given = os.environ.get("FS3_TEST_FDB_CLUSTER_FILE")
    if given:
        yield given
        return
    root = tmp_path_factory.mktemp("fdb")
    cluster = root / "fdb.cluster"
    port = _free_port()
    cluster.write_text(f"fs3test:fs3test@127.0.0.1:{port}\n")
    (root / "data").mkdir()
    (root / "logs").mkdir()
    server = subprocess.Popen(
        [
            "fdbserver",
            "-p",
            f"127.0.0.1:{port}",
            "-C",
            str(cluster),
            "-d",
            str(root / "data"),
            "-L",
            str(root / "logs"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        subprocess.run(
            ["fdbcli", "-C", str(cluster), "--timeout", "30", "--exec", "configure new single memory"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 60
        while True:
            out = subprocess.run(
                ["fdbcli", "-C", str(cluster), "--timeout", "5", "--exec", "status minimal"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            if "available" in out and "unavailable" not in out:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"fdbserver did not become available: {out}")
            time.sleep(0.2)  # polling a condition with a deadline
        yield str(cluster)
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)


async def open_engine(engine: str, request: pytest.FixtureRequest, path: Path) -> Database:
    if engine == "mem":
        return await open_database("mem")
    if engine == "lmdb":
        return await open_database("lmdb", path=str(path / "kv"))
    cluster_file = request.getfixturevalue("fdb_cluster_file")
    db = await open_database("fdb", cluster_file=cluster_file)

    async def wipe(tr):  # a clean keyspace per test
        tr.clear_range(b"", b"\xff")

    await db.run(wipe)
    return db


@pytest.fixture(params=ENGINES)
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    database = await open_engine(request.param, request, tmp_path)
    try:
        yield database
    finally:
        await database.close()
