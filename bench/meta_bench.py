"""mdtest-like benchmark of the metadata service: create, stat, open, unlink and mkdir rates.

    .venv/bin/python bench/meta_bench.py                       # starts one meta daemon over lmdb
    .venv/bin/python bench/meta_bench.py --clients 1,16 --items 2000 --procs 2 --json
    .venv/bin/python bench/meta_bench.py --clients 16 --layout many-dirs --items 2000 --runs 5
    .venv/bin/python bench/meta_bench.py --address 10.0.0.5:8100 --secret-file /etc/fs3/secret

Each of ``clients`` native clients (fs3.client.meta_client.MetaClient, one per coroutine, spread over
``procs`` worker processes) runs the phases in lockstep with the others (a barrier between phases):

* ``mkdir``: ``items`` directories each;
* ``create``: ``items`` files each (open(O_CREAT|O_EXCL) with a request id, as a client sends it);
* ``stat``: each file once, by inode id;
* ``open``: each file opened read-only and closed (two requests; a rate of files), as a data
  loader reading small files does;
* ``unlink``: each file.

``--layout one-dir`` puts every client's entries in one shared directory (the contended case);
``many-dirs`` gives each client a directory of its own. Each client has a connection of its own unless
``--share-rpc`` makes the clients of a process share one (as one FUSE mount's operations do: their
requests and replies then travel in shared writes). A rate is all clients' operations divided by
the wall time from the first client's start to the last one's end; CPU per operation is shown for
the server (when its pid is known) and for the client processes together. Without ``--address`` the
benchmark starts a meta daemon for each case (layout and client count), each on an lmdb store of its
own in a temporary directory, and stops it after the case: the files one case's unlink phase leaves
to the collector are not collected during the next case. ``--runs N`` runs each case N times and
ends with each phase's lowest, median and highest rate: on a shared or virtual machine, runs
minutes apart can differ by a quarter.

When the server's ``/metrics`` is known (a started daemon's, or ``--metrics HOST:PORT``), each phase
also shows the store's group commit: transactions per write batch (``tx/batch``), milliseconds per
batch in the write transaction including LMDB's data flush (``commit ms``), and per flush that
made batches durable (``flush ms``), from the ``fs3_kv_*`` counters.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fs3.cli.local_cluster import free_ports  # noqa: E402
from fs3.client.meta_client import DEV_SECRET, ROOT_ID, MetaClient  # noqa: E402
from fs3.net import RpcClient  # noqa: E402
from fs3.proto import common_pb2  # noqa: E402

PHASES = ("mkdir", "create", "stat", "open", "unlink")
LAYOUTS = ("one-dir", "many-dirs")
O_EXCL_RDWR = 0o200 | 2


@dataclass(slots=True)
class Result:
    layout: str
    clients: int
    phase: str
    ops: int
    seconds: float
    server_cpu_s: float | None = None  # CPU the meta server used in the phase (when it runs here)
    client_cpu_s: float = 0.0  # CPU the client processes used in the phase
    kv: dict[str, float] | None = None  # the phase's increase of the server's fs3_kv_* counters
    run: int = 1  # which of the case's --runs

    @property
    def kv_per_batch(self) -> tuple[float, float, float] | None:
        """(transactions per batch, commit ms per batch, ms per flush), when the counters are known."""
        kv = self.kv
        if not kv or not kv.get("fs3_kv_commit_batches"):
            return None
        batches = kv["fs3_kv_commit_batches"]
        flushes = kv.get("fs3_kv_fsyncs") or 0
        return (
            kv["fs3_kv_commit_transactions"] / batches,
            1e3 * kv["fs3_kv_commit_seconds"] / batches,
            1e3 * kv["fs3_kv_fsync_seconds"] / flushes if flushes else 0.0,
        )

    @property
    def client_us_per_op(self) -> float:
        """Client CPU per operation: on a machine that runs clients and server alike, it competes
        with the server for the same cores."""
        return 1e6 * self.client_cpu_s / self.ops

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_us_per_op(self) -> float | None:
        """Server CPU per operation: what bounds one server's rate on one core, however busy the
        machine running the benchmark is."""
        return None if self.server_cpu_s is None else 1e6 * self.server_cpu_s / self.ops


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU of process ``pid`` (all its threads), from /proc; None if unknown."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


KV_COUNTERS = (
    "fs3_kv_commit_batches",
    "fs3_kv_commit_transactions",
    "fs3_kv_commit_seconds",
    "fs3_kv_fsyncs",
    "fs3_kv_fsync_seconds",
)


def kv_counters(metrics: str | None) -> dict[str, float] | None:
    """The server's group commit counters from its ``/metrics`` at ``host:port``; None if unknown."""
    if not metrics:
        return None
    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.name in KV_COUNTERS}
    return out or None


async def _client_work(
    client: MetaClient, phase: str, parent: int, tag: str, items: int, state: dict[str, list[int]]
) -> None:
    if phase == "mkdir":
        for i in range(items):
            await client.mkdir(parent, f"d{tag}.{i}".encode(), 0o755)
    elif phase == "create":
        ids = state.setdefault(tag, [])
        for i in range(items):
            ids.append((await client.create(parent, f"f{tag}.{i}".encode(), 0o644, O_EXCL_RDWR)).inode.id)
    elif phase == "stat":
        for inode_id in state[tag]:
            await client.stat(inode_id)
    elif phase == "open":
        for inode_id in state[tag]:
            rsp = await client.open(inode_id, 0)
            await client.close_file(inode_id, rsp.session_id)
    elif phase == "unlink":
        for i in range(items):
            await client.unlink(parent, f"f{tag}.{i}".encode())


async def _worker_main(
    address: str,
    secret: bytes | None,
    names: list[str],
    parents: list[int],
    items: int,
    barrier,
    out,
    server_pid: int | None,
    share_rpc: bool = False,
    metrics: str | None = None,
) -> None:
    user = common_pb2.UserInfo(uid=0, gid=0)
    # shared: the process's clients call through one RpcClient (one connection), as the
    # operations of one FUSE mount do; else each client has a connection of its own
    rpc = RpcClient(secret or DEV_SECRET, identity="meta-bench") if share_rpc else None
    clients = [MetaClient([address], secret, user=user, rpc=rpc, timeout_s=120) for _ in names]
    state: dict[str, list[int]] = {}
    try:
        for phase in PHASES:
            await asyncio.to_thread(barrier.wait)
            kv0 = kv_counters(metrics)
            cpu0 = cpu_seconds(server_pid)
            mine0 = time.process_time()
            start = time.time()
            await asyncio.gather(
                *(
                    _client_work(c, phase, p, n, items, state)
                    for c, p, n in zip(clients, parents, names, strict=True)
                )
            )
            end = time.time()
            cpu1 = cpu_seconds(server_pid)
            mine = time.process_time() - mine0
            out.put((phase, start, end, cpu0, cpu1, mine, kv0, kv_counters(metrics)))
    finally:
        for c in clients:
            await c.close()
        if rpc is not None:
            await rpc.close()


def _worker(*args) -> None:  # type: ignore[no-untyped-def]
    barrier, out = args[5], args[6]
    try:
        try:
            import uvloop
        except ImportError:
            asyncio.run(_worker_main(*args))
        else:
            uvloop.run(_worker_main(*args))
    except BaseException as e:
        # the others must not wait for this one at the next phase, nor the parent for its results
        barrier.abort()
        out.put(("failed", f"{type(e).__name__}: {e}"))
        raise


async def _prepare(address: str, secret: bytes | None, layout: str, clients: int, run: str) -> list[int]:
    async with MetaClient([address], secret, user=common_pb2.UserInfo(uid=0, gid=0)) as c:
        top = await c.mkdir(ROOT_ID, run.encode(), 0o755)
        if layout == "one-dir":
            return [top.id] * clients
        return [(await c.mkdir(top.id, f"c{i}".encode(), 0o755)).id for i in range(clients)]


def run_case(
    address: str,
    secret: bytes | None,
    layout: str,
    clients: int,
    items: int,
    procs: int,
    server_pid: int | None = None,
    share_rpc: bool = False,
    metrics: str | None = None,
) -> list[Result]:
    run = f"bench-{layout}-{clients}-{os.getpid()}-{time.time_ns()}"
    parents = asyncio.run(_prepare(address, secret, layout, clients, run))
    nproc = max(1, min(procs, clients))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(nproc, timeout=900)  # a phase longer than that is a hung run
    out = ctx.Queue()
    workers = []
    for w in range(nproc):
        mine = list(range(w, clients, nproc))
        names = [f"{i}" for i in mine]
        p = ctx.Process(
            daemon=True,  # never outlives the bench (Ctrl-C, a failure)
            target=_worker,
            args=(
                address,
                secret,
                names,
                [parents[i] for i in mine],
                items,
                barrier,
                out,
                server_pid,
                share_rpc,
                metrics,
            ),
        )
        p.start()
        workers.append(p)
    times: dict[str, list[tuple]] = {ph: [] for ph in PHASES}
    ok = False
    try:
        got = 0
        while got < nproc * len(PHASES):
            try:
                phase, *rest = out.get(timeout=1)
            except queue.Empty:
                dead = [p for p in workers if p.exitcode is not None and p.exitcode != 0]
                if dead:
                    raise SystemExit(f"a bench worker exited with status {dead[0].exitcode}") from None
                continue
            if phase == "failed":
                raise SystemExit(f"a bench worker failed: {rest[0]}")
            times[phase].append(tuple(rest))
            got += 1
        ok = True
    finally:
        for p in workers:
            p.join(timeout=60 if ok else 0)
            if p.is_alive():
                p.terminate()
    results = []
    for phase in PHASES:
        rows = times[phase]
        start = min(r[0] for r in rows)
        end = max(r[1] for r in rows)
        cpu = None
        if all(r[2] is not None and r[3] is not None for r in rows):
            cpu = max(r[3] for r in rows) - min(r[2] for r in rows)  # type: ignore[type-var]
        mine = sum(r[4] for r in rows)
        kv = None
        if all(r[5] is not None and r[6] is not None for r in rows):
            # counters only grow: from the earliest start to the latest end of any worker
            kv = {
                k: max(r[6].get(k, 0.0) for r in rows) - min(r[5].get(k, 0.0) for r in rows)
                for k in KV_COUNTERS
            }
        results.append(Result(layout, clients, phase, clients * items, end - start, cpu, mine, kv))
    return results


def start_daemon(tmp: Path) -> tuple[subprocess.Popen, str, str]:
    """A meta daemon on an lmdb store under ``tmp``: (process, address, metrics address)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "meta.toml"
    port_file = tmp / "meta.port"
    port_file.unlink(missing_ok=True)  # an earlier run's: not this daemon's port
    (metrics_port,) = free_ports("127.0.0.1", 1)
    cfg.write_text(
        f"listen_port = 0\nmetrics_port = {metrics_port}\nmgmtd_addresses = []\nauthenticate = false\n"
        f'[kv]\nengine = "lmdb"\npath = "{tmp / "kv"}"\n[log]\nlevel = "WARNING"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "fs3.meta", "--config", str(cfg), "--port-file", str(port_file)],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("meta daemon did not start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}", f"127.0.0.1:{metrics_port}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=os.environ.get("FS3_BENCH_PROG"), description=__doc__.split("\n\n")[0])
    p.add_argument("--address", help="host:port of a running meta server (default: start one)")
    p.add_argument("--secret-file", help="the cluster secret (default: the development secret)")
    p.add_argument("--clients", default="1,16", help="comma-separated client counts")
    p.add_argument(
        "--layout", default="both", help="one-dir, many-dirs, or both (also written one-dir,many-dirs)"
    )
    p.add_argument("--items", type=int, default=1000, help="entries per client per phase")
    p.add_argument("--procs", type=int, default=2, help="client processes to spread the clients over")
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run each case this many times (each on a fresh daemon, unless --address) and show the medians",
    )
    p.add_argument(
        "--dir", help="where the started daemons keep their stores, a folder per case (default: a temp dir)"
    )
    p.add_argument("--server-pid", type=int, help="pid of a --address server on this host, for its CPU use")
    p.add_argument("--metrics", help="host:port of the --address server's /metrics, for its group commit")
    p.add_argument(
        "--share-rpc",
        action="store_true",
        help="the clients of one process share one connection (as a FUSE mount's operations do)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    layouts = list(LAYOUTS) if args.layout == "both" else args.layout.split(",")
    if bad := [name for name in layouts if name not in LAYOUTS]:
        p.error(f"--layout: unknown {', '.join(map(repr, bad))} (one-dir, many-dirs or both)")
    try:
        counts = [int(c) for c in args.clients.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        p.error(f"--clients: {args.clients!r} is not a list of positive counts (e.g. 1,16)")
    if args.items < 1 or args.procs < 1 or args.runs < 1:
        p.error("--items, --procs and --runs must be positive")
    secret = Path(args.secret_file).read_bytes().strip() if args.secret_file else None
    tmp = None
    if args.address is None:
        tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fs3-meta-bench-"))
    results: list[Result] = []
    try:
        for layout, clients, run in itertools.product(layouts, counts, range(1, args.runs + 1)):
            proc = None
            address, pid, metrics = args.address, args.server_pid, args.metrics
            if tmp is not None:
                # A daemon of its own for each case, on a store of its own: what a case leaves
                # behind (the files its unlink phase queued for the collector, whose rounds
                # would take the server's CPU in the next case's phases) is not the next one's.
                case = f"{layout}-{clients}" + (f"-run{run}" if args.runs > 1 else "")
                proc, address, metrics = start_daemon(tmp / case)
                pid = proc.pid
            try:
                for r in run_case(
                    address, secret, layout, clients, args.items, args.procs, pid, args.share_rpc, metrics
                ):
                    r.run = run
                    results.append(r)
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait(timeout=30)
    finally:
        if tmp is not None and not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        rows = [
            {
                **asdict(r),
                "rate": r.rate,
                "server_us_per_op": r.server_us_per_op,
                "client_us_per_op": r.client_us_per_op,
                "kv_tx_per_batch": r.kv_per_batch[0] if r.kv_per_batch else None,
                "kv_commit_ms": r.kv_per_batch[1] if r.kv_per_batch else None,
                "kv_flush_ms": r.kv_per_batch[2] if r.kv_per_batch else None,
            }
            for r in results
        ]
        print(json.dumps(rows, indent=2))
    else:
        print(
            f"{'layout':<10} {'clients':>7} {'phase':<7} {'ops':>8} {'seconds':>8} {'ops/s':>9} {'srv us/op':>9}"
            f" {'cli us/op':>9} {'tx/batch':>8} {'commit ms':>9} {'flush ms':>8}"
        )
        for r in results:
            us = f"{r.server_us_per_op:9.0f}" if r.server_us_per_op is not None else f"{'-':>9}"
            kv = r.kv_per_batch
            group = f" {kv[0]:8.1f} {kv[1]:9.2f} {kv[2]:8.2f}" if kv else f" {'-':>8} {'-':>9} {'-':>8}"
            print(
                f"{r.layout:<10} {r.clients:>7} {r.phase:<7} {r.ops:>8} {r.seconds:>8.2f} {r.rate:>9.0f} {us}"
                f" {r.client_us_per_op:9.0f}{group}"
            )
        if args.runs > 1:
            print(f"\nmedians of {args.runs} runs (ops/s: lowest, median, highest)")
            print(
                f"{'layout':<10} {'clients':>7} {'phase':<7} {'lowest':>9} {'median':>9} {'highest':>9} {'srv us/op':>9}"
            )
            for (layout, clients, phase), rs in _by_case(results).items():
                rates = sorted(r.rate for r in rs)
                cpu = [r.server_us_per_op for r in rs if r.server_us_per_op is not None]
                us = f"{statistics.median(cpu):9.0f}" if cpu else f"{'-':>9}"
                print(
                    f"{layout:<10} {clients:>7} {phase:<7} {rates[0]:>9.0f} {statistics.median(rates):>9.0f}"
                    f" {rates[-1]:>9.0f} {us}"
                )
    return 0


def _by_case(results: list[Result]) -> dict[tuple[str, int, str], list[Result]]:
    """Each case's phase (layout, clients, phase) and its results, one a run, in order."""
    cases: dict[tuple[str, int, str], list[Result]] = {}
    for r in results:
        cases.setdefault((r.layout, r.clients, r.phase), []).append(r)
    return cases


if __name__ == "__main__":
    sys.exit(main())
