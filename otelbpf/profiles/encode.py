"""Profile samples -> one OTLP ``ExportProfilesServiceRequest`` (profiles proto v1.10).

Layout of a request:

* one ``ResourceProfiles`` per process (its resource attributes, with
  ``process.pid`` always present), one ``ScopeProfiles`` ``otelbpf.profiles``
  versioned with the agent, and in it one ``Profile`` per profile type and
  sample type (v1.10 has a single ``sample_type`` per Profile: a type with
  several values, like GPU allocations, becomes several Profiles);
* ONE ``ProfilesDictionary`` for the whole request, each table
  de-duplicated and starting with its zero entry (index 0 means "none",
  as the proto requires: a consumer reading index 0 must get an empty
  entry, and Pyroscope misreads tables without it);
* a frame is a ``Location`` (its ``Mapping``, address, one ``Line`` with
  the function and line) tagged with ``profile.frame.type`` (``cpython``,
  ``native``, ``kernel``, ``abort-marker``: the eBPF profiler's values, so
  backends colour alike); a stack is a ``Stack`` of location indices, leaf
  first;
* the span a sample was taken in is a ``Link`` (``link_index``; Pyroscope
  turns it into the ``span_id`` label), the thread is the sample attributes
  ``thread.id`` and ``thread.name``.

Samples with the same identity (stack, attributes, link: the proto's
"primary key") are merged into one ``Sample`` whose ``values`` and
``timestamps_unix_nano`` list each observation (the proto requires both
lists the same length when both are set, so the total is their sum).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb

import otelbpf
from otelbpf.otlp.wire import coerce_any_value, fill_attributes_safely, id_bytes, text
from otelbpf.profiles.model import Frame, Mapping as ProcessMapping, ProfileType, Sample

SCOPE_NAME = "otelbpf.profiles"
FRAME_TYPE = "profile.frame.type"
THREAD_ID = "thread.id"
THREAD_NAME = "thread.name"
#: Semantic-convention attribute of a mapping's GNU build id (hex).
BUILD_ID = "process.executable.build_id.gnu"

#: Resource attributes of each process, by pid.
Resources = Mapping[int, Mapping[str, Any]]


class Dictionary:
    """The request's ``ProfilesDictionary``, filled as entries are interned (each once)."""

    def __init__(self) -> None:
        self.message = pb.ProfilesDictionary()
        self._strings: dict[str, int] = {}
        self._index: dict[tuple, int] = {}
        #: id(frames tuple or frame) -> (that object, its index): samples share stack tuples and
        #: frames (otelbpf.profiles.stacks), so most are found without hashing their frames
        self._by_id: dict[int, tuple[Any, int]] = {}
        #: (tid, thread name) -> attribute indices; (trace id, span id) -> link index
        self._threads: dict[tuple[int, str], tuple[int, ...]] = {}
        self._links: dict[tuple[Any, Any], int] = {}
        self.string("")
        for table in ("mapping_table", "location_table", "function_table", "link_table", "attribute_table", "stack_table"):
            getattr(self.message, table).add()  # the zero entry every table starts with

    def string(self, value: str) -> int:
        index = self._strings.get(value)
        if index is None:
            index = self._strings[value] = len(self.message.string_table)
            self.message.string_table.append(text(value))
        return index

    def _intern(self, key: tuple, table: Any, build: Any) -> int:
        """The index of ``key`` in ``table``; ``build(entry)`` fills a new entry the first time."""
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(table)
            build(table.add())
        return index

    def attribute(self, key: str, value: Any) -> int:
        def build(entry: Any) -> None:
            entry.key_strindex = self.string(key)
            entry.value.CopyFrom(coerce_any_value(value))

        try:
            identity = ("attribute", key, type(value).__name__, value, hash(value))
        except TypeError:  # a list or dict: by its text
            identity = ("attribute", key, type(value).__name__, repr(value), 0)
        return self._intern(identity, self.message.attribute_table, build)

    def link(self, trace_id: bytes, span_id: bytes) -> int:
        trace_id, span_id = id_bytes(trace_id, 16), id_bytes(span_id, 8)
        if not (any(trace_id) and any(span_id)):  # missing, wrong size or all-zero (invalid ids): no link
            return 0

        def build(entry: Any) -> None:
            entry.trace_id, entry.span_id = trace_id, span_id

        return self._intern(("link", trace_id, span_id), self.message.link_table, build)

    def mapping(self, mapping: ProcessMapping | None) -> int:
        if mapping is None:
            return 0

        def build(entry: Any) -> None:
            entry.memory_start, entry.memory_limit = mapping.start, mapping.end
            entry.file_offset = mapping.file_offset
            entry.filename_strindex = self.string(mapping.path)
            if mapping.build_id:
                entry.attribute_indices.append(self.attribute(BUILD_ID, mapping.build_id))

        return self._intern(("mapping", mapping), self.message.mapping_table, build)

    def function(self, name: str, filename: str) -> int:
        def build(entry: Any) -> None:
            entry.name_strindex = self.string(name)
            entry.system_name_strindex = entry.name_strindex
            entry.filename_strindex = self.string(filename)

        return self._intern(("function", name, filename), self.message.function_table, build)

    def location(self, frame: Frame) -> int:
        known = self._by_id.get(id(frame))
        if known is not None and known[0] is frame:
            return known[1]

        def build(entry: Any) -> None:
            entry.mapping_index = self.mapping(frame.mapping)
            entry.address = frame.address
            entry.lines.add(function_index=self.function(frame.function, frame.file), line=frame.line)
            entry.attribute_indices.append(self.attribute(FRAME_TYPE, frame.kind))

        index = self._intern(("location", frame), self.message.location_table, build)
        self._by_id[id(frame)] = (frame, index)  # holds the frame: its id stays its own
        return index

    def stack(self, frames: Sequence[Frame]) -> int:
        if not frames:
            return 0
        known = self._by_id.get(id(frames))
        if known is not None and known[0] is frames:
            return known[1]
        locations = tuple(self.location(frame) for frame in frames)

        def build(entry: Any) -> None:
            entry.location_indices.extend(locations)

        index = self._intern(("stack", locations), self.message.stack_table, build)
        self._by_id[id(frames)] = (frames, index)
        return index


def encode_profiles(
    samples: Iterable[Sample],
    resources: Resources,
    *,
    start_unix_nano: int | None = None,
    end_unix_nano: int | None = None,
) -> ExportProfilesServiceRequest:
    """One request for ``samples``: per process, per profile type, in one shared dictionary.

    ``start_unix_nano``/``end_unix_nano`` bound the collection interval
    (each Profile's time and duration); by default the samples' own span.
    """
    request = ExportProfilesServiceRequest()
    dictionary = Dictionary()
    by_process = group_samples(samples)
    for pid, by_type in by_process.items():
        resource_profiles = request.resource_profiles.add()
        fill_attributes_safely(resource_profiles.resource.attributes, process_resource(resources, pid))
        scope_profiles = resource_profiles.scope_profiles.add()
        scope_profiles.scope.CopyFrom(InstrumentationScope(name=SCOPE_NAME, version=otelbpf.__version__))
        for profile_type, typed in by_type.items():
            window = _window(typed, start_unix_nano, end_unix_nano)
            for value_index in range(len(profile_type.sample_types)):
                profile = scope_profiles.profiles.add()
                _fill_profile(profile, profile_type, value_index, typed, dictionary, window)
    request.dictionary.CopyFrom(dictionary.message)
    return request


def group_samples(samples: Iterable[Sample]) -> dict[int, dict[ProfileType, list[Sample]]]:
    """pid -> profile type -> samples, in first-seen order (so output is stable for a given input)."""
    grouped: dict[int, dict[ProfileType, list[Sample]]] = defaultdict(lambda: defaultdict(list))
    for sample in samples:
        grouped[sample.pid][sample.profile].append(sample)
    return grouped


def process_resource(resources: Resources, pid: int) -> dict[str, Any]:
    """The process's resource attributes, with ``process.pid`` added when the lookup lacks it."""
    attributes = dict(resources.get(pid) or {})
    attributes.setdefault("process.pid", pid)
    return attributes


def _window(samples: Sequence[Sample], start: int | None, end: int | None) -> tuple[int, int]:
    """(time_unix_nano, duration_nano) covering every sample timestamp (the proto's half-open range)."""
    first = min(sample.time_unix_nano for sample in samples)
    last = max(sample.time_unix_nano for sample in samples)
    start = first if start is None else min(start, first)
    end = last + 1 if end is None else max(end, last + 1)
    return start, end - start


def _fill_profile(
    profile: Any,
    profile_type: ProfileType,
    value_index: int,
    samples: Sequence[Sample],
    dictionary: Dictionary,
    window: tuple[int, int],
) -> None:
    kind, unit = profile_type.sample_types[value_index]
    profile.sample_type.type_strindex = dictionary.string(kind)
    profile.sample_type.unit_strindex = dictionary.string(unit)
    period_kind, period_unit = profile_type.period_type
    if period_kind or period_unit:
        profile.period_type.type_strindex = dictionary.string(period_kind)
        profile.period_type.unit_strindex = dictionary.string(period_unit)
    profile.period = profile_type.period
    profile.time_unix_nano, profile.duration_nano = window
    profile.profile_id = os.urandom(16)
    # one Sample per identity, added whole: field by field, the protobuf calls were most of the cost
    merged: dict[tuple, tuple[list[int], list[int]]] = {}
    for sample in samples:
        identity = sample_identity(sample, dictionary)
        lists = merged.get(identity)
        if lists is None:
            lists = merged[identity] = ([], [])
        lists[0].append(_value(sample, value_index))
        lists[1].append(sample.time_unix_nano)
    add = profile.samples.add
    for (stack, link, attributes), (values, timestamps) in merged.items():
        add(stack_index=stack, link_index=link, attribute_indices=attributes, values=values,
            timestamps_unix_nano=timestamps)  # fmt: skip


def sample_identity(sample: Sample, dictionary: Dictionary) -> tuple[int, int, tuple[int, ...]]:
    """(stack index, link index, sorted attribute indices): the proto's key for merging samples."""
    thread = (sample.tid, sample.thread_name)
    attributes = dictionary._threads.get(thread)
    if attributes is None:
        indices = [dictionary.attribute(THREAD_ID, sample.tid)]
        if sample.thread_name:
            indices.append(dictionary.attribute(THREAD_NAME, sample.thread_name))
        attributes = dictionary._threads[thread] = tuple(sorted(set(indices)))
    if sample.attributes:
        extra = (dictionary.attribute(key, value) for key, value in sample.attributes.items() if value is not None)
        attributes = tuple(sorted({*attributes, *extra}))
    stack = dictionary.stack(sample.frames)
    ids = (sample.trace_id, sample.span_id)
    try:
        link = dictionary._links.get(ids)
    except TypeError:  # ids of an unhashable type
        link = dictionary.link(*ids)
    else:
        if link is None:
            link = dictionary._links[ids] = dictionary.link(*ids)
    return stack, link, attributes


def _value(sample: Sample, index: int) -> int:
    try:
        return int(sample.values[index])
    except (IndexError, TypeError, ValueError):
        return 0
