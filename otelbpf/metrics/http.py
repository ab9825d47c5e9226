"""HTTP request-duration histograms, aggregated by the agent itself.

Why not the SDK's MeterProvider: each traced process needs its own Resource
(``service.name``, ``process.pid`` ...), and a MeterProvider is bound to one
Resource, so ``--all`` on a busy node would mean hundreds of providers, each
with its own reader thread and exporter. Aggregating here is cheap (one dict
lookup and a few additions per span, measured by
``test_record_cost_per_span`` in tests/test_metrics.py) and
``otelbpf.metrics.encode`` writes the result straight into OTLP protobufs,
one ``ResourceMetrics`` per process.

What is recorded, per the HTTP metrics semantic conventions:

* ``http.server.request.duration`` (SERVER spans) and
  ``http.client.request.duration`` (CLIENT spans), unit ``s``, explicit
  bucket boundaries as the conventions advise (:data:`DURATION_BOUNDARIES`);
  bucket ``i`` counts values ``<= DURATION_BOUNDARIES[i]``, the last one the
  values above the last boundary.
* Attributes copied from the span when present: :data:`SERVER_ATTRIBUTES`,
  :data:`CLIENT_ATTRIBUTES`. ``server.address``/``server.port`` are opt-in
  for server metrics and left out; ``url.path``, ``url.full`` and peer
  addresses never become metric attributes (unbounded cardinality).
* Cumulative temporality: each series (process, metric, attribute values)
  keeps its ``start_time_unix_nano`` from its first measurement for as long
  as it lives.

Bounds, so that an agent tracing everything on a node keeps bounded memory:

* At most ``max_series`` series in total (every process, both metrics).
  Beyond that, a measurement with a new attribute set is folded into its
  process's overflow series, whose only attribute is
  ``otel.metric.overflow=true`` (as the SDK's cardinality limit does), and
  counted in ``otelbpf.metrics.overflow``. There is at most one overflow
  series per process and metric.
* A series that did not change for ``series_ttl_s`` is dropped at the next
  collection (counted in ``otelbpf.metrics.series.expired``); if it comes
  back it starts again from zero with a new start time, which is how
  cumulative consumers see a reset. Processes that exited stop updating
  their series, so this is also what forgets them.
* A pid reused by a new process (the ResourceLookup answers with different
  attributes) starts new series under the new Resource; the old process's
  series are exported once more and then forgotten.

Threads: :meth:`HttpMetrics.record` runs on the pipeline thread,
:meth:`HttpMetrics.collect` on the exporter's. Both take one lock; record
holds it for a few additions, collect only to copy the counts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Mapping

from otelbpf.model import AttributeValue, ResourceLookup, SpanRecord

_log = logging.getLogger(__name__)

SERVER_DURATION = "http.server.request.duration"
CLIENT_DURATION = "http.client.request.duration"
SERVER_DURATION_DESCRIPTION = "Duration of HTTP server requests."
CLIENT_DURATION_DESCRIPTION = "Duration of HTTP client requests."
DURATION_UNIT = "s"

#: Explicit bucket boundaries advised by the semantic conventions for both metrics.
DURATION_BOUNDARIES: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip

#: Span attributes copied onto ``http.server.request.duration`` (in this order).
SERVER_ATTRIBUTES: tuple[str, ...] = (
    "http.request.method",
    "http.response.status_code",
    "http.route",
    "error.type",
    "network.protocol.name",
    "network.protocol.version",
    "url.scheme",
)
#: Span attributes copied onto ``http.client.request.duration`` (in this order).
CLIENT_ATTRIBUTES: tuple[str, ...] = (
    "http.request.method",
    "http.response.status_code",
    "error.type",
    "network.protocol.name",
    "network.protocol.version",
    "server.address",
    "server.port",
    "url.scheme",
)

OVERFLOW_ATTRIBUTE = "otel.metric.overflow"
OVERFLOWED = "otelbpf.metrics.overflow"
EXPIRED = "otelbpf.metrics.series.expired"

DEFAULT_MAX_SERIES = 10_000
DEFAULT_SERIES_TTL_S = 3600.0

# A series is a plain list (fastest to update and to copy in CPython):
#   [count, sum, min, max, bucket_0 .. bucket_14, start_ns, count_at_last_collect, last_change_monotonic]
_BUCKETS = len(DURATION_BOUNDARIES) + 1
_START = 4 + _BUCKETS  # 19
_SEEN = _START + 1
_CHANGED = _START + 2
#: Key of a process's overflow series; no attribute tuple has length 1.
_OVERFLOW_KEY: tuple[Any, ...] = (OVERFLOW_ATTRIBUTE,)


@dataclass(frozen=True, slots=True)
class HistogramPoint:
    """One cumulative histogram series as of a collection."""

    attributes: dict[str, AttributeValue]
    start_ns: int
    count: int
    sum: float
    min: float
    max: float
    #: ``len(DURATION_BOUNDARIES) + 1`` counts; bucket i counts values <= boundary i.
    bucket_counts: tuple[int, ...]


@dataclass(slots=True)
class ProcessHistograms:
    """A process's histograms as of a collection, with its Resource attributes."""

    pid: int
    resource: Mapping[str, AttributeValue]
    server: list[HistogramPoint] = field(default_factory=list)
    client: list[HistogramPoint] = field(default_factory=list)


@dataclass(slots=True)
class HttpCollection:
    """What :meth:`HttpMetrics.collect` returns."""

    processes: list[ProcessHistograms]
    #: Measurements folded into overflow series since the previous collection.
    overflowed: int = 0
    #: Series dropped as idle since the previous collection.
    expired: int = 0


class _Process:
    __slots__ = ("pid", "resource", "server", "client")

    def __init__(self, pid: int, resource: Mapping[str, AttributeValue]) -> None:
        self.pid = pid
        self.resource = resource
        self.server: dict[tuple[Any, ...], list[Any]] = {}
        self.client: dict[tuple[Any, ...], list[Any]] = {}


class HttpMetrics:
    """Per-process HTTP duration histograms fed with finished spans."""

    def __init__(
        self,
        resources: ResourceLookup,
        *,
        max_series: int = DEFAULT_MAX_SERIES,
        series_ttl_s: float | None = DEFAULT_SERIES_TTL_S,
    ) -> None:
        if max_series < 0:
            raise ValueError(f"max_series must be >= 0, got {max_series!r}")
        if series_ttl_s is not None and not series_ttl_s > 0:
            raise ValueError(f"series_ttl_s must be positive or None, got {series_ttl_s!r}")
        self._lookup = resources.attributes
        self._max_series = max_series
        self._ttl_s = series_ttl_s
        self._lock = threading.Lock()
        self._processes: dict[int, _Process] = {}
        #: Processes replaced by a new one with the same pid: exported once more, then forgotten.
        self._retired: list[_Process] = []
        self._series = 0  # regular (non-overflow) series alive
        self._overflowed = 0
        self._errors_logged = False

    # --- hot path -----------------------------------------------------------------

    def record(self, span: SpanRecord) -> None:
        """Add a finished span's duration to its histogram. Never raises."""
        try:
            kind = span.kind
            get = span.attributes.get
            if kind == 2:  # SpanKind.SERVER
                server = True
                key: tuple[Any, ...] = (
                    get("http.request.method"),
                    get("http.response.status_code"),
                    get("http.route"),
                    get("error.type"),
                    get("network.protocol.name"),
                    get("network.protocol.version"),
                    get("url.scheme"),
                )
            elif kind == 3:  # SpanKind.CLIENT
                server = False
                key = (
                    get("http.request.method"),
                    get("http.response.status_code"),
                    get("error.type"),
                    get("network.protocol.name"),
                    get("network.protocol.version"),
                    get("server.address"),
                    get("server.port"),
                    get("url.scheme"),
                )
            else:
                return
            duration = (span.end_ns - span.start_ns) / 1e9
            if not duration > 0.0:
                duration = 0.0
            bucket = 4 + bisect_left(DURATION_BOUNDARIES, duration)
            pid = span.pid
            resource = self._lookup(pid)
            with self._lock:
                process = self._processes.get(pid)
                if process is None or (process.resource is not resource and process.resource != resource):
                    process = self._new_process(pid, resource)
                table = process.server if server else process.client
                series = table.get(key)
                if series is None:
                    series = self._new_series(table, key)
                series[0] += 1
                series[1] += duration
                if duration < series[2]:
                    series[2] = duration
                if duration > series[3]:
                    series[3] = duration
                series[bucket] += 1
        except Exception:  # noqa: BLE001 - the hot path must survive anything
            if not self._errors_logged:
                self._errors_logged = True
                _log.exception("could not record HTTP metrics for a span (logged once)")

    def _new_process(self, pid: int, resource: Mapping[str, AttributeValue]) -> _Process:
        """Under the lock: a process slot, retiring the previous owner of the pid."""
        previous = self._processes.get(pid)
        if previous is not None:
            self._retired.append(previous)
            self._series -= _regular_series(previous)
        process = self._processes[pid] = _Process(pid, resource)
        return process

    def _new_series(self, table: dict[tuple[Any, ...], list[Any]], key: tuple[Any, ...]) -> list[Any]:
        """Under the lock: a new series for ``key``, or the overflow series past the limit."""
        if self._series >= self._max_series:
            self._overflowed += 1
            series = table.get(_OVERFLOW_KEY)
            if series is None:
                series = table[_OVERFLOW_KEY] = _empty_series()
            return series
        self._series += 1
        series = table[key] = _empty_series()
        return series

    # --- collection (exporter thread) ----------------------------------------------

    def collect(self) -> HttpCollection:
        """Cumulative state of every live series; expires idle ones. Thread-safe."""
        monotonic = time.monotonic()
        copied: list[tuple[_Process, list[tuple[tuple[Any, ...], list[Any]]], list[tuple[tuple[Any, ...], list[Any]]]]]
        copied = []
        expired = 0
        with self._lock:
            retired, self._retired = self._retired, []
            for process in retired:
                copied.append((process, _copy(process.server), _copy(process.client)))
            for pid in list(self._processes):
                process = self._processes[pid]
                expired += self._expire(process.server, monotonic) + self._expire(process.client, monotonic)
                if not process.server and not process.client:
                    del self._processes[pid]
                    continue
                copied.append((process, _copy(process.server), _copy(process.client)))
            overflowed, self._overflowed = self._overflowed, 0
        processes = [
            ProcessHistograms(
                process.pid,
                process.resource,
                [_point(SERVER_ATTRIBUTES, key, series) for key, series in server],
                [_point(CLIENT_ATTRIBUTES, key, series) for key, series in client],
            )
            for process, server, client in copied
        ]
        return HttpCollection(processes, overflowed, expired)

    def _expire(self, table: dict[tuple[Any, ...], list[Any]], monotonic: float) -> int:
        """Under the lock: note which series changed; drop those idle for longer than the TTL."""
        expired = 0
        for key, series in list(table.items()):
            if series[0] != series[_SEEN]:
                series[_SEEN] = series[0]
                series[_CHANGED] = monotonic
            elif self._ttl_s is not None and monotonic - series[_CHANGED] >= self._ttl_s:
                del table[key]
                if key is not _OVERFLOW_KEY:
                    self._series -= 1
                expired += 1
        return expired

    @property
    def series_count(self) -> int:
        """Regular series alive (overflow series not included)."""
        return self._series

    @property
    def max_series(self) -> int:
        return self._max_series


def _empty_series() -> list[Any]:
    series: list[Any] = [0, 0.0, math.inf, -math.inf]
    series.extend([0] * _BUCKETS)
    series.extend((time.time_ns(), 0, time.monotonic()))
    return series


def _regular_series(process: _Process) -> int:
    return sum(1 for table in (process.server, process.client) for key in table if key is not _OVERFLOW_KEY)


def _copy(table: dict[tuple[Any, ...], list[Any]]) -> list[tuple[tuple[Any, ...], list[Any]]]:
    return [(key, series[:_SEEN]) for key, series in table.items()]


def _point(names: tuple[str, ...], key: tuple[Any, ...], series: list[Any]) -> HistogramPoint:
    if key is _OVERFLOW_KEY:
        attributes: dict[str, AttributeValue] = {OVERFLOW_ATTRIBUTE: True}
    else:
        attributes = {name: value for name, value in zip(names, key) if value is not None}
    return HistogramPoint(
        attributes=attributes,
        start_ns=series[_START],
        count=series[0],
        sum=series[1],
        min=series[2],
        max=series[3],
        bucket_counts=tuple(series[4:_START]),
    )


__all__ = [
    "CLIENT_ATTRIBUTES",
    "CLIENT_DURATION",
    "DURATION_BOUNDARIES",
    "HistogramPoint",
    "HttpCollection",
    "HttpMetrics",
    "OVERFLOW_ATTRIBUTE",
    "ProcessHistograms",
    "SERVER_ATTRIBUTES",
    "SERVER_DURATION",
]
