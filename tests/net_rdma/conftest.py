"""Fixtures for the RDMA transport tests: a fake verbs fabric (no device needed) and, where a device
exists, the real one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvloop


def pytest_asyncio_loop_factories(
    config: Any, item: Any
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    # daemons run on uvloop; the socket hand-over to TCP framing must work on both loops
    return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
