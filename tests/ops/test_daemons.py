"""fs3.cli.daemons: PID files that are trusted only for the right process, and stop_all's
SIGTERM-then-SIGKILL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ops_helpers import wait_for

from fs3.cli.daemons import Daemon, is_running, stop_all

pytestmark = pytest.mark.timeout(60)

STUBBORN = (
    "import signal, time, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)  # MARK"
)
POLITE = "import time; print('ready', flush=True); time.sleep(60)  # MARK"


def daemon(tmp: Path, name: str, code: str, mark: str) -> Daemon:
    argv = [sys.executable, "-c", code.replace("MARK", mark)]
    return Daemon(name, argv, mark, tmp / f"{name}.pid", tmp / f"{name}.log")


def ready(d: Daemon) -> bool:
    # a line of its own: the log's header line quotes the command, 'ready' included
    return d.log_file.exists() and "ready" in d.log_file.read_text().splitlines()


def test_sigterm_then_sigkill(tmp_path: Path) -> None:
    polite = daemon(tmp_path, "polite", POLITE, "mark-polite")
    stubborn = daemon(tmp_path, "stubborn", STUBBORN, "mark-stubborn")
    try:
        for d in (polite, stubborn):
            d.start()
            wait_for(lambda d=d: ready(d), 20, f"{d.name} to start")
            assert d.pid() == d.popen.pid
        killed = stop_all([polite, stubborn], timeout_s=1.0)
        assert killed == ["stubborn"]
        assert polite.pid() is None and stubborn.pid() is None
        assert not polite.pid_file.exists() and not stubborn.pid_file.exists()
    finally:
        for d in (polite, stubborn):
            if d.popen is not None and d.popen.poll() is None:
                d.popen.kill()
                d.popen.wait(timeout=10)


def test_a_reused_pid_is_not_trusted(tmp_path: Path) -> None:
    other = daemon(tmp_path, "other", POLITE, "mark-other")
    other.start()
    try:
        wait_for(lambda: ready(other), 20, "the other process to start")
        # a PID file naming a live process that is not the daemon (as after a reboot)
        mine = daemon(tmp_path, "mine", POLITE, "mark-mine")
        mine.pid_file.write_text(f"{other.popen.pid}\n")
        assert mine.pid() is None
        assert stop_all([mine], timeout_s=0.5) == []
        assert is_running(other.popen.pid, "mark-other"), "stop_all signalled a stranger"
    finally:
        other.popen.kill()
        other.popen.wait(timeout=10)


def test_last_error_is_the_last_line(tmp_path: Path) -> None:
    d = daemon(
        tmp_path, "failing", "import sys; sys.stderr.write('log\\nfs3 x: it broke\\n'); sys.exit(1)", "m"
    )
    d.start()
    assert d.popen.wait(timeout=20) == 1
    assert d.exited() == 1 and d.last_error() == "fs3 x: it broke"


def test_a_daemon_is_known_by_its_config_file_however_its_path_is_spelled(tmp_path: Path) -> None:
    """fs3 local down --dir ../run (or through a symlink) took the cluster's daemons, started with
    another spelling of their config paths, for stopped: it removed their PID files and left them
    running."""
    import subprocess

    real = tmp_path / "real"
    real.mkdir()
    cfg = real / "meta.toml"
    cfg.write_text("")
    (tmp_path / "link").symlink_to(real)
    other = tmp_path / "other.toml"
    other.write_text("")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "--config",
            str(tmp_path / "link" / "meta.toml"),
        ]
    )
    try:
        # (until it has exec'd, its command line is this process's)
        wait_for(lambda: is_running(proc.pid, str(cfg)), 20, "the process to run its command")
        assert is_running(proc.pid, str(tmp_path / "real" / ".." / "real" / "meta.toml"))
        assert not is_running(proc.pid, str(other))
        assert not is_running(proc.pid, str(tmp_path / "missing.toml"))
    finally:
        proc.kill()
        proc.wait()


def test_a_local_cluster_directory_has_one_spelling(tmp_path: Path) -> None:
    from fs3.cli.local_cluster import LocalCluster

    (tmp_path / "run").mkdir()
    (tmp_path / "t").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    roots = {
        LocalCluster(p).root for p in (tmp_path / "run", tmp_path / "t" / ".." / "run", tmp_path / "link")
    }
    assert roots == {(tmp_path / "run").resolve()}
