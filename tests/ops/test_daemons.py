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
