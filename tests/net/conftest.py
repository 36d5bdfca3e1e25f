"""Fixtures for fs3 RPC tests: servers on 127.0.0.1 ephemeral ports, in-process or in a thread."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import uvloop
from rpc_fixtures import (
    TEST_LIMITS,
    TRANSPORTS,
    ThreadedServer,
    make_transports,
    serve_test_service,
)
from rpcwire import SECRET

from fs3.net import RpcClient, RpcServer
from fs3.net.transport import Transport


def pytest_asyncio_loop_factories(
    config: Any, item: Any
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    # fs3 daemons run on uvloop; code that embeds fs3 RPC (tests of other packages included) may
    # use the standard loop. Every async test runs on both.
    return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


@pytest.fixture(params=TRANSPORTS)
def transports(request: pytest.FixtureRequest) -> Iterator[tuple[Transport, Transport]]:
    pair = make_transports(request.param)
    yield pair
    for t in pair:
        close = getattr(t, "close", None)
        if close is not None:
            close()


@pytest.fixture
async def rpc_server(transports: tuple[Transport, Transport]) -> AsyncIterator[RpcServer]:
    async with serve_test_service(identity="test-server", transport=transports[0]) as server:
        yield server


@pytest.fixture
async def rpc_client(transports: tuple[Transport, Transport]) -> AsyncIterator[RpcClient]:
    client = RpcClient(
        SECRET, identity="test-client", limits=TEST_LIMITS, default_timeout=10.0, transport=transports[1]
    )
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="module")
def threaded_server() -> Iterator[ThreadedServer]:
    ts = ThreadedServer()
    ts.start()
    try:
        yield ts
    finally:
        ts.stop()
