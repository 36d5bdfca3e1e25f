"""Real fs3-meta processes for tests: started over one lmdb directory, each killed by PID at teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class MetaProc:
    node_id: int
    popen: subprocess.Popen
    port_file: Path
    log_path: Path
    port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class MetaProcesses:
    """Starts ``python -m fs3.meta`` processes sharing ``tmp/kv``; :meth:`cleanup` kills them all."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[MetaProc] = []

    def write_config(self, node_id: int, extra: str = "") -> Path:
        path = self.tmp / f"meta-{node_id}.toml"
        path.write_text(
            f"node_id = {node_id}\nlisten_port = 0\nmgmtd_addresses = []\nauthenticate = false\n"
            f"gc_interval_s = 0.2\n{extra}\n"
            f'[kv]\nengine = "lmdb"\npath = "{self.tmp / "kv"}"\nmap_size = 268435456\n'
        )
        return path

    def start(self, node_id: int, extra: str = "", config: Path | None = None) -> MetaProc:
        cfg = config or self.write_config(node_id, extra)
        port_file = self.tmp / f"meta-{node_id}.port"
        port_file.unlink(missing_ok=True)
        log_path = self.tmp / f"meta-{node_id}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "fs3.meta", "--config", str(cfg), "--port-file", str(port_file)],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = MetaProc(node_id, popen, port_file, log_path)
        self.procs.append(proc)
        return proc

    def wait_ready(self, proc: MetaProc, timeout_s: float = 20.0) -> MetaProc:
        """Poll for the port file the daemon writes once it serves."""
        deadline = time.monotonic() + timeout_s
        while not proc.port_file.exists():
            if proc.popen.poll() is not None:
                raise AssertionError(f"meta {proc.node_id} exited {proc.popen.returncode}:\n{proc.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"meta {proc.node_id} not ready in {timeout_s}s:\n{proc.log()}")
            time.sleep(0.02)
        proc.port = int(proc.port_file.read_text())
        return proc

    def cleanup(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
