"""Background daemon processes recorded by PID file: start, recognise, wait for, stop.

``fs3 local`` starts daemons that outlive the command that started them, so a later ``fs3 local
down`` (another process) must find them again. Each daemon has a PID file; a PID is only trusted
while ``/proc/<pid>/cmdline`` still contains the daemon's *mark* (its config path or mount point),
so a PID reused by an unrelated process after a reboot is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True)
class Daemon:
    """One background process: ``name`` (file names), ``argv``, and the ``mark`` that identifies it."""

    name: str
    argv: list[str]
    mark: str
    pid_file: Path
    log_file: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen | None = None
    drop_env: frozenset[str] = frozenset()  # variables of this process's environment not passed on

    def pid(self) -> int | None:
        """The recorded PID if that process is alive and is this daemon; None otherwise."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if is_running(pid, self.mark) else None

    def start(self) -> int:
        """Start the process in its own session (so a terminal's ^C does not reach it), output
        appended to the log file; record and return its PID."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            log.write(
                f"----- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode()
            )
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**{k: v for k, v in os.environ.items() if k not in self.drop_env}, **(self.env or {})},
                start_new_session=True,
            )
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(f"{self.popen.pid}\n")
        os.replace(tmp, self.pid_file)
        return self.popen.pid

    def exited(self) -> int | None:
        """The exit status if this command started the process and it has ended."""
        return self.popen.poll() if self.popen is not None else None

    def last_error(self) -> str:
        """The last non-empty line of the log: daemons print one line saying why they stopped."""
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        for line in reversed(lines):
            if line.strip() and not line.startswith("-----"):
                return line.strip()
        return ""


def _state(pid: int) -> str | None:
    """The one-letter process state from /proc, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def is_running(pid: int, mark: str) -> bool:
    """Whether ``pid`` is a live (not zombie) process whose command line contains ``mark``, or an
    argument that names the same file as ``mark`` (a config path spelled otherwise: through a
    symlink, or with ``..``; taken for no daemon of its cluster, its PID file was removed and the
    daemon left running)."""
    if _state(pid) in (None, "Z", "X"):
        return False
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if mark in raw.replace(b"\0", b" ").decode(errors="replace"):
        return True
    try:
        marked = os.stat(mark)
    except OSError:
        return False  # not a file: only the text can match
    for arg in raw.split(b"\0"):
        if arg.startswith(b"/"):
            try:
                if os.path.samestat(os.stat(arg), marked):
                    return True
            except OSError:
                continue
    return False


def stop_all(daemons: Sequence[Daemon], timeout_s: float = 20.0) -> list[str]:
    """SIGTERM every running daemon, wait up to ``timeout_s`` for all of them, then SIGKILL the rest.

    Returns the names of the daemons that had to be killed. PID files of stopped daemons are removed.
    """
    running = {d.name: (d, pid) for d in daemons if (pid := d.pid()) is not None}
    for _d, pid in running.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while running and time.monotonic() < deadline:
        for name, (d, pid) in list(running.items()):
            if d.popen is not None:
                d.popen.poll()  # reap our own children so they do not linger as zombies
            if not is_running(pid, d.mark):
                del running[name]
        if running:
            time.sleep(0.05)
    killed = []
    for name, (_d, pid) in running.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        killed.append(name)
    kill_deadline = time.monotonic() + 10.0
    for _, (d, pid) in running.items():
        while is_running(pid, d.mark) and time.monotonic() < kill_deadline:
            if d.popen is not None:
                d.popen.poll()
            time.sleep(0.02)
    for d in daemons:
        if d.pid() is None:
            d.pid_file.unlink(missing_ok=True)
    return killed
