"""Where profiles go: OTLP (gRPC, HTTP), an OTLP/JSON lines file, pprof files, a flame graph page.

Every destination is a :class:`ProfileExporter`, in the style of the
OpenTelemetry SDK's exporters: ``export(samples, resources)`` takes one
interval's samples and the resource attributes of their processes (by pid),
``shutdown()`` releases (or, for the flame graph, writes) what it holds.
``export`` answers True (delivered) or False and never raises: a collector
that is down is a counted failure (``failures``, and the
``otelbpf.profiles.export.failures{sink}`` counter when given ``Counters``),
not an exception in the sampler's thread. Nothing is retried here: profiles
are statistical, the next interval brings fresh ones, and a backlog of old
intervals is worth less than the agent's memory.

The OTLP and JSON-lines exporters are the shared ``otelbpf.otlp`` plumbing
for the ``PROFILES`` signal (the same transports, failure logging and file
writer as traces and metrics); only the encoding is profile specific.
OTLP settings follow the other signals: the endpoint argument, else
OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT; the
protocol likewise (``..._PROFILES_PROTOCOL``); headers, timeout and
``insecure`` from ``..._PROFILES_HEADERS`` / ``_TIMEOUT`` (seconds, as the
Python exporters read it) / ``_INSECURE`` when set, else the generic and
traces variables the underlying exporter reads.
"""

from __future__ import annotations

import abc
import base64
import json
import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Mapping, Sequence

from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb

from otelbpf.otlp.jsonlines import JsonLinesSink, go_escaped, read_json_lines
from otelbpf.otlp.signals import PROFILES, count_profiles
from otelbpf.otlp.sink import FailureLog, Sink
from otelbpf.otlp.transport import GRPC, OtlpGrpcSink, OtlpHttpSink, OtlpSink, SerializedRequest, resolve_transport
from otelbpf.profiles.encode import Resources, encode_profiles
from otelbpf.profiles.flamegraph import DEFAULT_MAX_STACKS, FlameGraph
from otelbpf.profiles.model import Sample
from otelbpf.profiles.pprof import pprof_profiles

_log = logging.getLogger(__name__)

EXPORTS = "otelbpf.profiles.exports"
EXPORT_FAILURES = "otelbpf.profiles.export.failures"
#: The agent's own CPU on profiles, microseconds, by stage: ``pipeline`` (decoding, linking and
#: building samples on the pipeline's thread: otelbpf/profiles/profiler.py) and ``export``
#: (encoding and sending, on the exporters' thread). Read with the thread's CPU clock: ~0.4 us
#: a read, two per sample.
CPU_TIME = "otelbpf.profiles.cpu_time"
DESCRIPTIONS = {
    EXPORTS: "profile exports delivered (one per interval and sink)",
    EXPORT_FAILURES: "profile exports that failed (not retried: the next interval brings new samples)",
}


class ProfileExporter(abc.ABC):
    """A destination for profile samples. ``export`` never raises; it counts its outcome."""

    #: The ``sink`` label of this exporter's counters.
    name: str = "profiles"

    def __init__(self, *, counters: Any = None) -> None:
        self._counters = counters
        self.exports = 0
        self.failures = 0

    def export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        """Deliver one interval's samples: True when delivered (or nothing to deliver), False on failure."""
        if not samples:
            return True
        try:
            delivered = bool(self._export(samples, resources))
        except Exception:  # noqa: BLE001 - an exporter never raises into the sampler
            _log.exception("profile exporter %s failed", self.name)
            delivered = False
        self._count(delivered)
        return delivered

    @abc.abstractmethod
    def _export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        """The actual delivery; may raise (counted as a failure)."""

    def force_flush(self) -> bool:
        """Write out what the exporter holds on its own (the flame graph); True when done."""
        return True

    def shutdown(self) -> None:
        """Release resources (and write what is held). Idempotent."""

    def _count(self, delivered: bool) -> None:
        if delivered:
            self.exports += 1
        else:
            self.failures += 1
        if self._counters is not None:
            self._counters.add(EXPORTS if delivered else EXPORT_FAILURES, 1, label=self.name)


# --- OTLP -------------------------------------------------------------------------------


class OtlpProfileExporter(ProfileExporter):
    """Encodes each interval into one ExportProfilesServiceRequest and sends it through an OTLP sink."""

    def __init__(self, sink: Sink[Any], *, counters: Any = None) -> None:
        super().__init__(counters=counters)
        self.sink = sink
        self.name = sink.name

    def _export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        request = encode_profiles(samples, resources)
        return self.sink.export(SerializedRequest(request.SerializeToString(), count_profiles(request)))

    def shutdown(self) -> None:
        self.sink.shutdown()


def make_otlp_profile_exporter(
    endpoint: str | None = None,
    protocol: str | None = None,
    *,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
    counters: Any = None,
) -> OtlpProfileExporter:
    """The OTLP profiles exporter for ``protocol`` (else OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL, else grpc). A traces or metrics URL given as
    ``endpoint`` (one ``--otlp-endpoint`` for all signals) gets the profiles
    path ``/v1development/profiles``; see ``otelbpf.otlp.transport.make_otlp_sink``."""
    sink = make_otlp_profile_sink(endpoint, protocol, timeout_s=timeout_s, headers=headers)
    return OtlpProfileExporter(sink, counters=counters)


def make_otlp_profile_sink(
    endpoint: str | None = None,
    protocol: str | None = None,
    *,
    timeout_s: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> OtlpSink:
    """``otelbpf.otlp``'s sink for PROFILES, with the OTEL_EXPORTER_OTLP_PROFILES_* overrides applied
    (there is no official profiles exporter to read them: the span exporter underneath reads the traces ones)."""
    headers = headers if headers is not None else _env_headers()
    timeout_s = timeout_s if timeout_s is not None else _env_timeout()
    if resolve_transport(protocol, PROFILES) == GRPC:
        return OtlpGrpcSink(PROFILES, endpoint, headers=headers, timeout_s=timeout_s, insecure=_env_insecure())
    return OtlpHttpSink(PROFILES, endpoint, headers=headers, timeout_s=timeout_s)


def _env(suffix: str) -> str:
    return os.environ.get(f"OTEL_EXPORTER_OTLP_{PROFILES.env}_{suffix}", "").strip()


def _env_headers() -> dict[str, str] | None:
    raw = _env("HEADERS")
    if not raw:
        return None
    from opentelemetry.util.re import parse_env_headers

    return parse_env_headers(raw, liberal=True)


def _env_timeout() -> float | None:
    raw = _env("TIMEOUT")
    try:
        value = float(raw) if raw else None
    except ValueError:
        _log.warning("ignoring OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT=%r: not a number of seconds", raw)
        return None
    return value if value and value > 0 else None


def _env_insecure() -> bool | None:
    raw = _env("INSECURE").lower()
    return raw == "true" if raw else None


# --- OTLP/JSON lines ----------------------------------------------------------------------


class ProfilesJsonFileExporter(ProfileExporter):
    """``--profiles-json-file``: one OTLP/JSON ExportProfilesServiceRequest per line,
    as the Collector's file exporter writes them (so its ``otlpjsonfile`` receiver reads them)."""

    name = "jsonfile-profiles"

    def __init__(self, path: str | Path, *, counters: Any = None) -> None:
        super().__init__(counters=counters)
        self.sink = JsonLinesSink(path, profiles_json_line, name=self.name)
        self.path = self.sink.path

    def _export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        return self.sink.export(encode_profiles(samples, resources))

    def shutdown(self) -> None:
        self.sink.shutdown()


def profiles_to_otlp_json(request: ExportProfilesServiceRequest) -> str:
    """One line of OTLP/JSON (no newline): lowerCamelCase, 64-bit integers as strings, ids as hex."""
    return go_escaped(json.dumps(profiles_document(request), ensure_ascii=False, separators=(",", ":")))


def profiles_document(request: ExportProfilesServiceRequest) -> dict[str, Any]:
    """The request as protobuf's JSON mapping gives it (``json_format.MessageToDict``), ids as hex.

    The samples and the links, one or more per sample, are written here: protobuf's
    generic printer took ~10 us per sample, most of an interval's encoding. The rest
    (resources, the other tables) goes through the printer, on a copy without them.
    Where the messages have fields this module does not know (a newer proto), all of
    it goes through the printer."""
    if not _FAST_JSON:
        document = json_format.MessageToDict(request, use_integers_for_enums=True)
        _convert_ids(document, _base64_to_hex)
        return document
    skeleton = ExportProfilesServiceRequest()
    skeleton.CopyFrom(request)
    samples = []
    for resource in skeleton.resource_profiles:
        for scope in resource.scope_profiles:
            for profile in scope.profiles:
                samples.append([_sample_json(sample) for sample in profile.samples])
                profile.ClearField("samples")
    links = [_link_json(link) for link in skeleton.dictionary.link_table]
    skeleton.dictionary.ClearField("link_table")
    document = json_format.MessageToDict(skeleton, use_integers_for_enums=True)
    _convert_ids(document, _base64_to_hex)
    position = iter(samples)
    for resource in document.get("resourceProfiles", ()):
        for scope in resource.get("scopeProfiles", ()):
            profiles = scope.get("profiles", ())
            for index, profile in enumerate(profiles):
                listed = next(position)
                if listed:
                    profile["samples"] = listed
                    profiles[index] = _in_field_order(profile, _PROFILE_KEYS)
    if links:
        dictionary = document.setdefault("dictionary", {})
        dictionary["linkTable"] = links
        document["dictionary"] = _in_field_order(dictionary, _DICTIONARY_KEYS)
    return document


def _sample_json(sample: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if sample.stack_index:
        out["stackIndex"] = sample.stack_index
    if sample.attribute_indices:
        out["attributeIndices"] = list(sample.attribute_indices)
    if sample.link_index:
        out["linkIndex"] = sample.link_index
    if sample.values:
        out["values"] = [str(value) for value in sample.values]  # int64: strings in JSON
    if sample.timestamps_unix_nano:
        out["timestampsUnixNano"] = [str(value) for value in sample.timestamps_unix_nano]
    return out


def _link_json(link: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if link.trace_id:
        out["traceId"] = link.trace_id.hex()
    if link.span_id:
        out["spanId"] = link.span_id.hex()
    return out


def _in_field_order(document: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: document[key] for key in keys if key in document}


def _field_names(message: Any) -> tuple[str, ...]:
    return tuple(field.json_name for field in sorted(message.DESCRIPTOR.fields, key=lambda field: field.number))


_PROFILE_KEYS = _field_names(pb.Profile)
_DICTIONARY_KEYS = _field_names(pb.ProfilesDictionary)
#: The fields _sample_json and _link_json write, in order: anything else and the printer does it all.
_FAST_JSON = _field_names(pb.Sample) == (
    "stackIndex", "attributeIndices", "linkIndex", "values", "timestampsUnixNano",
) and _field_names(pb.Link) == ("traceId", "spanId")  # fmt: skip


def profiles_json_line(request: ExportProfilesServiceRequest) -> bytes:
    return (profiles_to_otlp_json(request) + "\n").encode("utf-8")


def profiles_from_otlp_json(line: str) -> ExportProfilesServiceRequest:
    """Parse one OTLP/JSON line (hex ids) back into a request."""
    document = json.loads(line)
    _convert_ids(document, _hex_to_base64)
    return json_format.ParseDict(document, ExportProfilesServiceRequest())


def read_profiles_json_file(path: str | Path) -> list[ExportProfilesServiceRequest]:
    """All complete lines of a profiles OTLP/JSON file (a last line without its newline is skipped)."""
    errors = (ValueError, TypeError, AttributeError, json_format.ParseError)
    return read_json_lines(path, profiles_from_otlp_json, "profiles request", errors)


def _convert_ids(document: dict[str, Any], convert: Any) -> None:
    """Rewrite the id fields of the link table and of every profile with ``convert``."""
    holders = list(document.get("dictionary", {}).get("linkTable", ()))
    for resource in document.get("resourceProfiles", ()):
        for scope in resource.get("scopeProfiles", ()):
            holders.extend(scope.get("profiles", ()))
    for holder in holders:
        for key in ("traceId", "spanId", "profileId"):
            if holder.get(key):
                holder[key] = convert(holder[key])


def _base64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_base64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


# --- pprof files ----------------------------------------------------------------------------


class PprofDirectoryExporter(ProfileExporter):
    """Writes a gzipped pprof file per process and profile type and interval into ``directory``.

    Names: ``<type>-<pid>-<first sample ms>-<sequence>.pb.gz`` (sortable by
    time within a process). Each file appears whole (written aside, then
    renamed), so ``go tool pprof`` on the directory never reads half a file.
    """

    name = "pprof"

    def __init__(self, directory: str | Path, *, counters: Any = None) -> None:
        super().__init__(counters=counters)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._sequence = 0
        self._failures = FailureLog(_log, self.name)
        self.written: list[Path] = []

    def _export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        first_ms = min(sample.time_unix_nano for sample in samples) // 1_000_000
        try:
            for (pid, type_id), data in pprof_profiles(samples, resources).items():
                self._sequence += 1
                self.written.append(self._write(f"{type_id}-{pid}-{first_ms}-{self._sequence:06d}.pb.gz", data))
        except OSError as exc:
            self._failures.failed(type(exc).__name__, exc)
            return False
        self._failures.succeeded()
        return True

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        partial = path.with_name(f".{name}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)
        return path


# --- flame graph page ---------------------------------------------------------------------------


class FlameGraphExporter(ProfileExporter):
    """Accumulates every interval (bounded by ``max_stacks``) and writes one HTML flame graph at shutdown."""

    name = "flamegraph"

    def __init__(self, path: str | Path, *, max_stacks: int = DEFAULT_MAX_STACKS, counters: Any = None) -> None:
        super().__init__(counters=counters)
        self.path = Path(path)
        self.graph = FlameGraph(max_stacks=max_stacks)
        self._lock = threading.Lock()
        self._closed = False
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        with self._lock:
            if self._closed:
                return False
            self.graph.add(samples, resources)
        return True

    def force_flush(self) -> bool:
        with self._lock:
            try:
                self.graph.write(self.path)
            except OSError as exc:
                _log.warning("flame graph %s not written: %s", self.path, exc)
                return False
        return True

    def shutdown(self) -> None:
        if self._closed:
            return
        if self.force_flush():
            _log.info("flame graph written to %s (%s)", self.path, self.graph.summary())
        self._closed = True


def make_profile_exporters(
    *,
    otlp_endpoint: str | None = None,
    otlp_protocol: str | None = None,
    otlp: bool = False,
    json_file: str | Path | None = None,
    pprof_dir: str | Path | None = None,
    flamegraph_file: str | Path | None = None,
    counters: Any = None,
) -> list[ProfileExporter]:
    """The exporters the options ask for (``otlp`` or an endpoint: OTLP; the others by their path)."""
    exporters: list[ProfileExporter] = []
    if otlp or otlp_endpoint:
        exporters.append(make_otlp_profile_exporter(otlp_endpoint, otlp_protocol, counters=counters))
    if json_file:
        exporters.append(ProfilesJsonFileExporter(json_file, counters=counters))
    if pprof_dir:
        exporters.append(PprofDirectoryExporter(pprof_dir, counters=counters))
    if flamegraph_file:
        exporters.append(FlameGraphExporter(flamegraph_file, counters=counters))
    return exporters


class BackgroundExporter(ProfileExporter):
    """Runs other exporters on a thread of their own.

    The profiler hands an interval over on the pipeline's thread; encoding it
    and a collector that takes its time (or is down, up to the transport's
    timeout) must not hold up the spans. At most ``max_pending`` intervals
    wait; past that the oldest is dropped and counted."""

    def __init__(self, exporters: Sequence[ProfileExporter], *, max_pending: int = 4, counters: Any = None) -> None:
        super().__init__(counters=counters)
        self.name = "background"
        self.exporters = list(exporters)
        self._pending: deque = deque()
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="otelbpf-profiles-export", daemon=True)
        self._thread.start()

    def _export(self, samples: Sequence[Sample], resources: Resources) -> bool:
        with self._cond:
            if len(self._pending) >= self._max_pending:
                dropped, _ = self._pending.popleft()
                if self._counters is not None:
                    self._counters.add("otelbpf.profiles.export.dropped", len(dropped))
            self._pending.append((list(samples), dict(resources)))
            self._cond.notify()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                samples, resources = self._pending.popleft()
            started = time.thread_time_ns()
            for exporter in self.exporters:
                exporter.export(samples, resources)
            if self._counters is not None:  # encoding and sending, this thread's CPU (otelbpf.profiles.cpu_time)
                self._counters.add(CPU_TIME, (time.thread_time_ns() - started) // 1000, label="export")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Export what waits, then shut the exporters down (the flame graph is written then)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)
        for exporter in self.exporters:
            exporter.shutdown()
