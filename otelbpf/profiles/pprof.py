"""Profile samples -> pprof ``profile.proto`` (gzipped), the format ``go tool pprof`` and most profilers read.

Written by hand with the repo's varint helper rather than a generated pprof
module: the message is small and stable (pprof's proto has not changed
incompatibly in a decade), and no pprof Python package is a dependency.

One profile per process and profile type: pprof has no resources, so a file
holds one process (its name and pid go into the comments). Every sample
type of the profile type is a pprof sample type (``go tool pprof
-sample_index`` picks one). The span a sample was taken in becomes the
string labels ``trace_id`` and ``span_id`` (hex, as Pyroscope labels
OTLP links), the thread the labels ``thread.id`` (numeric) and
``thread.name``; other sample attributes become labels too. Mappings carry
the GNU build id. Each sample keeps its time as the numeric label
``timestamp_ns`` (Unix nanoseconds; the key google/perf_data_converter
writes), so a time range can be cut out of a file (``go tool pprof
-tagfocus``, the heat map of the flame graph page); identical samples (same
stack, labels and time) are summed, as pprof expects. The label makes samples
of one stack at different instants separate entries: a file grows with the
samples, not only the stacks.

Field numbers (perftools.profiles.Profile): sample_type 1, sample 2,
mapping 3, location 4, function 5, string_table 6, time_nanos 9,
duration_nanos 10, period_type 11, period 12, comment 13,
default_sample_type 14.
"""

from __future__ import annotations

import gzip
from typing import Any, Iterable, Mapping as MappingType, Sequence

from otelbpf.otlp.wire import UINT64_MAX, varint
from otelbpf.profiles.model import Frame, Mapping, ProfileType, Sample


#: The numeric label holding a sample's time (Unix ns), as google/perf_data_converter names it.
TIMESTAMP_LABEL = "timestamp_ns"


def _key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def _int(number: int, value: int) -> bytes:
    """A varint field (int64/uint64/bool); nothing for 0, as proto3 writes it."""
    return _key(number, 0) + varint(int(value) & UINT64_MAX) if value else b""


def _bytes(number: int, data: bytes) -> bytes:
    return _key(number, 2) + varint(len(data)) + data


def _packed(number: int, values: Iterable[int]) -> bytes:
    body = b"".join(varint(int(value) & UINT64_MAX) for value in values)
    return _bytes(number, body) if body else b""


class PprofBuilder:
    """Interns strings, functions, mappings and locations (ids from 1) and sums samples."""

    def __init__(self, profile_type: ProfileType) -> None:
        self.profile_type = profile_type
        self._strings: dict[str, int] = {"": 0}
        self._functions: dict[tuple[str, str], int] = {}
        self._mappings: dict[Mapping, int] = {}
        self._locations: dict[Frame, int] = {}
        self._location_frames: list[Frame] = []
        self._samples: dict[tuple, list[int]] = {}
        #: id(frames tuple) -> (the tuple, its location ids): samples share stack tuples
        #: (otelbpf.profiles.stacks), so most are counted without hashing their frames
        self._stacks: dict[int, tuple[tuple[Frame, ...], tuple[int, ...]]] = {}
        #: (tid, thread name, trace id, span id) -> labels, for samples without attributes of their own
        self._labels: dict[tuple, tuple] = {}
        #: location ids -> their packed field (a stack is written once per label set it has)
        self._packed_locations: dict[tuple[int, ...], bytes] = {}

    def string(self, value: str) -> int:
        index = self._strings.get(value)
        if index is None:
            index = self._strings[value] = len(self._strings)
        return index

    def add(self, sample: Sample) -> None:
        """Count one sample (summed into an identical one already added)."""
        frames = sample.frames
        known = self._stacks.get(id(frames))
        if known is not None and known[0] is frames:
            locations = known[1]
        else:
            locations = tuple(self._location(frame) for frame in frames)
            self._stacks[id(frames)] = (frames, locations)  # holds the tuple: its id stays its own
        if sample.attributes:
            labels = sample_labels(sample)
        else:
            thread = (sample.tid, sample.thread_name, sample.trace_id, sample.span_id)
            labels = self._labels.get(thread)
            if labels is None:
                labels = self._labels[thread] = sample_labels(sample)
        key = (locations, labels, sample.time_unix_nano)
        width = len(self.profile_type.sample_types)
        totals = self._samples.setdefault(key, [0] * width)
        for index in range(width):
            totals[index] += int(sample.values[index]) if index < len(sample.values) else 0

    def _location(self, frame: Frame) -> int:
        location = self._locations.get(frame)
        if location is None:
            location = self._locations[frame] = len(self._locations) + 1
            self._location_frames.append(frame)
            if frame.mapping is not None:
                self._mappings.setdefault(frame.mapping, len(self._mappings) + 1)
            self._functions.setdefault((frame.function, frame.file), len(self._functions) + 1)
        return location

    def serialize(self, *, time_nanos: int = 0, duration_nanos: int = 0, comments: Sequence[str] = ()) -> bytes:
        """The uncompressed ``profile.proto`` bytes."""
        out = [_bytes(1, self._value_type(kind, unit)) for kind, unit in self.profile_type.sample_types]
        out.extend(_bytes(2, self._sample(locations, labels, ts, values)) for (locations, labels, ts), values in self._samples.items())
        out.extend(_bytes(3, self._mapping(mapping, ident)) for mapping, ident in self._mappings.items())
        out.extend(_bytes(4, self._location_message(frame, ident)) for ident, frame in enumerate(self._location_frames, 1))
        out.extend(_bytes(5, self._function(name, file, ident)) for (name, file), ident in self._functions.items())
        tail = [_int(9, time_nanos), _int(10, duration_nanos)]
        if any(self.profile_type.period_type):
            tail.append(_bytes(11, self._value_type(*self.profile_type.period_type)))
        tail.append(_int(12, self.profile_type.period))
        tail.extend(_int(13, self.string(comment)) for comment in comments)
        strings = [_bytes(6, value.encode("utf-8", "replace")) for value in self._strings]  # last: all interned now
        return b"".join(out) + b"".join(strings) + b"".join(tail)

    def _value_type(self, kind: str, unit: str) -> bytes:
        return _int(1, self.string(kind)) + _int(2, self.string(unit))

    def _sample(self, locations: tuple[int, ...], labels: tuple, ts_ns: int, values: list[int]) -> bytes:
        packed = self._packed_locations.get(locations)
        if packed is None:
            packed = self._packed_locations[locations] = _packed(1, locations)
        body = [packed, _packed(2, values)]
        for key, value in labels:
            if type(value) is int:
                label = _int(1, self.string(key)) + _int(3, value)
            else:
                label = _int(1, self.string(key)) + _int(2, self.string(str(value)))
            body.append(_bytes(3, label))
        if ts_ns:
            body.append(_bytes(3, _int(1, self.string(TIMESTAMP_LABEL)) + _int(3, ts_ns)))
        return b"".join(body)

    def _mapping(self, mapping: Mapping, ident: int) -> bytes:
        # has_functions/filenames/line_numbers: already symbolized, so pprof does not try to.
        return b"".join((
            _int(1, ident), _int(2, mapping.start), _int(3, mapping.end), _int(4, mapping.file_offset),
            _int(5, self.string(mapping.path)), _int(6, self.string(mapping.build_id)),
            _int(7, 1), _int(8, 1), _int(9, 1),
        ))  # fmt: skip

    def _location_message(self, frame: Frame, ident: int) -> bytes:
        mapping = self._mappings.get(frame.mapping, 0) if frame.mapping is not None else 0
        line = _int(1, self._functions[(frame.function, frame.file)]) + _int(2, frame.line)
        return _int(1, ident) + _int(2, mapping) + _int(3, frame.address) + _bytes(4, line)

    def _function(self, name: str, file: str, ident: int) -> bytes:
        name_index = self.string(name)
        return _int(1, ident) + _int(2, name_index) + _int(3, name_index) + _int(4, self.string(file))


def sample_labels(sample: Sample) -> tuple[tuple[str, Any], ...]:
    """The pprof labels of a sample: its thread, its span (hex) and its own attributes."""
    labels: list[tuple[str, Any]] = [("thread.id", sample.tid)]
    if sample.thread_name:
        labels.append(("thread.name", sample.thread_name))
    if sample.trace_id:
        labels.append(("trace_id", sample.trace_id.hex()))
    if sample.span_id:
        labels.append(("span_id", sample.span_id.hex()))
    for key, value in sample.attributes.items():
        if value is not None:
            labels.append((key, value if type(value) is int else str(value)))
    return tuple(labels)


def encode_pprof(
    samples: Iterable[Sample],
    profile_type: ProfileType,
    *,
    time_nanos: int = 0,
    duration_nanos: int = 0,
    comments: Sequence[str] = (),
) -> bytes:
    """The gzipped pprof profile of ``samples`` (all of ``profile_type``, normally of one process)."""
    builder = PprofBuilder(profile_type)
    for sample in samples:
        builder.add(sample)
    raw = builder.serialize(time_nanos=time_nanos, duration_nanos=duration_nanos, comments=comments)
    return gzip.compress(raw, compresslevel=6, mtime=0)


def pprof_profiles(
    samples: Iterable[Sample], resources: MappingType[int, MappingType[str, Any]] | None = None
) -> dict[tuple[int, str], bytes]:
    """(pid, profile type id) -> gzipped pprof, one per process and profile type."""
    grouped: dict[tuple[int, ProfileType], list[Sample]] = {}
    for sample in samples:
        grouped.setdefault((sample.pid, sample.profile), []).append(sample)
    out: dict[tuple[int, str], bytes] = {}
    for (pid, profile_type), typed in grouped.items():
        first = min(sample.time_unix_nano for sample in typed)
        last = max(sample.time_unix_nano for sample in typed)
        comments = _process_comments(pid, (resources or {}).get(pid) or {})
        out[(pid, profile_type.id)] = encode_pprof(
            typed, profile_type, time_nanos=first, duration_nanos=last - first + 1, comments=comments
        )
    return out


def _process_comments(pid: int, attributes: MappingType[str, Any]) -> list[str]:
    """pprof has no resource: name the process in its comments (shown by ``go tool pprof -comments``)."""
    comments = [f"process.pid={pid}"]
    for key in ("service.name", "process.executable.name", "process.command_line"):
        if attributes.get(key):
            comments.append(f"{key}={attributes[key]}")
    return comments
