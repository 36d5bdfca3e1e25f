"""Prometheus metrics: one registry per process, served at ``/metrics``.

Names follow ``fs3_<service>_<what>_<unit>`` (``fs3_storage_read_bytes_total``,
``fs3_meta_request_seconds``). Each daemon builds its metrics on the process registry returned by
:func:`registry` and calls :func:`serve` once with its configured ``metrics_port``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from fs3.errors import FS3Error, StatusCode

log = logging.getLogger(__name__)

# prometheus_client's counters and histograms would each add a ``*_created`` series (a gauge of
# when the series began), which fs3's own collectors (FUSE, storage targets) do not: a page of
# twice the series, the two kinds inconsistent. Prometheus does not need them.
disable_created_metrics()

_registry: CollectorRegistry | None = None
_lock = threading.Lock()

# Latency buckets from 50 µs to 10 s: RPCs on loopback take tens of microseconds, chain writes and
# fsyncs milliseconds, a stuck dependency seconds.
LATENCY_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]


def latency_buckets(counts: list[int]) -> list[tuple[str, int]]:
    """A histogram sample's cumulative ``(le, count)`` pairs from per-bucket counts over
    LATENCY_BUCKETS (``counts[bisect_left(LATENCY_BUCKETS, seconds)]``, the last one +Inf), for
    collectors that count latencies in plain lists and build samples only when scraped."""
    out, total = [], 0
    for le, n in zip(_LE, list(counts), strict=True):
        total += n
        out.append((le, total))
    return out


def registry() -> CollectorRegistry:
    """The process's registry, created on first use. It is not prometheus_client's global one, so
    library imports never add collectors to a daemon's page; tests that run several services in one
    process pass their own ``reg`` to the constructors below."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = CollectorRegistry(auto_describe=True)
            # the process's CPU, memory and open files against its limit (fs3_process_open_fds,
            # fs3_process_max_fds, fs3_process_resident_memory_bytes...): a daemon out of file
            # descriptors refuses connections without a word (uvloop closes them as it accepts)
            ProcessCollector(namespace="fs3", registry=_registry)
        return _registry


_made: dict[str, Any] = {}
_made_lock = threading.Lock()  # not _lock: what is made takes that one (registry())


def process_wide(key: str, make: Callable[[], Any]) -> Any:
    """This process's one ``make()`` for ``key`` (metrics registered in the process registry),
    made once even when threads ask at once: a second registration of the same names raises
    prometheus_client's DuplicateTimeseries (native clients connecting from several threads)."""
    with _made_lock:
        if key not in _made:
            _made[key] = make()
        return _made[key]


def counter(
    name: str, doc: str, labels: tuple[str, ...] = (), reg: CollectorRegistry | None = None
) -> Counter:
    return Counter(name, doc, labels, registry=reg or registry())


def gauge(name: str, doc: str, labels: tuple[str, ...] = (), reg: CollectorRegistry | None = None) -> Gauge:
    return Gauge(name, doc, labels, registry=reg or registry())


def histogram(
    name: str, doc: str, labels: tuple[str, ...] = (), reg: CollectorRegistry | None = None
) -> Histogram:
    return Histogram(name, doc, labels, registry=reg or registry(), buckets=LATENCY_BUCKETS)


@dataclass(slots=True)
class MetricsServer:
    host: str
    port: int
    _server: object
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


def serve(port: int, host: str = "127.0.0.1", reg: CollectorRegistry | None = None) -> MetricsServer:
    """Serve ``/metrics`` on a background thread; ``port=0`` picks a free port (see ``.port``).

    A port that cannot be bound raises FS3Error(UNAVAILABLE) naming the address."""
    try:
        server, thread = start_http_server(port, addr=host, registry=reg or registry())
    except OSError as e:
        raise FS3Error(
            StatusCode.UNAVAILABLE, f"cannot serve metrics on {host}:{port}: {e.strerror}"
        ) from None
    bound = server.server_address[1]
    log.info("metrics serving host=%s port=%d", host, bound)
    return MetricsServer(host, bound, server, thread)


class KvCommitMetrics:
    """The metadata store's group commit as ``fs3_kv_*`` counters, read from ``stats`` (a store's
    :meth:`fs3.kv.Database.commit_stats`) when scraped; nothing is exported for an engine that
    keeps no counters. Batch size is ``transactions / batches``; commit latency
    ``commit_seconds / batches``; a rising conflict share means callers contend for keys."""

    def __init__(
        self,
        stats: Callable[[], Any],
        reg: CollectorRegistry | None = None,
        space: Callable[[], Any] | None = None,
    ) -> None:
        self._stats = stats
        self._space = space
        (reg or registry()).register(self)

    def collect(self) -> Iterator[Metric]:
        room = self._space() if self._space is not None else None
        if room is not None:
            for name, doc, value in (
                ("fs3_kv_store_used_bytes", "bytes of the metadata store holding data", room.used_bytes),
                (
                    "fs3_kv_store_limit_bytes",
                    "the most the metadata store may hold (map_size)",
                    room.limit_bytes,
                ),
                (
                    "fs3_kv_store_disk_free_bytes",
                    "free bytes of the file system holding the metadata store",
                    room.disk_free_bytes,
                ),
            ):
                yield GaugeMetricFamily(name, doc, value=value)
        st = self._stats()
        if st is None:
            return
        yield CounterMetricFamily(
            "fs3_kv_commit_refused",
            "transactions refused because the store was full (ENOSPC; removals still go through)",
            value=st.refused,
        )
        for name, doc, value in (
            ("fs3_kv_commit_batches", "write transactions the group commit ran", st.batches),
            (
                "fs3_kv_commit_transactions",
                "transactions validated in them, conflicts included",
                st.transactions,
            ),
            ("fs3_kv_commit_conflicts", "transactions refused: a value they read had changed", st.conflicts),
            (
                "fs3_kv_commit_seconds",
                "time in write transactions (validation, writes, data flush)",
                st.commit_seconds,
            ),
            ("fs3_kv_fsyncs", "flushes that made committed batches durable", st.fsyncs),
            ("fs3_kv_fsync_seconds", "time in those flushes", st.fsync_seconds),
        ):
            yield CounterMetricFamily(name, doc, value=value)
