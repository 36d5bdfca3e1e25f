"""Real fs3-mgmtd processes over one lmdb store: election, SIGKILL failover, clean shutdown, and
startup failures that exit non-zero with one clear line."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mgmtd_harness import REPO, ProcessCluster, StorageNode, free_port, wait_until

from fs3.client.mgmtd_client import MgmtdClient
from fs3.client.routing import RoutingCache
from fs3.errors import FS3Error
from fs3.proto import common_pb2, mgmtd_pb2

pytest.importorskip("fs3.kv.lmdb_engine", reason="the lmdb engine of fs3.kv is not in this build yet")

pytestmark = pytest.mark.timeout(90)

LEASE_S = 1.5


async def who_is_primary(procs, client_timeout_s: float = 1.0) -> list[str]:
    """Addresses of the processes that say they are primary."""
    out = []
    for p in procs:
        if not p.alive():
            continue
        c = MgmtdClient([p.address], rpc_timeout_s=client_timeout_s)
        try:
            if (await c.get_primary()).is_self:
                out.append(p.address)
        except FS3Error:
            pass
        finally:
            await c.close()
    return out


async def test_three_mgmtds_elect_one_primary_and_fail_over_on_sigkill(processes: ProcessCluster) -> None:
    procs = [processes.start(i, lease_interval_s=LEASE_S, heartbeat_timeout_s=2.0) for i in (1, 2, 3)]
    primaries: list[str] = []

    async def one_primary() -> bool:
        nonlocal primaries
        assert all(p.alive() for p in procs), [p.log() for p in procs]
        if not all([await _answers(p) for p in procs]):
            return False
        primaries = await who_is_primary(procs)
        return len(primaries) == 1

    await wait_until(one_primary, 30, "all three serving, one of them primary")
    first = next(p for p in procs if p.address == primaries[0])
    # every standby names the same primary
    for p in procs:
        c = MgmtdClient([p.address])
        assert (await c.get_primary()).address == first.address
        await c.close()

    client = MgmtdClient([p.address for p in procs], timeout_s=20.0)
    try:
        token = await client.init_cluster("proc")
        admin = MgmtdClient([p.address for p in procs], token=token, timeout_s=20.0)
        await admin.register_node(10, common_pb2.NODE_STORAGE)
        await admin.create_targets([mgmtd_pb2.TargetSpec(target_id=100, node_id=10)])
        await admin.upload_chains({1: [100]})
        cache = RoutingCache(admin, refresh_interval_s=0.1)
        await cache.start()
        v_before = cache.version

        processes.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        first.popen.wait(timeout=10)
        survivors = [p for p in procs if p is not first]

        async def new_primary() -> bool:
            nonlocal primaries
            primaries = await who_is_primary(survivors, 0.5)
            return len(primaries) == 1

        await wait_until(new_primary, 20, "a standby to take over")
        took = time.monotonic() - killed_at
        # the lease has at most LEASE_S left when the primary dies, and a standby looks right when
        # it runs out; the slack covers this test's own polling on a busy machine
        assert took < LEASE_S + 1.0, f"takeover took {took:.2f}s"
        assert primaries[0] != first.address
        # clients follow: the same admin client keeps working, and the state survived
        nodes = await admin.list_nodes()
        assert [n.node_id for n in nodes] == [10]
        assert [c.chain_id for c in await admin.list_chains()] == [1]
        await cache.wait_for(lambda r: r.version > v_before, 10)
        assert cache.routing.chain(1).targets[0].target_id == 100
        # nodes follow too: a heartbeat through the same failover client reaches the new primary
        node = StorageNode(admin, 10, [100])
        await node.heartbeat()
        await cache.wait_for(lambda r: r.node(10).status == mgmtd_pb2.NODE_STATUS_ACTIVE, 10)
        assert cache.routing.target(100).local_state == common_pb2.UPTODATE
        await cache.stop()
        await admin.close()
        # the killed one comes back as a standby
        back = processes.start(first.node_id, lease_interval_s=LEASE_S, heartbeat_timeout_s=2.0)
        await wait_until(lambda: _answers(back), 30, "restarted mgmtd to serve")
        assert await who_is_primary([back]) == []
    finally:
        await client.close()


async def _answers(p) -> bool:
    c = MgmtdClient([p.address], rpc_timeout_s=0.5)
    try:
        await c.get_primary()
        return True
    except FS3Error:
        return False
    finally:
        await c.close()


async def test_sigterm_shuts_down_cleanly_and_hands_over(processes: ProcessCluster) -> None:
    a = processes.start(1, lease_interval_s=30.0)
    await wait_until(lambda: _is_primary(a), 30, "first mgmtd to be primary")
    b = processes.start(2, lease_interval_s=30.0)
    await wait_until(lambda: _answers(b), 30, "second mgmtd to serve")
    processes.kill(a, signal.SIGTERM)
    assert a.popen.wait(timeout=20) == 0, a.log()
    assert "mgmtd stopped" in a.log()
    # it released its 30 s lease, so the standby takes over long before it would have expired
    await wait_until(lambda: _is_primary(b), 10, "standby to take over a released lease")


async def test_sigusr1_logs_where_every_task_and_thread_is_and_the_daemon_serves_on(
    processes: ProcessCluster,
) -> None:
    """``kill -USR1`` on a daemon that seems stuck: its log says what each task awaits and where each
    thread is, and the daemon goes on (SIGUSR1's default would have ended it); ``kill -USR2`` writes
    every thread's stack even while the event loop is blocked."""
    a = processes.start(1, lease_interval_s=30.0)
    await wait_until(lambda: _is_primary(a), 30, "mgmtd to be primary")
    processes.kill(a, signal.SIGUSR1)
    await wait_until(lambda: "stack dump (SIGUSR1)" in a.log(), 10, "the stack dump")
    await wait_until(lambda: "thread MainThread:" in a.log(), 10, "the whole dump")
    dump = a.log()[a.log().index("stack dump (SIGUSR1)") :]
    tasks = [line for line in dump.splitlines() if " task " in line]
    assert tasks, dump
    # the daemon's main task, down its chain of awaits to where it waits for a signal to stop
    assert any("in serving -> " in t and "in wait_for_shutdown" in t for t in tasks), dump
    # SIGUSR2: every thread's Python stack on standard error, from the signal itself
    processes.kill(a, signal.SIGUSR2)
    await wait_until(lambda: "most recent call first" in a.log(), 10, "the threads' stacks")
    assert a.alive() and await _is_primary(a)
    processes.kill(a, signal.SIGTERM)
    assert a.popen.wait(timeout=20) == 0, a.log()


async def _is_primary(p) -> bool:
    c = MgmtdClient([p.address], rpc_timeout_s=0.5)
    try:
        return (await c.get_primary()).is_self
    except FS3Error:
        return False
    finally:
        await c.close()


def _run_mgmtd(args: list[str], timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fs3.mgmtd", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(60)
def test_startup_failures_exit_nonzero_with_one_line(tmp_path: Path) -> None:
    missing = _run_mgmtd(["--config", str(tmp_path / "nope.toml")])
    assert missing.returncode != 0
    assert missing.stderr.strip().count("\n") == 0 and "does not exist" in missing.stderr

    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = 1\nno_such_option = 3\n")
    r = _run_mgmtd(["--config", str(bad)])
    assert r.returncode != 0 and "no_such_option" in r.stderr and r.stderr.strip().count("\n") == 0

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = _run_mgmtd(["--kv-engine", "mem", "--port", str(port), "--log-level", "CRITICAL"])
    assert r.returncode != 0
    assert f"127.0.0.1:{port}" in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr

    r = _run_mgmtd(["--kv-engine", "lmdb", "--port", str(free_port()), "--log-level", "CRITICAL"])
    assert r.returncode != 0 and "kv.path" in r.stderr

    no_secret = tmp_path / "secret.toml"
    no_secret.write_text(f'cluster_secret_file = "{tmp_path / "missing-secret"}"\n')
    r = _run_mgmtd(
        ["--config", str(no_secret), "--kv-engine", "mem", "--port", "0", "--log-level", "CRITICAL"]
    )
    assert r.returncode != 0 and "missing-secret" in r.stderr and r.stderr.strip().count("\n") == 0
