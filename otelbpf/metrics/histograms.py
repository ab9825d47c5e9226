"""Histograms of finished spans, aggregated by the agent itself, for any protocol's instruments.

What is measured is data (``otelbpf.metrics.instruments.SpanHistogram``,
one definitions module per protocol, e.g. ``otelbpf.metrics.http1``):
``SpanMetrics`` is given ``{protocol id: instruments}`` and, for each
finished span, every instrument of the span's ``protocol`` whose
``select(span)`` is true records ``value(span)`` under the span attributes
the instrument names (absent ones left out). A span whose protocol has no
instruments is ignored. Bucket ``i`` counts values ``<= boundaries[i]``,
the last one the values above the last boundary.

Why not the SDK's MeterProvider: each traced process needs its own Resource
(``service.name``, ``process.pid`` ...), and a MeterProvider is bound to one
Resource, so ``--all`` on a busy node would mean hundreds of providers, each
with its own reader thread and exporter. Aggregating here is cheap (a few
dict lookups and additions per span, measured by
``test_record_cost_per_span`` in tests/test_metrics.py) and
``otelbpf.metrics.encode`` writes the result straight into OTLP protobufs,
one ``ResourceMetrics`` per process.

Cumulative temporality: each series (process, instrument, attribute values)
keeps its ``start_time_unix_nano`` from its first measurement for as long as
it lives.

Bounds, so that an agent tracing everything on a node keeps bounded memory:

* At most ``max_series`` series in total (every process, every instrument).
  Beyond that, a measurement with a new attribute set is folded into its
  process's overflow series for that instrument, whose only attribute is
  ``otel.metric.overflow=true`` (as the SDK's cardinality limit does), and
  counted in ``otelbpf.metrics.overflow``.
* A series that did not change for ``series_ttl_s`` is dropped at the next
  collection (counted in ``otelbpf.metrics.series.expired``); if it comes
  back it starts again from zero with a new start time, which is how
  cumulative consumers see a reset. Processes that exited stop updating
  their series, so this is also what forgets them.
* A pid reused by a new process (the ResourceLookup answers with different
  attributes) starts new series under the new Resource; the old process's
  series are exported once more and then forgotten.

Threads: :meth:`SpanMetrics.record` runs on the pipeline thread,
:meth:`SpanMetrics.collect` on the exporter's. Both take one lock; record
holds it for a few additions, collect only to copy the counts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from otelbpf import semconv as sc
from otelbpf.core.model import AttributeValue, ResourceLookup, SpanKind, SpanRecord
from otelbpf.metrics.instruments import SpanHistogram

_log = logging.getLogger(__name__)

OVERFLOW_ATTRIBUTE = sc.OTEL_METRIC_OVERFLOW
OVERFLOWED = "otelbpf.metrics.overflow"
EXPIRED = "otelbpf.metrics.series.expired"

DEFAULT_MAX_SERIES = 10_000
DEFAULT_SERIES_TTL_S = 3600.0

# A series is a plain list (fastest to update and to copy in CPython):
#   [count, sum, min, max, start_ns, count_at_last_collect, last_change_monotonic, bucket_0 .. bucket_n]
_START, _SEEN, _CHANGED, _BUCKET_0 = 4, 5, 6, 7
#: Key of a process's overflow series: no span attribute value equals its one element.
_OVERFLOW_KEY: tuple[Any, ...] = (object(),)

Table = dict[tuple[Any, ...], list[Any]]


@dataclass(frozen=True, slots=True)
class HistogramPoint:
    """One cumulative histogram series as of a collection."""

    attributes: dict[str, AttributeValue]
    start_ns: int
    count: int
    sum: float
    min: float
    max: float
    #: ``len(boundaries) + 1`` counts; bucket i counts values <= boundary i.
    bucket_counts: tuple[int, ...]


@dataclass(slots=True)
class ProcessHistograms:
    """A process's histograms as of a collection, with its Resource attributes."""

    pid: int
    resource: Mapping[str, AttributeValue]
    #: Each instrument that has series, with its points, in the order the instruments were given.
    histograms: list[tuple[SpanHistogram, list[HistogramPoint]]] = field(default_factory=list)
    #: Per-process gauges not derived from spans (``MetricsExporter.add_process_gauges``):
    #: (name, description, unit, value), e.g. GPU memory reserved.
    gauges: list[tuple[str, str, str, int | float]] = field(default_factory=list)
    #: Per-process cumulative monotonic Sums not derived from spans (``MetricsExporter.add_process_sums``):
    #: (name, description, unit, value), e.g. GPU kernel launches.
    sums: list[tuple[str, str, str, int | float]] = field(default_factory=list)

    def points(self, name: str) -> list[HistogramPoint]:
        """The points of the instrument called ``name`` (none if it has none)."""
        return [point for instrument, points in self.histograms if instrument.name == name for point in points]


@dataclass(slots=True)
class SpanMetricsCollection:
    """What :meth:`SpanMetrics.collect` returns."""

    processes: list[ProcessHistograms]
    #: Measurements folded into overflow series since the previous collection.
    overflowed: int = 0
    #: Series dropped as idle since the previous collection.
    expired: int = 0


def _dict_key(attributes: dict, keys: tuple) -> tuple:
    """A series key: the values of ``keys`` in ``attributes`` (None where absent). Its own
    function so that the compiled build types it (histograms.pxd): C dict lookups, no bound
    ``get`` called per key."""
    return tuple([attributes.get(key) for key in keys])


def _by_kind(groups: tuple) -> dict:
    """``groups`` for each span kind: instruments whose ``select`` is a kind test (``of_kind``)
    kept only under their kind, with no selector left to call; under None, ``groups`` as they are
    (for a kind value that is none of ``SpanKind``'s)."""
    table: dict = {None: groups}
    for kind in SpanKind:
        narrowed = []
        for required, excluded, instruments in groups:
            kept = tuple(
                (index, None if getattr(select, "kind", None) is not None else select, value, keys, boundaries)
                for index, select, value, keys, boundaries in instruments
                if getattr(select, "kind", kind) == kind
            )
            if kept:
                narrowed.append((required, excluded, kept))
        table[int(kind)] = tuple(narrowed)
    return table


class _Process:
    __slots__ = ("pid", "resource", "tables")

    def __init__(self, pid: int, resource: Mapping[str, AttributeValue], instruments: int) -> None:
        self.pid = pid
        self.resource = resource
        #: One table per instrument (by index): attribute values -> series.
        self.tables: list[Table] = [{} for _ in range(instruments)]


class SpanMetrics:
    """Per-process histograms of finished spans, for the instruments of each span's protocol."""

    def __init__(
        self,
        resources: ResourceLookup,
        instruments: Mapping[str, Sequence[SpanHistogram]],
        *,
        max_series: int = DEFAULT_MAX_SERIES,
        series_ttl_s: float | None = DEFAULT_SERIES_TTL_S,
    ) -> None:
        if max_series < 0:
            raise ValueError(f"max_series must be >= 0, got {max_series!r}")
        if series_ttl_s is not None and not series_ttl_s > 0:
            raise ValueError(f"series_ttl_s must be positive or None, got {series_ttl_s!r}")
        #: Every distinct instrument, indexed (an instrument may serve several protocols).
        self._instruments: list[SpanHistogram] = []
        #: protocol -> span kind (None: any other value) -> ((required attribute or "",
        #: excluded attribute or "", ((index, select, value, attribute keys, boundaries), ...)),
        #: ...): what record() iterates, grouped by ``requires`` and ``excludes``; ``select``
        #: is None where the kind decided it.
        self._by_protocol: dict[str, tuple[tuple[str, str, tuple[tuple[int, Any, Any, tuple[str, ...], tuple[float, ...]], ...]], ...]] = {}
        for protocol, definitions in instruments.items():
            groups: dict[tuple[str, str], list] = {}
            for instrument in definitions:
                if instrument not in self._instruments:
                    self._instruments.append(instrument)
                index = self._instruments.index(instrument)
                groups.setdefault((instrument.requires, instrument.excludes), []).append(
                    (index, instrument.select, instrument.value, tuple(instrument.attributes), tuple(instrument.boundaries))
                )
            if groups:
                self._by_protocol[protocol] = _by_kind(
                    tuple((required, excluded, tuple(group)) for (required, excluded), group in groups.items())
                )
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

    @property
    def instruments(self) -> tuple[SpanHistogram, ...]:
        """Every instrument this aggregator records, each once."""
        return tuple(self._instruments)

    # --- hot path -----------------------------------------------------------------

    def record(self, span: SpanRecord) -> None:
        """Add a finished span to the histograms of its protocol's instruments. Never raises."""
        try:
            by_kind = self._by_protocol.get(span.protocol)
            if by_kind is None:
                return
            try:
                groups = by_kind.get(span.kind)
            except TypeError:  # an unhashable kind: every selector decides, as for any odd kind
                groups = None
            if groups is None:
                groups = by_kind[None]
            attributes = span.attributes
            get = attributes.get
            measurements = []
            for required, excluded, instruments in groups:
                if required and required not in attributes:
                    continue
                if excluded and excluded in attributes:
                    continue
                for index, select, value_of, keys, boundaries in instruments:
                    if select is None or select(span):
                        value = value_of(span)
                        bucket = _BUCKET_0 + bisect_left(boundaries, value)
                        key = _dict_key(attributes, keys) if type(attributes) is dict else tuple(map(get, keys))
                        measurements.append((index, key, value, bucket))
            if not measurements:
                return
            pid = span.pid
            resource = self._lookup(pid)
            with self._lock:
                process = self._processes.get(pid)
                if process is None or (process.resource is not resource and process.resource != resource):
                    process = self._new_process(pid, resource)
                tables = process.tables
                for index, key, value, bucket in measurements:
                    table = tables[index]
                    series = table.get(key)
                    if series is None:
                        series = self._new_series(table, key, len(self._instruments[index].boundaries))
                    series[0] += 1
                    series[1] += value
                    if value < series[2]:
                        series[2] = value
                    if value > series[3]:
                        series[3] = value
                    series[bucket] += 1
        except Exception:  # noqa: BLE001 - the hot path must survive anything
            if not self._errors_logged:
                self._errors_logged = True
                _log.exception("could not record span metrics for a span (logged once)")

    def _new_process(self, pid: int, resource: Mapping[str, AttributeValue]) -> _Process:
        """Under the lock: a process slot, retiring the previous owner of the pid."""
        previous = self._processes.get(pid)
        if previous is not None:
            self._retired.append(previous)
            self._series -= _regular_series(previous)
        process = self._processes[pid] = _Process(pid, resource, len(self._instruments))
        return process

    def _new_series(self, table: Table, key: tuple[Any, ...], boundaries: int) -> list[Any]:
        """Under the lock: a new series for ``key``, or the overflow series past the limit."""
        if self._series >= self._max_series:
            self._overflowed += 1
            series = table.get(_OVERFLOW_KEY)
            if series is None:
                series = table[_OVERFLOW_KEY] = _empty_series(boundaries)
            return series
        self._series += 1
        series = table[key] = _empty_series(boundaries)
        return series

    # --- collection (exporter thread) ----------------------------------------------

    def collect(self) -> SpanMetricsCollection:
        """Cumulative state of every live series; expires idle ones. Thread-safe."""
        monotonic = time.monotonic()
        copied: list[tuple[_Process, list[list[tuple[tuple[Any, ...], list[Any]]]]]] = []
        expired = 0
        with self._lock:
            retired, self._retired = self._retired, []
            for process in retired:
                copied.append((process, [_copy(table) for table in process.tables]))
            for pid in list(self._processes):
                process = self._processes[pid]
                expired += sum(self._expire(table, monotonic) for table in process.tables)
                if not any(process.tables):
                    del self._processes[pid]
                    continue
                copied.append((process, [_copy(table) for table in process.tables]))
            overflowed, self._overflowed = self._overflowed, 0
        processes = []
        for process, tables in copied:
            histograms = [
                (instrument, [_point(instrument.attributes, key, series, instrument.fixed_attributes) for key, series in table])
                for instrument, table in zip(self._instruments, tables)
                if table
            ]
            processes.append(ProcessHistograms(process.pid, process.resource, histograms))
        return SpanMetricsCollection(processes, overflowed, expired)

    def _expire(self, table: Table, monotonic: float) -> int:
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


def _empty_series(boundaries: int) -> list[Any]:
    series: list[Any] = [0, 0.0, math.inf, -math.inf, time.time_ns(), 0, time.monotonic()]
    series.extend([0] * (boundaries + 1))
    return series


def _regular_series(process: _Process) -> int:
    return sum(1 for table in process.tables for key in table if key is not _OVERFLOW_KEY)


def _copy(table: Table) -> list[tuple[tuple[Any, ...], list[Any]]]:
    return [(key, series[:]) for key, series in table.items()]


def _point(
    names: Sequence[str], key: tuple[Any, ...], series: list[Any], fixed: Sequence[tuple[str, AttributeValue]] = ()
) -> HistogramPoint:
    if key is _OVERFLOW_KEY:
        attributes: dict[str, AttributeValue] = {OVERFLOW_ATTRIBUTE: True}
    else:
        attributes = {name: value for name, value in zip(names, key) if value is not None}
    if fixed:
        attributes.update(fixed)
    return HistogramPoint(
        attributes=attributes,
        start_ns=series[_START],
        count=series[0],
        sum=series[1],
        min=series[2],
        max=series[3],
        bucket_counts=tuple(series[_BUCKET_0:]),
    )
