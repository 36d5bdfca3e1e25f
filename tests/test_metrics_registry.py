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
