"""Every metric the agent exports, in the Prometheus text format, named the way OpenTelemetry
says OTLP metrics become Prometheus ones (the specification's "Prometheus and OpenMetrics
Compatibility", as the Collector's ``prometheus`` exporter applies it).

What is translated (one collection, :func:`render`, from the OTLP requests the exporter
builds for every sink: the same numbers as OTLP):

* **names**: characters other than ``[a-zA-Z0-9_:]`` become ``_`` (runs collapse), then the
  unit as a suffix (``s`` -> ``_seconds``, ``By`` -> ``_bytes``, ``ms`` ->
  ``_milliseconds``, ``x/y`` -> ``_x_per_y``, ``1`` -> ``_ratio`` on gauges; annotations
  in braces such as ``{span}`` add nothing), not repeated if the name ends with it; a
  monotonic Sum ends in ``_total``; ``otelbpf.nccl.time`` (s) is ``otelbpf_nccl_time_seconds``;
* **kinds**: a monotonic cumulative Sum is a ``counter``, a non-monotonic one and a Gauge a
  ``gauge``, a Histogram a ``histogram`` (``_bucket{le}``, ``_sum``, ``_count``); delta
  temporality is never produced here;
* **labels**: attribute keys sanitised like names (``otelbpf.nccl.rank`` ->
  ``otelbpf_nccl_rank``; two keys that collide are joined with ``;``); every series gets
  ``job`` (``service.namespace/service.name``) and ``instance`` (``service.instance.id``) of
  its Resource, which tells the traced processes apart (the agent is a multi-resource
  exporter, like the Collector), ``otel_scope_name`` and ``otel_scope_version``, and the
  Resource's ``host.name`` and ``k8s.node.name`` (promoted: the node is what cross-node
  rules group by, docs/gpu.md); the rest of each Resource is one ``target_info`` series.

A scraping Prometheus renames ``job`` and ``instance`` to ``exported_job`` and
``exported_instance`` (``honor_labels: false``, the default) and sets its own: the agent's
address, one per node.
"""

from __future__ import annotations

import math
import re
import threading
import time
from typing import Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]+")
_UNDERSCORES = re.compile(r"__+")
#: OTLP/UCUM units -> the words Prometheus metric names end with.
UNIT_WORDS = {
    "s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds", "min": "minutes",
    "h": "hours", "d": "days", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "bit": "bits", "m": "meters", "V": "volts",
    "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz", "%": "percent",
}  # fmt: skip
_PER = {"s": "second", "m": "minute", "h": "hour", "d": "day"}
#: Resource attributes made labels of every series of that Resource.
PROMOTED = ("host.name", "k8s.node.name")
_IDENTITY = ("service.name", "service.namespace", "service.instance.id")


def metric_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus name of an OTLP metric of ``kind`` (``counter``, ``gauge``, ``histogram``)."""
    out = _UNDERSCORES.sub("_", _INVALID_NAME.sub("_", name)).strip("_") or "_"
    if out[0].isdigit():
        out = "_" + out
    suffix = unit_suffix(unit, kind)
    if suffix and not out.endswith("_" + suffix):
        out += "_" + suffix
    if kind == "counter":
        out = out[: -len("_total")] if out.endswith("_total") else out
        out += "_total"
    return out


def unit_suffix(unit: str, kind: str) -> str:
    """``unit`` as a name suffix ("" for none or annotations only)."""
    unit = re.sub(r"\{[^}]*\}", "", unit or "").strip()
    if not unit:
        return ""
    if unit == "1":
        return "ratio" if kind == "gauge" else ""
    if "/" in unit:
        top, _, bottom = unit.partition("/")
        top_word = UNIT_WORDS.get(top, _clean(top))
        bottom_word = _PER.get(bottom, UNIT_WORDS.get(bottom, _clean(bottom)))
        return f"{top_word}_per_{bottom_word}" if top_word and bottom_word else top_word or ""
    return UNIT_WORDS.get(unit, _clean(unit))


def _clean(text: str) -> str:
    return _UNDERSCORES.sub("_", _INVALID_LABEL.sub("_", text)).strip("_")


def label_name(key: str) -> str:
    out = _UNDERSCORES.sub("_", _INVALID_LABEL.sub("_", key)) or "_"
    if out[0].isdigit():
        out = "key_" + out
    return out


class _Family:
    __slots__ = ("kind", "help", "lines", "seen")

    def __init__(self, kind: str, help_text: str) -> None:
        self.kind = kind
        self.help = help_text
        self.lines: list[str] = []
        self.seen: set[str] = set()


def render(requests: Iterable[ExportMetricsServiceRequest]) -> str:
    """One collection's requests as a Prometheus text exposition (version 0.0.4)."""
    families: dict[str, _Family] = {}
    targets: dict[str, None] = {}
    for request in requests:
        for resource_metrics in request.resource_metrics:
            resource = {kv.key: _value(kv.value) for kv in resource_metrics.resource.attributes}
            base = _resource_labels(resource)
            info = dict(base)
            for key, value in resource.items():
                if key not in _IDENTITY:
                    info.setdefault(label_name(key), value)
            targets[_series("target_info", info, 1)] = None
            for scope_metrics in resource_metrics.scope_metrics:
                scoped = dict(base)
                scoped["otel_scope_name"] = scope_metrics.scope.name
                if scope_metrics.scope.version:
                    scoped["otel_scope_version"] = scope_metrics.scope.version
                for metric in scope_metrics.metrics:
                    _add_metric(families, metric, scoped)
    out: list[str] = []
    if targets:
        out += ["# HELP target_info Target metadata", "# TYPE target_info gauge", *targets]
    for name, family in families.items():
        if family.help:
            out.append(f"# HELP {name} {_escape_help(family.help)}")
        out.append(f"# TYPE {name} {family.kind}")
        out.extend(family.lines)
    return "\n".join(out) + "\n"


def _resource_labels(resource: dict[str, str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    name = resource.get("service.name", "")
    namespace = resource.get("service.namespace", "")
    if name:
        labels["job"] = f"{namespace}/{name}" if namespace else name
    instance = resource.get("service.instance.id", "")
    if instance:
        labels["instance"] = instance
    for key in PROMOTED:
        if key in resource:
            labels[label_name(key)] = resource[key]
    return labels


def _add_metric(families: dict[str, _Family], metric, base: dict[str, str]) -> None:
    field = metric.WhichOneof("data")
    if field == "histogram":
        name = metric_name(metric.name, metric.unit, "histogram")
        family = _family(families, name, "histogram", metric.description)
        bucket, total, count = name + "_bucket{", name + "_sum", name + "_count"
        for point in metric.histogram.data_points:
            labels = _labels_text(_point_labels(base, point.attributes))
            if labels in family.seen:  # the same series twice (a Resource exported twice): Prometheus rejects it
                continue
            family.seen.add(labels)
            bounds = point.explicit_bounds
            prefix = bucket + labels + ("," if labels else "")
            lines = family.lines
            cumulative = 0
            for i, observed in enumerate(point.bucket_counts):
                cumulative += observed
                le = _number(bounds[i]) if i < len(bounds) else "+Inf"
                lines.append(f'{prefix}le="{le}"}} {cumulative}')
            if len(point.bucket_counts) <= len(bounds):  # no overflow bucket sent: +Inf is the count
                lines.append(f'{prefix}le="+Inf"}} {point.count}')
            braced = "{" + labels + "}" if labels else ""
            lines.append(f"{total}{braced} {_number(point.sum)}")
            lines.append(f"{count}{braced} {point.count}")
    elif field == "sum":
        kind = "counter" if metric.sum.is_monotonic else "gauge"
        name = metric_name(metric.name, metric.unit, kind)
        family = _family(families, name, kind, metric.description)
        for point in metric.sum.data_points:
            _line(family, name, _point_labels(base, point.attributes), _point_value(point))
    elif field == "gauge":
        name = metric_name(metric.name, metric.unit, "gauge")
        family = _family(families, name, "gauge", metric.description)
        for point in metric.gauge.data_points:
            _line(family, name, _point_labels(base, point.attributes), _point_value(point))


def _family(families: dict[str, _Family], name: str, kind: str, help_text: str) -> _Family:
    family = families.get(name)
    if family is None:
        family = families[name] = _Family(kind, help_text)
    return family


def _point_labels(base: dict[str, str], attributes) -> dict[str, str]:
    labels = dict(base)
    own: dict[str, list[str]] = {}
    for kv in attributes:
        own.setdefault(label_name(kv.key), []).append(_value(kv.value))
    for key, values in own.items():
        labels[key] = ";".join(values)  # the data point's attributes win over promoted ones
    return labels


def _line(family: _Family, name: str, labels: dict[str, str], value) -> None:
    text = _labels_text(labels)
    if text in family.seen:  # the same series twice (a Resource exported twice): Prometheus rejects duplicates
        return
    family.seen.add(text)
    family.lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")


def _series(name: str, labels: dict[str, str], value) -> str:
    text = _labels_text(labels)
    return f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}"


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{key}="{_escape(str(value))}"' for key, value in sorted(labels.items()))


def _point_value(point):
    return point.as_int if point.WhichOneof("value") == "as_int" else point.as_double


def _value(any_value) -> str:
    kind = any_value.WhichOneof("value")
    if kind == "string_value":
        return any_value.string_value
    if kind == "bool_value":
        return "true" if any_value.bool_value else "false"
    if kind == "int_value":
        return str(any_value.int_value)
    if kind == "double_value":
        return _number(any_value.double_value)
    if kind == "array_value":
        return "[" + ",".join(_value(v) for v in any_value.array_value.values) + "]"
    return ""


def _number(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(text: str) -> str:
    if "\\" not in text and '"' not in text and "\n" not in text:
        return text
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class PrometheusEndpoint:
    """What ``/metrics`` serves with ``--prometheus-port``: a collection of everything the
    exporter exports, made when scraped (at most once per ``min_interval_s``; a scrape in
    between gets the previous one)."""

    def __init__(self, exporter, min_interval_s: float = 1.0) -> None:
        self._exporter = exporter
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._clock = time.monotonic
        self._text = ""
        self._made = -math.inf

    def text(self) -> str:
        with self._lock:
            now = self._clock()
            if now - self._made >= self._min_interval_s:
                self._text = render(self._exporter.collect())
                self._made = now
            return self._text
