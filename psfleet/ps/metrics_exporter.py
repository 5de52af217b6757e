"""A server's Prometheus /metrics: its tables' rows, bytes and request counts.

:meth:`MetricsExporter.start` serves ``http://HOST:PORT/metrics`` (Prometheus text
format) from a thread of the server process, with a registry of its own (several
servers in one process do not mix). Nothing is done per request for it: at each scrape
:class:`ServiceCollector` reads the server's ``Stats`` (rows, bytes, rejected pushes,
request counts, row lifecycle counts, uptime), summed over every share it holds.

Metrics (labels ``table_id`` and ``table``, the table's name, on the per-table ones):

=======================================  =======  ==========================================
name                                     type     meaning
=======================================  =======  ==========================================
``psfleet_server_index``                 gauge    this server's index (-1 when unknown)
``psfleet_server_uptime_seconds``        gauge    seconds since the server started
``psfleet_table_rows``                   gauge    rows held (dense tables: floats held)
``psfleet_table_memory_bytes``           gauge    bytes held: rows and state, key index
``psfleet_table_pulls_total``            counter  pull requests answered
``psfleet_table_pulled_rows_total``      counter  rows answered (dense: floats)
``psfleet_table_pushes_total``           counter  push requests applied
``psfleet_table_pushed_rows_total``      counter  rows pushed (dense: floats)
``psfleet_table_rejected_pushes_total``  counter  pushes refused, label ``reason``
                                                  (``non_finite``: NaN/Inf values)
``psfleet_table_admitted_rows_total``    counter  new keys given a row (accessor
                                                  admission; dense tables: 0)
``psfleet_table_rejected_rows_total``    counter  sightings of new keys not given a row
``psfleet_table_evicted_rows_total``     counter  rows removed to stay under ``max_rows``
``psfleet_table_deleted_rows_total``     counter  rows removed by shrink
``psfleet_table_spilled_rows_total``     counter  rows moved to the disk tier
``psfleet_table_promoted_rows_total``    counter  rows moved from the disk tier to memory
``psfleet_table_disk_rows``              gauge    rows on the disk tier (in ``rows`` too)
``psfleet_table_disk_bytes``             gauge    bytes of the disk tier's files
=======================================  =======  ==========================================

plus prometheus_client's ``process_*`` metrics (resident memory, CPU seconds, open
files) on Linux. The port comes from ``PSFLEET_METRICS_PORT`` (:func:`metrics_port_from_env`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_wsgi_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from psfleet import env
from psfleet.errors import ConfigError
from psfleet.rpc import messages as msg

__all__ = ["MetricsExporter", "ServiceCollector", "StatsSource", "metrics_port_from_env"]

logger = logging.getLogger(__name__)

_TABLE_LABELS = ("table_id", "table")

#: TableStats fields counted as ``psfleet_table_<field>_rows_total``, with their help.
_LIFECYCLE_COUNTERS = (
    ("admitted", "New keys given a row (accessor admission; dense tables: 0)"),
    ("rejected", "Sightings of new keys not given a row (admission or a full shard)"),
    ("evicted", "Rows removed to stay under accessor.max_rows"),
    ("deleted", "Rows removed by shrink"),
    ("spilled", "Rows moved to the disk tier (accessor.memory_rows)"),
    ("promoted", "Rows moved from the disk tier back to memory"),
)


def metrics_port_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """The metrics port ``PSFLEET_METRICS_PORT`` asks for: 0 (the default) a free port,
    None when it is ``off``.

    Raises:
        ConfigError: neither ``off`` nor an integer in 0..65535 (names the variable).
    """
    raw = (env.read("PSFLEET_METRICS_PORT", environ) or "0").strip()
    if raw.lower() == "off":
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise ConfigError(f"PSFLEET_METRICS_PORT: {raw!r} is not a port; give 0..65535 "
                          "(0: a free port) or off")
    return int(raw)


class StatsSource(Protocol):
    """What the metrics are read from: a ``TableService``, or a server's
    ``ReplicaHost`` (its ``host_view``: every share it holds)."""

    def Stats(self, request: msg.StatsRequest) -> msg.StatsResponse:  # noqa: N802
        ...


class ServiceCollector(Collector):
    """Reads a server's stats and counters when scraped. Thread safe.

    Args:
        service: the server's tables (its ``Stats`` is called with ``host_view``).
        server_index: reported as ``psfleet_server_index`` (-1: unknown).
    """

    def __init__(self, service: StatsSource, server_index: int) -> None:
        self._service = service
        self._server_index = server_index

    def collect(self) -> Iterator[Metric]:
        """Yield every metric, read now (one ``Stats`` call)."""
        stats = self._service.Stats(msg.StatsRequest(host_view=True))
        yield GaugeMetricFamily("psfleet_server_index", "This server's index (-1: unknown)",
                                value=self._server_index)
        yield GaugeMetricFamily("psfleet_server_uptime_seconds",
                                "Seconds since the server started",
                                value=stats.uptime_s)
        rows = GaugeMetricFamily("psfleet_table_rows",
                                 "Rows held (dense tables: floats held)", labels=_TABLE_LABELS)
        memory = GaugeMetricFamily("psfleet_table_memory_bytes",
                                   "Bytes held: row matrices with optimizer state, key index",
                                   labels=_TABLE_LABELS)
        disk_rows = GaugeMetricFamily("psfleet_table_disk_rows",
                                      "Rows on the disk tier (counted in rows too)",
                                      labels=_TABLE_LABELS)
        disk_bytes = GaugeMetricFamily("psfleet_table_disk_bytes",
                                       "Bytes of the disk tier's files", labels=_TABLE_LABELS)
        pulls = CounterMetricFamily("psfleet_table_pulls", "Pull requests answered",
                                    labels=_TABLE_LABELS)
        pulled = CounterMetricFamily("psfleet_table_pulled_rows",
                                     "Rows answered to pulls (dense tables: floats)",
                                     labels=_TABLE_LABELS)
        pushes = CounterMetricFamily("psfleet_table_pushes", "Push requests applied",
                                     labels=_TABLE_LABELS)
        pushed = CounterMetricFamily("psfleet_table_pushed_rows",
                                     "Rows pushed (dense tables: floats)",
                                     labels=_TABLE_LABELS)
        rejected = CounterMetricFamily("psfleet_table_rejected_pushes",
                                       "Pushes refused whole, by reason",
                                       labels=(*_TABLE_LABELS, "reason"))
        lifecycle = {field: CounterMetricFamily(f"psfleet_table_{field}_rows", text,
                                                labels=_TABLE_LABELS)
                     for field, text in _LIFECYCLE_COUNTERS}
        for table in stats.tables:
            labels = [str(table.table_id), table.name]
            for field, family in lifecycle.items():
                family.add_metric(labels, getattr(table, field))
            rows.add_metric(labels, table.rows)
            memory.add_metric(labels, table.memory_bytes)
            disk_rows.add_metric(labels, table.disk_rows)
            disk_bytes.add_metric(labels, table.disk_bytes)
            pulls.add_metric(labels, table.pulls)
            pulled.add_metric(labels, table.pulled_rows)
            pushes.add_metric(labels, table.pushes)
            pushed.add_metric(labels, table.pushed_rows)
            rejected.add_metric([*labels, "non_finite"], table.rejected_non_finite)
        yield from (rows, memory, disk_rows, disk_bytes, pulls, pulled, pushes, pushed, rejected)
        yield from lifecycle.values()


class MetricsExporter:
    """A running /metrics HTTP endpoint; :meth:`close` stops it and frees its port.

    Attributes:
        host: the address bound (the server's host).
        port: the port bound (the OS's choice when 0 was asked).
    """

    def __init__(self, httpd: WSGIServer, thread: threading.Thread, host: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host = host
        self.port: int = httpd.server_port
        self._closed = False

    @property
    def endpoint(self) -> str:
        """``host:port`` of the endpoint."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL to scrape: ``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @classmethod
    def start(cls, service: StatsSource, host: str, port: int,
              server_index: int = -1) -> MetricsExporter:
        """Serve ``service``'s metrics on ``host:port`` from a daemon thread; returns at
        once, listening.

        Args:
            service: the server's tables (a ``ReplicaHost``: every share it holds).
            host: address to bind (the gRPC server's host).
            port: port to bind; 0 lets the OS choose (read :attr:`port`).
            server_index: this server's index (-1: unknown).

        Raises:
            ConfigError: the port cannot be bound (names it and PSFLEET_METRICS_PORT).
        """
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ServiceCollector(service, server_index))
        ProcessCollector(registry=registry)
        try:
            httpd, thread = start_wsgi_server(port, host, registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot bind the metrics endpoint {host}:{port}: {exc}. Set "
                "PSFLEET_METRICS_PORT to 0 (a free port; one fixed port serves one server "
                "per host) or off") from None
        thread.name = f"psfleet-metrics-{httpd.server_port}"
        exporter = cls(httpd, thread, host)
        logger.info("metrics of server %d on %s", server_index, exporter.url)
        return exporter

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the socket; waits up to ``timeout_s`` for the thread.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout_s)
