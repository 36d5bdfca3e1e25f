"""Bad input to the storage service gets clear errors; a daemon that cannot start says why in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cluster import REPO, Cluster, write_config

from fs3.client.storage_client import MAX_BATCH_READS, STORAGE_SERVICE, crc32c, node_address
from fs3.errors import FS3Error, StatusCode
from fs3.net.service import Method
from fs3.proto import rpc_pb2, storage_pb2

pytestmark = pytest.mark.timeout(120)

CHUNK = 64 * 1024


def write_req(chain_id: int, version: int, data: bytes, **io) -> storage_pb2.WriteReq:
    req = storage_pb2.WriteReq()
    req.tag.client_id, req.tag.request_id, req.tag.channel, req.tag.seqnum = 77, 1, 1, 1
    req.io.key.chain_id = chain_id
    req.io.key.chain_version = version
    req.io.key.inode_id = 3
    req.io.type = storage_pb2.UPDATE_WRITE
    req.io.length = len(data)
    req.io.chunk_size = CHUNK
    req.io.crc32c = crc32c(data)
    for k, v in io.items():
        setattr(req.io, k, v)
    return req


async def test_malformed_and_refused_requests(tmp_path):
    async with Cluster(tmp_path / "c", metrics=True) as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        routing = await c.routing()
        chain = routing.chain(chain_id)
        head = node_address(routing, chain.targets[0].target_id)
        middle = node_address(routing, chain.targets[1].target_id)
        write = STORAGE_SERVICE["Write"]

        async def call(address, method, req, payload=None) -> FS3Error:
            with pytest.raises(FS3Error) as e:
                await client.rpc.call(address, method, req, payload=payload, timeout=10)
            return e.value

        data = b"abcd" * 100
        e = await call(head, write, write_req(chain_id, chain.version + 1000, data), data)
        assert e.code == StatusCode.STORAGE_CHAIN_VERSION_MISMATCH and "version" in e.message
        e = await call(head, write, write_req(chain_id, chain.version - 1, data), data)
        assert e.code == StatusCode.STORAGE_CHAIN_VERSION_MISMATCH
        e = await call(middle, write, write_req(chain_id, chain.version, data), data)
        assert e.code == StatusCode.STORAGE_NOT_HEAD
        e = await call(head, write, write_req(chain_id, chain.version, data), data[:10])  # payload too short
        assert e.code == StatusCode.INVALID_ARGUMENT and "payload" in e.message
        e = await call(head, write, write_req(chain_id, chain.version, data, crc32c=12345), data)
        assert e.code == StatusCode.STORAGE_CHECKSUM_MISMATCH
        e = await call(head, write, write_req(chain_id, chain.version, data, update_version=3), data)
        assert e.code == StatusCode.INVALID_ARGUMENT
        e = await call(
            head, write, write_req(chain_id, chain.version, data, type=storage_pb2.UPDATE_REPLACE), data
        )
        assert e.code == StatusCode.INVALID_ARGUMENT
        e = await call(head, write, write_req(chain_id, chain.version, data, chunk_size=CHUNK + 1), data)
        assert e.code == StatusCode.INVALID_ARGUMENT and "power of two" in e.message
        e = await call(head, write, write_req(chain_id, chain.version, data, offset=CHUNK - 1), data)
        assert e.code == StatusCode.STORAGE_CHUNK_TOO_LARGE
        for extents in ([(0, 200), (100, 200)], [(0, 200), (300, 100)], [(0, 300), (CHUNK - 50, 100)]):
            req = write_req(chain_id, chain.version, data)
            for off, n in extents:
                req.io.extents.add(offset=off, length=n)
            e = await call(head, write, req, data)
            assert e.code in (StatusCode.INVALID_ARGUMENT, StatusCode.STORAGE_CHUNK_TOO_LARGE), e
            assert "range" in e.message or "exceeds" in e.message
        e = await call(head, write, write_req(999, 1, data), data)
        assert e.code == StatusCode.MGMTD_UNKNOWN_CHAIN
        big = storage_pb2.BatchReadReq()
        for _ in range(3):
            io = big.ios.add(offset=0, length=32 << 20)
            io.key.chain_id = chain_id
        e = await call(head, STORAGE_SERVICE["BatchRead"], big)
        assert e.code == StatusCode.INVALID_ARGUMENT
        many = storage_pb2.BatchReadReq()
        for _ in range(MAX_BATCH_READS + 1):
            many.ios.add(offset=0, length=1).key.chain_id = chain_id
        e = await call(head, STORAGE_SERVICE["BatchRead"], many)
        assert e.code == StatusCode.INVALID_ARGUMENT and "reads in one batch" in e.message
        # refused batches are counted among the requests, as other refusals are
        text = await c.scrape(c.node_of_target(chain.targets[0].target_id).index)
        assert 'fs3_storage_requests_total{code="INVALID_ARGUMENT",method="BatchRead"} 2.0' in text
        assert 'fs3_storage_request_seconds_count{method="BatchRead"} 2.0' in text
        e = await call(head, STORAGE_SERVICE["DumpChunkMeta"], storage_pb2.DumpChunkMetaReq(target_id=424242))
        assert e.code == StatusCode.MGMTD_UNKNOWN_TARGET
        # an update from something that is not the predecessor, with nonsense versions
        upd = storage_pb2.UpdateReq(target_id=chain.targets[1].target_id)
        upd.io.CopyFrom(write_req(chain_id, chain.version, data).io)
        e = await call(middle, STORAGE_SERVICE["Update"], upd, data)
        assert e.code == StatusCode.INVALID_ARGUMENT
        # bytes that do not parse as the method's message
        garbage = Method(write.service_id, write.id, "Write", rpc_pb2.EchoRequest, storage_pb2.IOResult)
        e = await call(head, garbage, rpc_pb2.EchoRequest(data=b"\xff" * 64))
        assert e.code == StatusCode.RPC_BAD_MESSAGE
        # an older chain version is refused on every path, not only by a client's write at the head:
        # a forwarded update at the middle, a truncate and a removal at the head
        await client.write(chain_id, 5, 0, 0, data, CHUNK)
        stale = chain.version - 1
        assert stale >= 1
        upd = storage_pb2.UpdateReq(target_id=chain.targets[1].target_id)
        upd.io.CopyFrom(write_req(chain_id, stale, data[::-1], update_version=2).io)
        upd.io.key.inode_id = 5
        e = await call(middle, STORAGE_SERVICE["Update"], upd, data[::-1])
        assert e.code == StatusCode.STORAGE_CHAIN_VERSION_MISMATCH, e
        trunc = storage_pb2.TruncateChunksReq(
            chain_id=chain_id, chain_version=stale, inode_id=5, chunk_size=CHUNK, length=0
        )
        e = await call(head, STORAGE_SERVICE["TruncateChunks"], trunc)
        assert e.code == StatusCode.STORAGE_CHAIN_VERSION_MISMATCH, e
        remove = storage_pb2.RemoveChunksReq(chain_id=chain_id, chain_version=stale, inode_id=5)
        e = await call(head, STORAGE_SERVICE["RemoveChunks"], remove)
        assert e.code == StatusCode.STORAGE_CHAIN_VERSION_MISMATCH, e
        assert await client.read(chain_id, 5, 0, 0, CHUNK) == data
        for target in chain.targets:
            (meta,) = await client.dump_chunk_meta(target.target_id, 5)
            assert (meta.committed_version, meta.pending_version, meta.length) == (1, 0, len(data))
        # nothing of all that reached the chunks; the chain still works
        await client.write(chain_id, 3, 0, 0, data, CHUNK)
        assert await client.read(chain_id, 3, 0, 0, CHUNK) == data


def _run_storage(tmp: Path, **cfg) -> subprocess.CompletedProcess:
    conf = write_config(
        tmp / "storage.toml",
        {"node_id": 10001, "listen_host": "127.0.0.1", "mgmtd_addresses": ["127.0.0.1:1"], **cfg},
        {"log": {"file": str(tmp / "storage.log")}},
    )
    return subprocess.run(
        [sys.executable, "-m", "fs3.storage", "--config", str(conf)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_daemon_that_cannot_bind_exits_with_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run_storage(tmp_path, listen_port=port, target_paths=[str(tmp_path / "t")], target_ids=[1])
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], r.stderr


def test_daemon_with_unusable_target_dir_exits_with_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = _run_storage(tmp_path, listen_port=0, target_paths=[str(blocker / "t")], target_ids=[1])
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(blocker / "t") in lines[0], r.stderr


def test_a_target_whose_disk_is_not_mounted_is_not_made_on_the_root_disk(tmp_path):
    """The parent of a target directory is on the target's disk; if it is missing (a disk that did
    not mount at boot leaves a bare mount point) the daemon refuses to start instead of starting an
    empty target on whatever file system the mount point is on."""
    mount_point = tmp_path / "data1"
    mount_point.mkdir()
    target = mount_point / "fs3" / "target-1"
    r = _run_storage(tmp_path, listen_port=0, target_paths=[str(target)], target_ids=[1])
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0] and "mounted" in lines[0], r.stderr
    assert not (mount_point / "fs3").exists()


def test_daemon_with_mismatched_target_ids_exits_with_one_line(tmp_path):
    r = _run_storage(tmp_path, target_paths=[str(tmp_path / "a"), str(tmp_path / "b")], target_ids=[1])
    assert r.returncode != 0
    assert len(r.stderr.strip().splitlines()) == 1 and "target_ids" in r.stderr, r.stderr


async def test_bytes_damaged_on_the_way_fail_the_clients_read(tmp_path):
    """The client checks each read against the CRC32C the replica sent with it: bytes changed
    between the replica and the client are an error, never data (no test damaged them)."""
    import os

    from fs3.client.storage_client import RetryPolicy

    async with Cluster(tmp_path / "c", storage_nodes=1, replication=1) as c:
        client = await c.storage_client(retry=RetryPolicy(total_s=2.0, rpc_timeout_s=1.0))
        chain_id = c.chain_ids[0]
        data = os.urandom(CHUNK)
        await client.write(chain_id, 7, 0, 0, data, CHUNK)
        assert await client.read(chain_id, 7, 0, 0, CHUNK) == data
        real = client.rpc.call

        async def damaging(address, method, req, **kw):  # type: ignore[no-untyped-def]
            rsp, body = await real(address, method, req, **kw)
            if method.name == "BatchRead" and body is not None and len(body):
                view = memoryview(body)
                if view.readonly:
                    body = bytearray(body)
                    view = memoryview(body)
                view[len(view) // 2] ^= 0x01
            return rsp, body

        client.rpc.call = damaging
        with pytest.raises(FS3Error) as e:
            await client.read(chain_id, 7, 0, 0, CHUNK)
        assert e.value.code == StatusCode.STORAGE_CHECKSUM_MISMATCH


async def test_reads_are_spread_over_the_serving_replicas(tmp_path):
    """Reads go to the SERVING replica with the fewest reads in flight, then the fewest served:
    one after another they take turns; at once, they spread (no test looked at where reads went)."""
    import asyncio
    import os

    async with Cluster(tmp_path / "c") as c:
        client = await c.storage_client()
        chain_id = c.chain_ids[0]
        data = os.urandom(CHUNK)
        await client.write(chain_id, 8, 0, 0, data, CHUNK)
        routing = await c.routing()
        replicas = {node_address(routing, t.target_id) for t in routing.chain(chain_id).targets}
        assert len(replicas) == 3
        before = {a: client._served.get(a, 0) for a in replicas}  # noqa: SLF001
        for _ in range(9):
            assert await client.read(chain_id, 8, 0, 0, CHUNK) == data
        after = {a: client._served.get(a, 0) for a in replicas}  # noqa: SLF001
        assert {a: after[a] - before[a] for a in replicas} == dict.fromkeys(replicas, 3)
        reads = await asyncio.gather(*(client.read(chain_id, 8, 0, 0, CHUNK) for _ in range(30)))
        assert all(r == data for r in reads)
        spread = {a: client._served.get(a, 0) - after[a] for a in replicas}  # noqa: SLF001
        # (not 10 each: on a loaded machine a replica may answer while the others are still being
        # sent to, and it then has the fewest in flight; seen: 4, 11, 15)
        assert sum(spread.values()) == 30 and min(spread.values()) >= 3, spread
