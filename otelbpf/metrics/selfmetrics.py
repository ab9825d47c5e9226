"""The agent's own metrics: its ``Counters`` as Sums, and gauges, under the agent's Resource.

Every ``otelbpf.*`` counter (otelbpf.core.selfmetrics) becomes a monotonic
cumulative Sum whose start time is the exporter's start. A counter's label
becomes one data point attribute, whose key depends on the counter family
(:func:`label_key`):

=====================================================  ============  ===========================
counters                                               attribute     values
=====================================================  ============  ===========================
``otelbpf.export.spans|dropped|failures``              ``sink``      ``otlp``, ``jsonfile``, ...
``otelbpf.metrics.exports``, ``...export.failures``    ``sink``      ``otlp-metrics``, ...
``otelbpf.exchanges.incomplete``                       ``reason``    ``connection_closed``, ...
``otelbpf.parse.errors``                               ``protocol``  ``http1``, ...
anything else with a label                             ``label``
=====================================================  ============  ===========================

Gauges report current state through callables the caller provides, e.g.
``{"otelbpf.connections.open": lambda: len(pipeline.table)}``.

The Resource (:func:`agent_resource_attributes`) is the agent process's:
``service.name=otelbpf``, its version, ``service.instance.id`` (random per
run, so that agents on different nodes never make the same series),
``host.name``, ``process.pid``, ``container.id``/``k8s.pod.uid`` from its
own cgroup when it runs in one, then the agent's OTEL_RESOURCE_ATTRIBUTES
and OTEL_SERVICE_NAME.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping

import otelbpf
from otelbpf import semconv as sc
from otelbpf.core.model import AttributeValue
from otelbpf.core.selfmetrics import DESCRIPTIONS, Counters
from otelbpf.host import procfs
from otelbpf.host.resource_ids import container_ids, node_host_name
from otelbpf.host.resources import parse_resource_attributes
from otelbpf.metrics.histograms import EXPIRED, OVERFLOWED

_log = logging.getLogger(__name__)

EXPORTS = "otelbpf.metrics.exports"
EXPORT_FAILURES = "otelbpf.metrics.export.failures"
SERIES = "otelbpf.metrics.series"
OPEN_CONNECTIONS = "otelbpf.connections.open"

#: Counters this package adds to the agent's ``Counters``.
METRICS_DESCRIPTIONS: dict[str, str] = {
    OVERFLOWED: "span metric measurements folded into an overflow series (otel.metric.overflow=true): series limit reached",
    EXPIRED: "span metric series dropped after being idle for the series TTL",
    EXPORTS: "metric export requests delivered",
    EXPORT_FAILURES: "metric export requests that failed (not retried: the next export carries the cumulative values)",
}
#: Gauges the exporter knows descriptions and units for.
GAUGE_DESCRIPTIONS: dict[str, tuple[str, str]] = {
    OPEN_CONNECTIONS: ("connections currently tracked", "{connection}"),
    SERIES: ("span metric series currently kept (overflow series not included)", "{series}"),
}

_LABEL_KEYS: dict[str, str] = {
    "otelbpf.exchanges.incomplete": "reason",
    "otelbpf.parse.errors": "protocol",
    EXPORTS: "sink",
    EXPORT_FAILURES: "sink",
    "otelbpf.profiles.cpu_time": "stage",
}
_UNITS: dict[str, str] = {
    "otelbpf.profiles.cpu_time": "us",
    "otelbpf.parse.errors": "{error}",
    "otelbpf.export.failures": "{attempt}",
    OVERFLOWED: "{measurement}",
    EXPIRED: "{series}",
    EXPORTS: "{request}",
    EXPORT_FAILURES: "{request}",
}
_UNIT_PREFIXES: tuple[tuple[str, str], ...] = (
    ("otelbpf.connections.", "{connection}"),
    ("otelbpf.exchanges.", "{exchange}"),
    ("otelbpf.spans.", "{span}"),
    ("otelbpf.export.", "{span}"),
    ("otelbpf.association.", "{span}"),
)


def label_key(name: str) -> str:
    """The data point attribute key that carries the label of counter ``name``."""
    key = _LABEL_KEYS.get(name)
    if key is not None:
        return key
    if name.startswith("otelbpf.export."):
        return "sink"
    return "label"


def unit_of(name: str) -> str:
    unit = _UNITS.get(name)
    if unit is not None:
        return unit
    for prefix, prefix_unit in _UNIT_PREFIXES:
        if name.startswith(prefix):
            return prefix_unit
    return "{event}"


def description_of(name: str) -> str:
    return DESCRIPTIONS.get(name) or METRICS_DESCRIPTIONS.get(name) or GAUGE_DESCRIPTIONS.get(name, ("", ""))[0]


def agent_resource_attributes(extra: Mapping[str, AttributeValue] | None = None) -> dict[str, AttributeValue]:
    """The agent's own Resource: see the module docstring for what it holds and what wins."""
    pid = os.getpid()
    attributes: dict[str, AttributeValue] = {
        sc.SERVICE_NAME: "otelbpf",
        sc.SERVICE_VERSION: otelbpf.__version__,
        sc.SERVICE_INSTANCE_ID: str(uuid.uuid4()),
        sc.HOST_NAME: node_host_name(),
        sc.PROCESS_PID: pid,
        sc.TELEMETRY_DISTRO_NAME: "otelbpf",
        sc.TELEMETRY_DISTRO_VERSION: otelbpf.__version__,
    }
    container, pod = container_ids(procfs.cgroup_of(pid))
    if container:
        attributes[sc.CONTAINER_ID] = container
    if pod:
        attributes[sc.K8S_POD_UID] = pod
    attributes.update(parse_resource_attributes(os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    service_name = os.environ.get("OTEL_SERVICE_NAME", "").strip()
    if service_name:
        attributes[sc.SERVICE_NAME] = service_name
    attributes.update(extra or {})
    return attributes


@dataclass(slots=True)
class SumMetric:
    name: str
    description: str
    unit: str
    #: (attributes, cumulative value)
    points: list[tuple[dict[str, AttributeValue], int]] = field(default_factory=list)


@dataclass(slots=True)
class GaugeMetric:
    name: str
    description: str
    unit: str
    value: int | float


@dataclass(slots=True)
class AgentMetrics:
    """The agent's own metrics as of a collection."""

    resource: Mapping[str, AttributeValue]
    start_ns: int
    sums: list[SumMetric]
    gauges: list[GaugeMetric]
    #: gauges with attributes (NCCL's RAS view: per communicator, per rank); SumMetric's shape
    gauge_points: list[SumMetric] = field(default_factory=list)


class GaugeReader:
    """Calls the gauge callables; one that raises or returns a non-number is skipped (logged once)."""

    def __init__(self, gauges: Mapping[str, Callable[[], int | float]] | None) -> None:
        self._gauges = dict(gauges or {})
        self._failed: set[str] = set()

    def add(self, name: str, read: Callable[[], int | float]) -> None:
        self._gauges[name] = read

    def read(self) -> list[GaugeMetric]:
        out: list[GaugeMetric] = []
        for name, read in list(self._gauges.items()):
            try:
                value = read()
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"returned {type(value).__name__}, not a number")
                if isinstance(value, float) and not math.isfinite(value):
                    raise ValueError(f"returned {value}")
            except Exception as exc:  # noqa: BLE001 - a gauge never breaks the export
                if name not in self._failed:
                    self._failed.add(name)
                    _log.warning("gauge %s skipped: %s (logged once)", name, exc)
                continue
            description, unit = GAUGE_DESCRIPTIONS.get(name, ("", "1"))
            out.append(GaugeMetric(name, description, unit, value))
        return out


def counter_sums(counters: Counters) -> list[SumMetric]:
    """Every counter as a Sum, its label as a data point attribute (:func:`label_key`)."""
    sums: dict[str, SumMetric] = {}
    for name, label, value in counters.items():
        metric = sums.get(name)
        if metric is None:
            metric = sums[name] = SumMetric(name, description_of(name), unit_of(name))
        metric.points.append(({label_key(name): label} if label else {}, value))
    return list(sums.values())
