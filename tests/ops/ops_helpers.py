"""Helpers for the operations tests: run the ``fs3`` command, start daemons that are killed by PID
at teardown, and stop local clusters however a test ended."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FS3 = [sys.executable, "-m", "fs3.cli.main"]


def fs3(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``fs3 ARGS`` and return the finished process (text output)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FS3_")}
    full_env.update(env or {})
    return subprocess.run(
        [*FS3, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=full_env
    )


def wait_for(pred: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05) -> object:
    """Poll ``pred`` until it returns something true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


class Spawner:
    """Starts daemons (own session, output to a log file) and kills them all by PID at teardown."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115  (closed with the process below)
        p = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        p.log_file = log  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                _kill_pid(p.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            p.log_file.close()  # type: ignore[attr-defined]


def _abort_mount(mount: str) -> None:
    """Abort and lazily unmount a FUSE mount a failed test left behind."""
    from fs3.cli.fuse_mounts import abort, is_mounted

    if mount and is_mounted(mount):
        abort(mount)
        subprocess.run(["fusermount3", "-u", "-z", mount], capture_output=True, timeout=30)


def cleanup_local(d: Path) -> None:
    """Stop the local cluster in ``d`` however the test ended: ``fs3 local down``, then SIGKILL by
    the recorded PIDs, then the mount."""
    if not (d / "local.json").exists():
        return
    state = json.loads((d / "local.json").read_text())
    with contextlib.suppress(subprocess.TimeoutExpired):
        fs3("local", "down", "--dir", str(d), "--timeout", "10", timeout=90)
    for pid_file in (d / "run").glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            _kill_pid(int(pid_file.read_text().strip()))
    _abort_mount(state.get("mount", ""))


def _metric_names(exprs: list[str]) -> set[str]:
    """The fs3 metric names PromQL expressions use (histogram suffixes removed)."""
    names = set()
    for e in exprs:
        for name in re.findall(r"\bfs3_[a-z_]+", e):
            names.add(re.sub(r"_(bucket|count|sum)$", "", name))
    return names


def dashboard_metrics() -> set[str]:
    """The metric names the Grafana dashboard's queries use (histogram suffixes removed)."""
    dash = json.loads((REPO / "deploy" / "grafana" / "fs3.json").read_text())
    return _metric_names([t["expr"] for p in dash["panels"] for t in p.get("targets", [])])


def alert_rules() -> list[dict]:
    """The rules of deploy/prometheus/fs3-alerts.yml."""
    import yaml

    doc = yaml.safe_load((REPO / "deploy" / "prometheus" / "fs3-alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_metrics() -> set[str]:
    """The metric names the alerting rules' expressions use."""
    return _metric_names([rule["expr"] for rule in alert_rules()])
