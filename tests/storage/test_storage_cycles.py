"""A storage daemon's error paths leave no bytes in reference cycles. Daemons run the cyclic
collector seldom (``fs3.daemon.settle_gc``), so what a cycle holds stays until a full collection:
an error kept in a list its catching frame holds, or raised through a frame that holds the future
holding it, takes that frame (and the payload or the reads it refers to) into the cycle.

One daemon in-process (replica_harness), served over a real RPC server and client on 127.0.0.1
where the path goes through them; the collector is off while it works, then asked what it found.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from pathlib import Path

import pytest
from cycles import buffers, cycles_kept, frames, released
from replica_harness import ALL_SERVING, INODE, SERVING, client_write, replica_daemons

from fs3.client.storage_client import STORAGE_SERVICE
from fs3.errors import FS3Error, StatusCode
from fs3.net import RpcClient, RpcServer
from fs3.proto import storage_pb2

pytestmark = pytest.mark.timeout(60)

SECRET = b"storage-cycles-test-secret-0123"


def batch(*reads: tuple[int, int]) -> storage_pb2.BatchReadReq:
    """A BatchRead of ``(chunk index, length)`` reads from offset 0 of INODE's chunks on chain 1."""
    req = storage_pb2.BatchReadReq()
    for index, length in reads:
        io = req.ios.add(offset=0, length=length)
        io.key.chain_id, io.key.chain_version, io.key.inode_id, io.key.chunk_index = 1, 1, INODE, index
    return req


async def settle() -> None:
    """Let the loop run what the calls left queued (their futures' callbacks)."""
    for _ in range(5):
        await asyncio.sleep(0.005)


async def test_batch_reads_of_missing_chunks_keep_no_bytes_in_cycles(tmp_path: Path) -> None:
    """A read of a chunk the target does not hold (a hole of a sparse file) fails on its own in its
    batch; its error, kept beside the other reads' bytes, once held the batch handler's frame, and
    with it every read's bytes and the joined reply. Small reads (served on the loop), a lone large
    one (its handler resumed in a task of the RPC server), and large ones together."""
    async with replica_daemons(tmp_path) as make:
        d = await make(1, [(1, SERVING)])  # a chain of one: the tail
        small, large = 60 << 10, 1 << 20
        for index in range(3):
            data = bytes([65 + index]) * large
            await d.rep.client_update(client_write(data, index=index), memoryview(data))
        server = RpcServer(SECRET, identity="storage-1")
        server.add_service(STORAGE_SERVICE, d.service)
        address = await server.start(("127.0.0.1", 0))
        rpc = RpcClient(SECRET, identity="reader")
        try:

            async def read(*reads: tuple[int, int]) -> list[int]:
                rsp, payload = await rpc.call(address, STORAGE_SERVICE["BatchRead"], batch(*reads))
                got = [r.status.code for r in rsp.results]
                assert payload is None or payload.nbytes == sum(r.length for r in rsp.results)
                return got

            missing = int(StatusCode.STORAGE_CHUNK_NOT_FOUND)
            assert await read((0, small), (9, small)) == [0, missing]  # every path warm
            for reads, codes in [
                ([(0, small), (1, small), (2, small), (9, small)], [0, 0, 0, missing]),
                ([(9, large)], [missing]),
                ([(0, large), (1, large), (9, large)], [0, 0, missing]),
                ([(0, small), (9, large)], [0, missing]),
            ]:
                with cycles_kept() as found:
                    assert await read(*reads) == codes
                    await settle()
                assert buffers(found) == [], (reads, frames(found))
                assert frames(found) == [], reads
        finally:
            await rpc.close()
            await server.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Payload(bytearray):
    """Bytes a weak reference can watch (see test_craq_chain_changes)."""


async def test_a_forward_to_a_successor_that_is_down_keeps_no_bytes_in_cycles(tmp_path: Path) -> None:
    """Each failed connect to a successor that is down (retried until the forward gives up) made a
    cycle through the connecting future, holding the forward's frames and the write's bytes."""
    rpc = RpcClient(SECRET, identity="storage-1", connect_timeout=0.2)
    try:
        async with replica_daemons(tmp_path) as make:
            # target 2 listens on a port nothing listens on
            d = await make(1, ALL_SERVING, chain=rpc, port_base=closed_port() - 2, forward_timeout_s=0.6)
            for index, size in [(1, 4096), (2, 512 << 10), (3, 1 << 20)]:  # the last: parallel, whole chunk
                data = Payload(b"d" * size)
                with cycles_kept() as found:
                    with pytest.raises(FS3Error):
                        await d.rep.client_update(client_write(bytes(data), index=index), memoryview(data))
                    await settle()
                assert buffers(found) == [], (size, frames(found))
                assert "RpcClient._connect" not in frames(found), size
    finally:
        await rpc.close()


async def test_a_parallel_update_whose_local_write_fails_keeps_no_bytes_in_cycles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A whole-chunk write is stored here and forwarded at once; when its successor refuses the
    write as sent, the forward sends the whole chunk as stored here, so it waits for the local
    write. That one failed (a wrong checksum, refused by every replica alike): raised through the
    forward's frames, which hold it, its error was a cycle holding the update's bytes."""
    # no warning records: the captured one would keep the successor's error (its traceback holds
    # the bytes), and the cycle with it, alive
    caplog.set_level(logging.ERROR, logger="fs3.storage")
    async with replica_daemons(tmp_path) as make:
        d = await make(1, ALL_SERVING)

        async def refuse(req: storage_pb2.UpdateReq) -> None:
            if req.io.type == storage_pb2.UPDATE_WRITE:
                raise FS3Error(StatusCode.STORAGE_CHECKSUM_MISMATCH, "the successor refuses it too")

        d.chain.on_update = refuse
        data = Payload(b"p" * (1 << 20))
        watch = weakref.ref(data)
        req = client_write(bytes(data))
        req.io.crc32c ^= 1
        with cycles_kept() as found:
            with pytest.raises(FS3Error) as refused:
                await d.rep.client_update(req, memoryview(data))
            assert refused.value.code == StatusCode.STORAGE_CHECKSUM_MISMATCH
            del refused, data
            await settle()
            assert await released(watch), "the update's bytes are still referenced"
        assert buffers(found) == [], frames(found)
        assert frames(found) == []
