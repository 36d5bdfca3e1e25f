"""Daemons and their signals as supervisors and operators send them: SIGHUP stops cleanly, a
second stop signal does not cut a stop short, a stop signal while starting exits 0, and a daemon
started without standard output and error runs and exits 0 (it aborted)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ops_helpers import wait_for

pytestmark = pytest.mark.timeout(90)


def _mgmtd_config(tmp: Path) -> Path:
    cfg = tmp / "mgmtd.toml"
    cfg.write_text(
        'node_id = 1\nlisten_host = "127.0.0.1"\nlisten_port = 0\n'
        f'[kv]\nengine = "mem"\n[log]\nfile = "{tmp / "mgmtd.log"}"\n'
    )
    return cfg


def _start(argv: list[str], *, closed_std: bool = False) -> subprocess.Popen[bytes]:
    if closed_std:  # as a supervisor may start it: no standard output or error at all
        argv = ["bash", "-c", 'exec "$@" >&- 2>&-', "bash", *argv]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL)


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.kill()
        p.wait(timeout=10)


def test_a_daemon_without_stdout_and_stderr_serves_and_sighup_stops_it_cleanly(tmp_path: Path) -> None:
    """Started with `>&- 2>&-` every daemon exited by SIGABRT (uvloop asserts on closing a
    descriptor below 3, which its epoll had taken); SIGHUP killed a daemon with no log line and no
    clean stop (mgmtd's lease not released; a storage node not leaving its chains)."""
    cfg = _mgmtd_config(tmp_path)
    port_file = tmp_path / "port"
    p = _start(
        [sys.executable, "-m", "fs3.mgmtd", "--config", str(cfg), "--port-file", str(port_file)],
        closed_std=True,
    )
    try:
        wait_for(port_file.exists, 30, "mgmtd to listen")
        p.send_signal(signal.SIGHUP)
        assert p.wait(timeout=30) == 0
    finally:
        _stop(p)
    log = (tmp_path / "mgmtd.log").read_text()
    assert "shutdown requested by SIGHUP" in log and "mgmtd stopped" in log, log[-2000:]


def test_a_second_stop_signal_does_not_cut_the_stop_short(tmp_path: Path) -> None:
    """The handlers went at the start of the stop: a second SIGTERM (or SIGINT) while stopping
    killed the daemon, skipping the rest of its stop."""
    cfg = _mgmtd_config(tmp_path)
    port_file = tmp_path / "port"
    log_file = tmp_path / "mgmtd.log"
    p = _start([sys.executable, "-m", "fs3.mgmtd", "--config", str(cfg), "--port-file", str(port_file)])
    try:
        wait_for(port_file.exists, 30, "mgmtd to listen")
        p.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "shutdown requested" in log_file.read_text(), 20, "the stop to begin", interval_s=0.002
        )
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0
    finally:
        _stop(p)
    log = log_file.read_text()
    assert "mgmtd stopped" in log, log[-2000:]


def test_a_stop_signal_while_starting_exits_cleanly(tmp_path: Path) -> None:
    """A storage daemon waiting for mgmtd at start died by SIGTERM with nothing logged."""
    (tmp_path / "disk").mkdir()
    cfg = tmp_path / "storage.toml"
    cfg.write_text(
        'node_id = 10001\nlisten_host = "127.0.0.1"\nlisten_port = 0\nmgmtd_addresses = ["127.0.0.1:1"]\n'
        f'target_ids = [101]\ntarget_paths = ["{tmp_path / "disk" / "t101"}"]\n'
        f'[log]\nfile = "{tmp_path / "storage.log"}"\n'
    )
    log_file = tmp_path / "storage.log"
    p = _start([sys.executable, "-m", "fs3.storage", "--config", str(cfg)])
    try:
        # its handlers are in place once its event loop runs; it then waits for mgmtd (30 s)
        wait_for(lambda: log_file.exists() and "transport" in log_file.read_text(), 30, "the start to begin")
        time.sleep(0.5)
        started = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0
        assert time.monotonic() - started < 10
    finally:
        _stop(p)
    log = log_file.read_text()
    assert "shutdown requested by SIGTERM while starting" in log and "stopped before it served" in log, log[
        -2000:
    ]
    assert not (tmp_path / "disk" / "t101").exists()  # nothing made on disk before mgmtd answered
    assert os.listdir(tmp_path / "disk") == []
