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
