"""Fixtures for mgmtd tests (the helpers they use live in mgmtd_harness)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mgmtd_harness import Admin, InProcess, ProcessCluster

from fs3.kv import open_database


@pytest.fixture
async def inproc() -> AsyncIterator[InProcess]:
    db = await open_database("mem")
    env = InProcess(db)
    try:
        yield env
    finally:
        for c in env.clients:
            await c.close()
        for s in env.servers:
            with contextlib.suppress(Exception):
                await s.stop(grace_s=0)
        await db.close()


@pytest.fixture
async def admin(inproc: InProcess) -> Admin:
    server = await inproc.start(1)
    await inproc.primary()
    bootstrap = inproc.client()
    token = await bootstrap.init_cluster("test")
    return Admin(inproc, server, inproc.client(token=token), token)


@pytest.fixture
def processes(tmp_path: Path):
    pc = ProcessCluster(tmp_path)
    try:
        yield pc
    finally:
        pc.cleanup()
