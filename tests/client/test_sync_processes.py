"""The synchronous client as training scripts use it: with worker processes made by fork() (a
DataLoader's workers), pickled for 'spawn' workers, and closed while other threads have calls under
way. Each case runs in a Python process of its own (a hang or a crash there is reported, not
inherited by the test run)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from fs_cluster import FsCluster

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

_PRELUDE = r"""
import json, os, select, sys, threading, time
from fs3.client import SyncFileSystem
from fs3.errors import FS3Error

CFG = sys.argv[1]


def outcome(fn):
    t0 = time.monotonic()
    try:
        got = fn()
        what = repr(got)
    except BaseException as e:
        what = f"{type(e).__name__}: {e}"
    return {"what": what, "s": round(time.monotonic() - t0, 2)}


def in_child(fn, wait_s=20.0):
    # fn's outcome in a child made by fork(), or "hung" when it gives none within wait_s
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, json.dumps(outcome(fn)).encode())
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], wait_s)
    raw = os.read(r, 1 << 16) if ready else b""
    if not raw:
        os.kill(pid, 9)
    status = os.waitpid(pid, 0)[1]
    os.close(r)
    return json.loads(raw) if raw else {"what": f"hung or crashed (status {status})", "s": wait_s}
"""

_FORK = r"""
out = {}
fs = SyncFileSystem.connect(CFG)
fs.write_file("/forked", b"parent")
out["inherited"] = in_child(lambda: fs.read_file("/forked"))
out["connect_while_open"] = in_child(lambda: SyncFileSystem.connect(CFG, timeout_s=10))
out["parent_after"] = outcome(lambda: fs.read_file("/forked"))
fs.close()


def fresh():
    with SyncFileSystem.connect(CFG, timeout_s=10) as child_fs:
        return child_fs.read_file("/forked")


out["connect_after_parent_closed"] = in_child(fresh)
print(json.dumps(out))
"""

_CLOSE = r"""
import pickle

out = {}
fs = SyncFileSystem.connect(CFG)
fs.write_file("/busy", os.urandom(1 << 20))
ended = []


def reader():
    try:
        while True:
            fs.read_batch([("/busy", 0, 1 << 20)] * 4)
    except BaseException as e:
        ended.append(f"{type(e).__name__}: {e}")


threads = [threading.Thread(target=reader, daemon=True) for _ in range(4)]
for t in threads:
    t.start()
time.sleep(1.0)
out["close"] = outcome(fs.close)
for t in threads:
    t.join(15)
out["threads_left"] = sum(t.is_alive() for t in threads)
out["thread_errors"] = ended
out["after_close"] = outcome(lambda: fs.stat("/busy"))
out["close_again"] = outcome(fs.close)
out["closed"] = fs.closed
fs2 = SyncFileSystem.connect(CFG)
out["pickle"] = outcome(lambda: pickle.dumps(fs2))
f = fs2.open("/busy")
f.close()
g = fs2.open("/busy")
fs2.close()
out["file_close_again"] = outcome(f.close)  # closed before: nothing to do
out["file_close_after"] = outcome(g.close)  # open when its file system closed, which closed it
print(json.dumps(out))
"""

_UNCLOSED = r"""
import asyncio, gc, warnings

from fs3.client import FileSystem

# a ResourceWarning made an error (pytest -W error) must not stop the closes it tells of
warnings.simplefilter("error", ResourceWarning)
out = {}


def client_threads():
    return sum(t.name.startswith("fs3-client") for t in threading.enumerate())


def settle(pred, wait_s=20.0):
    end = time.monotonic() + wait_s
    while not pred() and time.monotonic() < end:
        time.sleep(0.05)
    return pred()


baseline = client_threads()
with SyncFileSystem.connect(CFG) as fs:
    fs.write_file("/sample", b"s" * 100_000)
# clients nobody keeps: each was left open, with its thread and connections, until exit
for _ in range(10):
    assert SyncFileSystem.connect(CFG).read_file("/sample") == b"s" * 100_000
out["threads_left"] = 0 if settle(lambda: client_threads() == baseline) else client_threads() - baseline


def open_for_write(path):
    return SyncFileSystem.connect(CFG).open(path, "wb")  # the file keeps its client open


f = open_for_write("/dropped-client")
f.write(b"w" * 3_000_000)
out["file_kept_client"] = outcome(lambda: f.stat().st_size)
del f  # the file and its client go: the client is closed, the writes flushed
settle(lambda: client_threads() == baseline)
fs = SyncFileSystem.connect(CFG)
out["written_by_dropped"] = len(fs.read_file("/dropped-client"))

# files dropped unclosed (a data loader's fs.open(p).read()): each kept its state and meta session
for _ in range(50):
    assert fs.open("/sample").read(10) == b"s" * 10
out["states_left"] = 0 if settle(lambda: not fs.aio._states) else len(fs.aio._states)
warnings.simplefilter("ignore", ResourceWarning)

# a fork soon after a client was dropped (its close under way in gRPC): children crashed, SIGSEGV
statuses = []
for _ in range(30):  # (about one in ten crashed)
    SyncFileSystem.connect(CFG).read_file("/sample")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    statuses.append(os.waitpid(pid, 0)[1])
out["fork_statuses"] = sorted(set(statuses))

# a file of a closed client: ValueError, as a closed Python file
r = fs.open("/sample")
fs.close()
out["read_after_close"] = outcome(lambda: r.read())
out["pread_after_close"] = outcome(lambda: r.pread(1, 0))

# closes at once, from two threads and from two tasks: each returns, none fails
outcomes = []
for _ in range(5):
    both = SyncFileSystem.connect(CFG)
    both.stat("/")
    got = []
    ts = [threading.Thread(target=lambda: got.append(outcome(both.close)["what"])) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    outcomes.extend(got)
out["two_thread_closes"] = sorted(set(outcomes))


async def two_task_closes():
    fs = await FileSystem.connect(CFG)
    await fs.stat("/")
    return [repr(r) for r in await asyncio.gather(fs.close(), fs.close(), return_exceptions=True)]


out["two_task_closes"] = sorted({w for _ in range(5) for w in asyncio.run(two_task_closes())})

# the client closed while other threads close the files they wrote: their closes end first
fs = SyncFileSystem.connect(CFG)
closing = threading.Barrier(5)
closed = []


def writer(i):
    f = fs.open(f"/closing-{i}", "wb")
    f.write(bytes([i]) * (8 << 20))
    closing.wait()
    closed.append(outcome(f.close)["what"])


ts = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
for t in ts:
    t.start()
closing.wait()
time.sleep(0.02)
fs.close()
for t in ts:
    t.join(60)
out["writer_closes"] = sorted(set(closed))
with SyncFileSystem.connect(CFG) as fs:
    out["writer_lengths"] = [fs.stat(f"/closing-{i}").st_size for i in range(4)]
print(json.dumps(out))

# a script that ends with a file of an otherwise dropped client open: written at exit
g = open_for_write("/written-at-exit")
g.write(b"e" * 2_000_000)
# and one an atexit hook drops (after the threads were joined): its close was never waited for
import atexit

held = {"f": open_for_write("/dropped-at-exit")}
held["f"].write(b"a" * 2_000_000)
atexit.register(held.clear)
"""

_TUNED = r"""
import resource

import asyncio
from fs3.client import FileSystem


async def main():
    fs = await FileSystem.connect(CFG)
    await fs.write_file("/tuned", os.urandom(1 << 20))
    for _ in range(5):
        await fs.read_batch([("/tuned", 0, 1 << 20)] * 3)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        got = await fs.read_batch([("/tuned", 0, 1 << 20)] * 3)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    await fs.close()
    return got, faults


got, faults = asyncio.run(main())
print(json.dumps({"faults_per_mib": faults / 120, "lengths": sorted({len(b) for b in got})}))
"""


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FsCluster]:
    async with FsCluster(tmp_path_factory.mktemp("fs")) as c:
        yield c


def _run(script: str, config: Path) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script, str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def test_a_forked_child_is_told_instead_of_hanging(cluster: FsCluster) -> None:
    """A child of fork() (a DataLoader worker with the 'fork' start method) waited for ever on
    the parent's client (its loop thread does not exist there), and a client it connected itself
    hung or crashed in gRPC while the parent's was open. Both now fail at once and say what to do;
    the parent's client goes on; a child forked after the parent closed its client connects."""
    import asyncio

    out = await asyncio.to_thread(_run, _FORK, cluster.client_config("fork"))
    for case in ("inherited", "connect_while_open"):
        got = out[case]
        assert isinstance(got, dict)
        assert got["what"].startswith("RuntimeError: ") and "spawn" in got["what"], out
        assert got["s"] < 5, out
    assert out["inherited"]["what"].find("before fork()") > 0  # type: ignore[index]
    assert out["parent_after"] == {"what": repr(b"parent"), "s": out["parent_after"]["s"]}  # type: ignore[index]
    assert out["connect_after_parent_closed"]["what"] == repr(b"parent"), out  # type: ignore[index]


async def test_close_ends_other_threads_calls_and_later_calls_fail_clearly(cluster: FsCluster) -> None:
    """close() with reads under way in other threads left them blocked for ever (the loop stopped
    under their calls) and the interpreter could not exit; a call after close raised "Event loop
    is closed" with a never-awaited coroutine, and a second close raised."""
    import asyncio

    out = await asyncio.to_thread(_run, _CLOSE, cluster.client_config("close"))
    assert out["close"]["what"] == "None", out  # type: ignore[index]
    assert out["threads_left"] == 0, out
    errors = out["thread_errors"]
    assert isinstance(errors, list) and len(errors) == 4, out
    assert all(e.startswith("FS3OSError: ") for e in errors), out
    assert out["after_close"]["what"].startswith("FS3OSError: FAILED_PRECONDITION"), out  # type: ignore[index]
    assert "closed" in out["after_close"]["what"], out  # type: ignore[index]
    assert out["close_again"]["what"] == "None" and out["closed"] is True, out  # type: ignore[index]
    assert out["pickle"]["what"].startswith("TypeError: ") and "connect" in out["pickle"]["what"], out  # type: ignore[index]
    assert out["file_close_again"]["what"] == "None", out  # type: ignore[index]
    assert out["file_close_after"]["what"] == "None", out  # type: ignore[index]


async def test_dropped_clients_and_files_are_closed_and_closes_at_once_agree(cluster: FsCluster) -> None:
    """A SyncFileSystem nobody kept (``SyncFileSystem.connect(cfg).read_file(p)``) stayed open
    with its thread and connections until exit; one whose only reference was a file it opened
    was collected at once and never closed, so the file's writes were lost. Files dropped unclosed
    (``fs.open(p).read()``) kept their state and meta session until the client closed. Two closes
    at once failed (CANCELLED) as the first ended the connections under the second, and so did a
    file's close under way in another thread (its writes lost); a file of a closed client raised
    OSError where Python's closed files raise ValueError. The closes of dropped clients and files
    are made when their ResourceWarning is an error, an exit (a client an atexit hook dropped)
    and a fork wait for them (a child forked while one was in gRPC crashed)."""
    import asyncio

    out = await asyncio.to_thread(_run, _UNCLOSED, cluster.client_config("dropped"))
    assert out["threads_left"] == 0, out
    assert out["file_kept_client"]["what"] == "3000000", out  # type: ignore[index]
    assert out["written_by_dropped"] == 3_000_000, out
    assert out["states_left"] == 0, out
    for case in ("read_after_close", "pread_after_close"):
        assert out[case]["what"].startswith("FS3ValueError: "), out  # type: ignore[index]
    assert out["two_thread_closes"] == ["None"], out
    assert out["two_task_closes"] == ["None"], out
    assert out["writer_closes"] == ["None"] and out["writer_lengths"] == [8 << 20] * 4, out
    assert out["fork_statuses"] == [0], out
    fs = await cluster.connect()
    try:
        assert await fs.read_file("/written-at-exit") == b"e" * 2_000_000
        assert await fs.read_file("/dropped-at-exit") == b"a" * 2_000_000
    finally:
        await fs.close()


async def test_a_call_submitted_while_close_runs_ends_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that passed the closed check just before close() set it, and was submitted after
    close had listed the tasks to cancel, was never cancelled: its caller waited for ever (diff
    review). The check and the submission are one step against close now."""
    import asyncio

    await asyncio.to_thread(_race_with_close, monkeypatch)


def _race_with_close(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import threading
    import time

    from fs3.client import sync_api
    from fs3.errors import FS3Error, StatusCode

    loop = sync_api._LoopThread()  # noqa: SLF001

    async def slow_to_cancel() -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # cleanup on cancel (a flush, say)
            raise

    async def three_seconds() -> str:
        await asyncio.sleep(3)
        return "done"

    real = asyncio.run_coroutine_threadsafe

    def late(coro, target_loop):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "late":
            time.sleep(0.2)  # between the closed check and the submission
        return real(coro, target_loop)

    monkeypatch.setattr(sync_api.asyncio, "run_coroutine_threadsafe", late)
    outcomes: dict[str, object] = {}

    def call(name: str, make) -> None:  # type: ignore[no-untyped-def]
        try:
            outcomes[name] = loop.run(make())
        except BaseException as e:  # noqa: BLE001 - recorded for the assertions
            outcomes[name] = e

    under_way = threading.Thread(target=call, args=("under_way", slow_to_cancel))
    under_way.start()
    time.sleep(0.1)
    submitting = threading.Thread(target=call, args=("late", three_seconds), name="late")
    submitting.start()
    time.sleep(0.05)
    loop.stop()
    for t in (under_way, submitting):
        t.join(10)
        assert not t.is_alive()
    for name in ("under_way", "late"):
        e = outcomes[name]
        assert isinstance(e, FS3Error) and e.code in (StatusCode.CANCELLED, StatusCode.FAILED_PRECONDITION), (
            outcomes
        )


@pytest.mark.parametrize("tuned", [True, False])
async def test_tune_malloc_setting(cluster: FsCluster, tuned: bool) -> None:
    """An async client on the main thread reading 1 MiB blocks into new bytes faulted most of each
    block's pages in afresh (55 to 170 of 256 here: glibc cut its heap back between reads; the storage
    benchmark's "read 1MiB" swung between 589 and 941 MiB/s with it). With ``tune_malloc = true``
    connect fixes glibc's thresholds and the freed blocks are reused (11 to 13). Untuned, the count
    depends on what else the process allocated, so only the tuned one is asserted."""
    import asyncio

    out = await asyncio.to_thread(_run, _TUNED, cluster.client_config(f"tuned-{tuned}", tune_malloc=tuned))
    assert out["lengths"] == [1 << 20], out
    if tuned:
        assert out["faults_per_mib"] < 32, out


_DROPPED = r"""
fs = SyncFileSystem.connect(CFG)
fs.open("/dropped", "wb").write(b"hello")  # the file object is dropped unclosed
fs.open("/dropped-big", "wb").write(b"x" * (9 << 20))
import gc

gc.collect()
fs.close()
fs2 = SyncFileSystem.connect(CFG)
out = {"small": fs2.read_file("/dropped").decode(), "big": fs2.stat("/dropped-big").st_size}
kept = fs2.open("/at-exit", "wb")
kept.write(b"bye")
print(json.dumps(out))
# the script ends with the file and the client open
"""

_READ_BACK = r"""
with SyncFileSystem.connect(CFG) as fs:
    print(json.dumps({"at_exit": fs.read_file("/at-exit").decode()}))
"""


async def test_writes_of_files_left_open_are_not_lost(cluster: FsCluster) -> None:
    """``fs.open(p, "wb").write(data)`` (the file dropped, never closed) lost the data: the client
    tracked open files weakly, so the collected file was never flushed, not even by the client's
    close. And a script that ended with files and its client open lost what those files held;
    Python flushes its own files at exit. Both are kept now (use found)."""
    import asyncio

    cfg = cluster.client_config("dropped")
    out = await asyncio.to_thread(_run, _DROPPED, cfg)
    assert out == {"small": "hello", "big": 9 << 20}, out
    back = await asyncio.to_thread(_run, _READ_BACK, cfg)
    assert back == {"at_exit": "bye"}, back
