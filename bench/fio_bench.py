"""fio against an fs3 mount, beside the same runs on the local disk.

    .venv/bin/python bench/fio_bench.py                     # starts a cluster (3 storage daemons,
                                                            # replication 3) and mounts it
    .venv/bin/python bench/fio_bench.py --mount /mnt/fs3    # an existing mount
    .venv/bin/python bench/fio_bench.py --repeat 3 --json   # best and typical (median) of 3

Runs the job files in bench/fio/ (variables DIR, SIZE, NUMJOBS, DIRECT, IODEPTH, IOENGINE, RUNTIME)
for buffered and direct I/O: sequential write and read with 1 MiB blocks (1 and 4 jobs), random read
and write with 4 KiB blocks (4 jobs), with libaio. Linux AIO is asynchronous for O_DIRECT only: a
buffered libaio read that misses the page cache blocks in io_submit, so each buffered read job keeps
one read in flight whatever its iodepth says. Buffered random reads are therefore run a second time
with io_uring, which keeps iodepth reads in flight for buffered files too (the row marked
"io_uring"; skipped, with the reason, where the kernel refuses io_uring). Sequential buffered reads
need no second run: the kernel's readahead keeps them in flight with either engine.

Page caches are dropped before each read run (as root), so buffered reads come from fs3, not from
memory. Prints MiB/s and IOPS per run for fs3 and local, and the CPU time per I/O of the mount
process, of the storage daemons and of the other servers (mgmtd, meta) -- figures that other load on
the machine distorts far less than the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fs3.config import StorageConfig
from fs3.storage.chunk_files import ext4_without_journal_note

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "bench" / "fio"


@dataclass(frozen=True)
class Run:
    job: str  # job file stem
    numjobs: int
    direct: int
    iodepth: int
    engine: str = "libaio"

    @property
    def name(self) -> str:
        name = f"{self.job} j{self.numjobs} {'direct' if self.direct else 'buffered'} qd{self.iodepth}"
        return name if self.engine == "libaio" else f"{name} {self.engine}"


def runs() -> list[Run]:
    out = []
    for direct in (0, 1):
        out += [
            Run("seq-write", 1, direct, 4),
            Run("seq-write", 4, direct, 4),
            Run("seq-read", 1, direct, 4),
            Run("seq-read", 4, direct, 4),
            Run("rand-read", 4, direct, 16),
            Run("rand-write", 4, direct, 16),
        ]
        if not direct:
            # buffered random reads also with io_uring (module docstring), beside the libaio run
            # and before the random writes that turn the files' chunks into layered versions
            out.insert(-1, Run("rand-read", 4, direct, 16, "io_uring"))
    return out


def engine_refused(engine: str, directory: Path) -> str | None:
    """Why fio cannot use ``engine`` in ``directory`` (a kernel without io_uring, or one that
    refuses it: kernel.io_uring_disabled, a seccomp filter), or None when a small read works."""
    probe = directory / f"fio-engine-probe-{os.getpid()}"
    try:
        r = subprocess.run(
            [
                "fio",
                "--name=probe",
                f"--ioengine={engine}",
                "--rw=read",
                "--bs=4k",
                "--size=64k",
                f"--filename={probe}",
                "--output-format=terse",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        probe.unlink(missing_ok=True)
    if r.returncode == 0:
        return None
    lines = [line for line in (r.stderr or r.stdout).splitlines() if line.strip()]
    return f"fio --ioengine={engine} fails: {lines[-1] if lines else f'exit status {r.returncode}'}"


def drop_caches() -> None:
    with contextlib.suppress(OSError):
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used (0 for any that is gone)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


# CPU columns: process group -> the key of its CPU microseconds per I/O in a sample
CPU_GROUPS = {
    "mount": "mount_cpu_us_per_io",
    "storage": "storage_cpu_us_per_io",
    "other": "other_cpu_us_per_io",
}


def fio(run: Run, directory: Path, size: str, runtime: int, pids: dict[str, list[int]]) -> dict[str, float]:
    """Run one job; returns MiB/s and IOPS summed over the jobs, and CPU microseconds per I/O of
    each process group in ``pids`` (``CPU_GROUPS``; figures a busy machine distorts less than rates)."""
    if "read" in run.job:
        drop_caches()
    env = {
        **os.environ,
        "DIR": str(directory),
        "SIZE": size,
        "NUMJOBS": str(run.numjobs),
        "DIRECT": str(run.direct),
        "IODEPTH": str(run.iodepth),
        "IOENGINE": run.engine,
        "RUNTIME": str(runtime),
    }
    before = {g: cpu_seconds(pids.get(g, [])) for g in CPU_GROUPS}
    r = subprocess.run(
        ["fio", "--output-format=json", str(JOBS / f"{run.job}.fio")],
        env=env,
        capture_output=True,
        text=True,
        timeout=runtime * 10 + 600,
    )
    if r.returncode != 0:
        raise RuntimeError(f"fio {run.name} in {directory} failed:\n{r.stderr[-2000:]}")
    report = json.loads(r.stdout[r.stdout.index("{") :])
    job = report["jobs"][0]
    side = job["write"] if "write" in run.job else job["read"]
    ios = max(side["total_ios"], 1)
    out = {"mib_s": side["bw_bytes"] / (1 << 20), "iops": side["iops"]}
    for g, key in CPU_GROUPS.items():
        out[key] = (cpu_seconds(pids.get(g, [])) - before[g]) / ios * 1e6
    return out


def measure(
    directory: Path,
    size: str,
    runtime: int,
    repeat: int,
    only: str,
    pids: dict[str, list[int]] | None = None,
) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {}
    refused: dict[str, str | None] = {}
    for _ in range(repeat):
        for run in runs():
            if only and only not in run.name:
                continue
            if run.engine not in refused:
                refused[run.engine] = engine_refused(run.engine, directory)
                if refused[run.engine]:
                    print(f"  {directory}: {run.engine} runs skipped: {refused[run.engine]}", file=sys.stderr)
            if refused[run.engine]:
                continue
            sample = fio(run, directory, size, runtime, pids or {})
            results.setdefault(run.name, []).append(sample)
            print(f"  {directory}: {run.name}: {results[run.name][-1]}", file=sys.stderr)
    return results


def summary(samples: list[dict[str, float]]) -> dict[str, float]:
    mib = [s["mib_s"] for s in samples]
    iops = [s["iops"] for s in samples]
    return {
        "best_mib_s": max(mib),
        "typical_mib_s": statistics.median(mib),
        "best_iops": max(iops),
        "typical_iops": statistics.median(iops),
        **{key: statistics.median(s[key] for s in samples) for key in CPU_GROUPS.values()},
        "samples": len(samples),
    }


def table(fs3: dict[str, dict[str, float]], local: dict[str, dict[str, float]]) -> str:
    head = (
        f"{'run':38} {'fs3 MiB/s':>10} {'fs3 IOPS':>9} {'(typical)':>10} {'mount us/io':>11} "
        f"{'storage us/io':>13} {'meta+mgmtd':>10} {'local MiB/s':>12} {'local IOPS':>11}"
    )
    lines = [head, "-" * len(head)]
    for name, s in fs3.items():
        loc = local.get(name)
        typ = s["typical_iops"] if "rand" in name else s["typical_mib_s"]
        lines.append(
            f"{name:38} {s['best_mib_s']:10.0f} {s['best_iops']:9.0f} {typ:10.0f} "
            f"{s['mount_cpu_us_per_io']:11.0f} {s['storage_cpu_us_per_io']:13.0f} "
            f"{s['other_cpu_us_per_io']:10.0f} "
            + (f"{loc['best_mib_s']:12.0f} {loc['best_iops']:11.0f}" if loc else f"{'-':>12} {'-':>11}")
        )
    return "\n".join(lines)


async def _with_cluster(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "client")]
    from cluster import DEPLOYED_MGMTD_TIMING, DEPLOYED_STORAGE_TIMING
    from fs_cluster import FsCluster

    tmp = Path(tempfile.mkdtemp(prefix="fs3-fio-bench-", dir=args.tmp))
    if (note := ext4_without_journal_note(tmp, measure=True)) is not None:
        print(f"note: {note} (see the README)", file=sys.stderr)
    try:
        # The daemons run as deployed (the test fixture gives them 8 I/O threads to spare the
        # test machine; 1 MiB reads and every write go through those threads)
        # and with their deployed background intervals (heartbeats, routing polls), not the tests'
        extra: dict[str, object] = {"io_threads": args.io_threads, **DEPLOYED_STORAGE_TIMING}
        if args.page_cache:
            extra["direct_io"] = False
        async with FsCluster(
            tmp / "cluster",
            log_level="WARNING",
            chunk_size=args.chunk_size,
            storage_extra=extra,
            mgmtd_extra=dict(DEPLOYED_MGMTD_TIMING),
        ) as c:
            m = await c.mount(tmp / "mnt")
            pids: dict[str, list[int]] = {"mount": [m.proc.pid], "storage": [], "other": []}  # type: ignore[list-item]
            for p in c.cluster.procs:
                if p is not m.proc and p.pid is not None:
                    pids["storage" if p.name.startswith("storage") else "other"].append(p.pid)
            return await asyncio.to_thread(
                measure, m.path, args.size, args.runtime, args.repeat, args.only, pids
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(
        prog=os.environ.get("FS3_BENCH_PROG"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mount", type=Path, help="an existing fs3 mount (default: start a cluster and mount it)")
    p.add_argument("--mount-pid", type=int, action="append", default=[], help="with --mount: its process")
    p.add_argument(
        "--storage-pid", type=int, action="append", default=[], help="with --mount: a storage daemon"
    )
    p.add_argument(
        "--server-pid", type=int, action="append", default=[], help="with --mount: a mgmtd or meta daemon"
    )
    p.add_argument(
        "--local-dir", type=Path, help="local-disk directory to compare with (default: a temp dir)"
    )
    p.add_argument("--no-local", action="store_true", help="skip the local-disk runs")
    p.add_argument(
        "--page-cache",
        action="store_true",
        help="a started cluster's storage daemons use the page cache for chunk files (direct_io = false)",
    )
    p.add_argument(
        "--chunk-size", type=int, default=1 << 20, help="chunk size of the started cluster's files (1 MiB)"
    )
    default_threads = next(f.default for f in dataclasses.fields(StorageConfig) if f.name == "io_threads")
    p.add_argument(
        "--io-threads",
        type=int,
        default=default_threads,
        help=f"I/O threads of a started cluster's storage daemons (default {default_threads}, the "
        "storage config's default)",
    )
    p.add_argument("--size", default="512M", help="file size per job (default 512M)")
    p.add_argument("--runtime", type=int, default=8, help="seconds per time-based run (default 8)")
    p.add_argument("--repeat", type=int, default=1, help="measure each run this many times")
    p.add_argument("--only", default="", help="only runs whose name contains this")
    p.add_argument("--tmp", default="/var/tmp", help="where temporary clusters and files go")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args()
    if shutil.which("fio") is None:
        sys.stderr.write("fio_bench: fio is not installed\n")
        return 2
    if args.mount:
        d = args.mount / f"fio-bench-{os.getpid()}"
        d.mkdir()
        try:
            pids = {"mount": args.mount_pid, "storage": args.storage_pid, "other": args.server_pid}
            fs3_raw = measure(d, args.size, args.runtime, args.repeat, args.only, pids)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        fs3_raw = asyncio.run(_with_cluster(args))
    local_raw: dict[str, list[dict[str, float]]] = {}
    if not args.no_local:
        local = Path(tempfile.mkdtemp(prefix="fio-local-", dir=args.local_dir or args.tmp))
        try:
            local_raw = measure(local, args.size, args.runtime, args.repeat, args.only)
        finally:
            shutil.rmtree(local, ignore_errors=True)
    fs3 = {k: summary(v) for k, v in fs3_raw.items()}
    loc = {k: summary(v) for k, v in local_raw.items()}
    if args.json:
        print(json.dumps({"fs3": fs3, "local": loc, "size": args.size, "runtime_s": args.runtime}, indent=2))
    else:
        print(table(fs3, loc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
