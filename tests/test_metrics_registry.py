"""The /metrics endpoint serves the process registry in Prometheus text format."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from fs3 import metrics
from fs3.errors import FS3Error


def test_scrape_shows_counters_and_histograms():
    reg = CollectorRegistry()
    c = metrics.counter("fs3_test_requests_total", "requests", ("op",), reg=reg)
    h = metrics.histogram("fs3_test_request_seconds", "latency", ("op",), reg=reg)
    c.labels("stat").inc(3)
    h.labels("stat").observe(0.002)
    srv = metrics.serve(0, reg=reg)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10).read().decode()
    finally:
        srv.close()
    assert 'fs3_test_requests_total{op="stat"} 3.0' in body
    assert 'fs3_test_request_seconds_bucket{le="0.0025",op="stat"} 1.0' in body
    # no *_created series beside them (fs3's own collectors have none either)
    assert "_created" not in body, body


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(FS3Error, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            metrics.serve(port, reg=CollectorRegistry())


def test_process_registry_is_one_object():
    assert metrics.registry() is metrics.registry()


def test_clients_made_by_many_threads_at_once_register_their_metrics_once(monkeypatch):
    """Each FileSystem.connect makes a transport, whose counter the first one registers in the
    process registry: threads connecting at once each registered it, and all but one failed with
    prometheus_client's DuplicateTimeseries."""
    import sys
    import threading

    from fs3.net import transport_select

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave between the check and the registration
    try:
        for _ in range(20):
            monkeypatch.setattr(metrics, "_registry", CollectorRegistry(auto_describe=True))
            monkeypatch.setattr(metrics, "_made", {}, raising=False)
            monkeypatch.setattr(transport_select, "_default_metrics", None, raising=False)
            start = threading.Barrier(32)
            made, errors = [], []

            def connect(start: threading.Barrier, made: list, errors: list) -> None:
                start.wait()
                try:
                    made.append(transport_select.make_transport("tcp"))
                except Exception as e:
                    errors.append(e)

            threads = [threading.Thread(target=connect, args=(start, made, errors)) for _ in range(32)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[:3]
            assert len(made) == 32
    finally:
        sys.setswitchinterval(old_interval)


_NEAR_LIMIT = """
import asyncio, logging, os, resource, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
from prometheus_client import generate_latest
from fs3 import daemon, metrics

async def main():
    used = len(os.listdir("/proc/self/fd")) - 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + 20, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    said = []
    logging.getLogger("fs3.daemon").addHandler(logging.Handler())
    logging.getLogger("fs3.daemon").handlers[-1].emit = lambda r: said.append(r.levelname)

    async def until(level):
        for _ in range(600):  # each check is 0.05 s apart: up to 30 s on a loaded machine
            if level in said:
                return
            await asyncio.sleep(0.05)

    watching = asyncio.create_task(daemon.watch_open_files(0.05))
    await asyncio.sleep(0.3)
    print("OPENING", flush=True)
    files = [open(os.devnull) for _ in range(18)]
    await until("WARNING")
    print(generate_latest(metrics.registry()).decode(), flush=True)
    for f in files:
        f.close()
    await until("INFO")
    watching.cancel()

asyncio.run(main())
"""


def test_a_daemon_says_when_its_open_files_near_their_limit() -> None:
    """Out of file descriptors, meta refused connections without a word (uvloop closes them as it
    accepts them): clients waited out their deadline and the operator had nothing to see. A
    daemon now warns near the limit, and exports its open files against it."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NEAR_LIMIT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    before, after = r.stdout.split("OPENING", 1)
    assert "open files near the limit" not in before, r.stdout
    assert "WARNING open files near the limit" in after and "LimitNOFILE" in after, r.stdout
    assert "INFO open files below the limit again" in after.split("WARNING", 1)[1], r.stdout
    gauges = {
        line.split()[0]: float(line.split()[1])
        for line in after.splitlines()
        if line.startswith(("fs3_process_open_fds", "fs3_process_max_fds"))
    }
    assert gauges["fs3_process_open_fds"] >= 0.9 * gauges["fs3_process_max_fds"] > 0, gauges
