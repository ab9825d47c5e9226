"""Profiles out of the agent: OTLP over the real gRPC and HTTP transports, OTLP/JSON lines, pprof files.

Every check decodes what was sent or written with an independent reader
(the official protos in tests/otlp_receiver.py, ``google.protobuf.json_format``,
``go tool pprof``) and resolves each sample back to the frames, links and
threads it was made from.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from otlp_receiver import OtlpReceiver, attributes_dict, free_port, otlp_receiver  # noqa: F401 - fixture

from otelbpf.core.selfmetrics import Counters
from otelbpf.profiles.encode import BUILD_ID, FRAME_TYPE, encode_profiles
from otelbpf.profiles.export import (
    CPU_TIME,
    EXPORT_FAILURES,
    EXPORTS,
    BackgroundExporter,
    FlameGraphExporter,
    PprofDirectoryExporter,
    ProfilesJsonFileExporter,
    make_otlp_profile_exporter,
    profiles_from_otlp_json,
    read_profiles_json_file,
)
from otelbpf.profiles.model import (
    FRAME_KERNEL,
    FRAME_MARKER,
    FRAME_NATIVE,
    FRAME_PYTHON,
    Frame,
    Mapping,
    Sample,
)
from otelbpf.profiles.types import CPU, GPU_ALLOC, OFF_CPU

T0 = 1_700_000_000_000_000_000
TRACE_A, SPAN_A = bytes.fromhex("0af7651916cd43dd8448eb211c80319c"), bytes.fromhex("b7ad6b7169203331")
TRACE_B, SPAN_B = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736"), bytes.fromhex("00f067aa0ba902b7")
LIBC = Mapping("/usr/lib/x86_64-linux-gnu/libc.so.6", 0x7F3A00000000, 0x7F3A00200000, 0x28000, "c1e3d4f5a6b7c8d9")
APP = Mapping("/app/bin/engine", 0x555500000000, 0x555500400000, 0, "00aa11bb22cc")

INNER = Frame(FRAME_PYTHON, "Model.inner", "/app/model.py", 42)
OUTER = Frame(FRAME_PYTHON, "outer", "/app/server.py", 7)
MEMCPY = Frame(FRAME_NATIVE, "__memcpy_avx_unaligned", "", 0, 0x7F3A00012345, LIBC)
READ = Frame(FRAME_NATIVE, "read", "", 0, 0x7F3A00054321, LIBC)
SYSCALL = Frame(FRAME_KERNEL, "do_syscall_64")
SCHEDULE = Frame(FRAME_KERNEL, "schedule")
COMPUTE = Frame(FRAME_NATIVE, "engine::compute(int)", "/src/engine.cc", 88, 0x555500001000, APP)
STOP = Frame(FRAME_MARKER, "[unwind stopped: no CFI]")

RESOURCES = {
    100: {"service.name": "api", "process.pid": 100, "process.executable.name": "python3"},
    200: {"service.name": "engine", "process.pid": 200},
}


def make_samples() -> list[Sample]:
    """Two processes; Python, native, kernel and marker frames; linked and unlinked samples; on- and off-CPU."""
    linked = [Sample(CPU, 100, 101, T0 + i, (MEMCPY, INNER, OUTER), (1,), "worker", TRACE_A, SPAN_A) for i in range(3)]
    return [
        *linked,  # identical: one Sample with three observations
        Sample(CPU, 100, 101, T0 + 10, (SYSCALL, READ, INNER, OUTER), (1,), "worker", TRACE_B, SPAN_B),
        Sample(CPU, 100, 102, T0 + 11, (MEMCPY, INNER, OUTER), (1,), "io"),
        Sample(OFF_CPU, 100, 101, T0 + 12, (SCHEDULE, READ, OUTER), (5_000_000,), "worker", TRACE_A, SPAN_A),
        Sample(CPU, 200, 201, T0 + 20, (STOP, COMPUTE), (1,), attributes={"gpu.device": 0}),
        Sample(CPU, 200, 201, T0 + 21, (COMPUTE,), (1,)),
    ]


def observation(sample: Sample, value_index: int = 0) -> tuple:
    """What must come back for one sample, in the same shape as ``resolve`` gives."""
    frames = tuple(_frame_tuple(frame) for frame in sample.frames)
    attributes = {"thread.id": sample.tid, **({"thread.name": sample.thread_name} if sample.thread_name else {})}
    attributes.update(sample.attributes)
    link = (sample.trace_id.hex(), sample.span_id.hex()) if sample.trace_id else ("", "")
    return (sample.pid, sample.profile.sample_types[value_index], frames, link, tuple(sorted(attributes.items())),
            sample.values[value_index], sample.time_unix_nano)  # fmt: skip


def _frame_tuple(frame: Frame) -> tuple:
    mapping = (frame.mapping.path, frame.mapping.build_id) if frame.mapping else ("", "")
    return (frame.kind, frame.function, frame.file, frame.line, frame.address, mapping)


def resolve(request: Any) -> list[tuple]:
    """Every observation of a decoded request, its stack resolved through the dictionary."""
    d = request.dictionary
    strings = d.string_table

    def attrs(indices: Any) -> dict[str, Any]:
        return {strings[d.attribute_table[i].key_strindex]: attributes_dict([_kv(d.attribute_table[i], strings)])[
            strings[d.attribute_table[i].key_strindex]] for i in indices}  # fmt: skip

    def frame(location_index: int) -> tuple:
        location = d.location_table[location_index]
        (line,) = location.lines
        function = d.function_table[line.function_index]
        mapping = ("", "")
        if location.mapping_index:
            m = d.mapping_table[location.mapping_index]
            mapping = (strings[m.filename_strindex], attrs(m.attribute_indices).get(BUILD_ID, ""))
        kind = attrs(location.attribute_indices)[FRAME_TYPE]
        return (kind, strings[function.name_strindex], strings[function.filename_strindex], line.line, location.address, mapping)

    out = []
    for resource_profiles in request.resource_profiles:
        pid = attributes_dict(resource_profiles.resource.attributes)["process.pid"]
        for scope in resource_profiles.scope_profiles:
            assert scope.scope.name == "otelbpf.profiles" and scope.scope.version
            for profile in scope.profiles:
                sample_type = (strings[profile.sample_type.type_strindex], strings[profile.sample_type.unit_strindex])
                for sample in profile.samples:
                    frames = tuple(frame(i) for i in d.stack_table[sample.stack_index].location_indices)
                    link = d.link_table[sample.link_index]
                    attributes = tuple(sorted(attrs(sample.attribute_indices).items()))
                    assert len(sample.values) == len(sample.timestamps_unix_nano)
                    for value, timestamp in zip(sample.values, sample.timestamps_unix_nano):
                        assert profile.time_unix_nano <= timestamp < profile.time_unix_nano + profile.duration_nano
                        out.append((pid, sample_type, frames, (link.trace_id.hex(), link.span_id.hex()), attributes, value, timestamp))
    return out


def _kv(entry: Any, strings: Any) -> Any:
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    return KeyValue(key=strings[entry.key_strindex], value=entry.value)


def assert_dictionary_well_formed(request: Any) -> None:
    """Every table starts with its zero entry and holds no entry twice."""
    d = request.dictionary
    assert d.string_table[0] == ""
    assert len(set(d.string_table)) == len(d.string_table)
    for name in ("mapping_table", "location_table", "function_table", "link_table", "attribute_table", "stack_table"):
        table = getattr(d, name)
        assert len(table) >= 1 and table[0].ByteSize() == 0, name
        encoded = [entry.SerializeToString(deterministic=True) for entry in table]
        assert len(set(encoded)) == len(encoded), f"duplicates in {name}"


def sorted_observations(items: list[tuple]) -> list[tuple]:
    return sorted(items, key=repr)


@pytest.fixture(autouse=True)
def clean_otlp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.delenv(name)


# --- (a) OTLP over the real transports ----------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_samples_reach_a_receiver_and_resolve_back_to_their_frames(otlp_receiver: OtlpReceiver, protocol: str) -> None:
    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    counters = Counters()
    exporter = make_otlp_profile_exporter(endpoint, protocol, timeout_s=5, counters=counters)
    samples = make_samples()
    try:
        assert exporter.export(samples, RESOURCES) is True
    finally:
        exporter.shutdown()
    (request,) = otlp_receiver.wait_for_profile_requests(1)

    assert_dictionary_well_formed(request)
    assert sorted_observations(resolve(request)) == sorted_observations([observation(s) for s in samples])
    assert counters.get(EXPORTS, "otlp-profiles") == 1 and exporter.failures == 0
    resources = [attributes_dict(rp.resource.attributes) for rp in request.resource_profiles]
    assert resources == [RESOURCES[100], RESOURCES[200]]


def test_one_resource_per_process_one_profile_per_type_and_identical_samples_merged() -> None:
    request = encode_profiles(make_samples(), RESOURCES)
    api, engine = request.resource_profiles
    cpu, off_cpu = api.scope_profiles[0].profiles
    strings = request.dictionary.string_table
    assert (strings[cpu.sample_type.type_strindex], strings[cpu.sample_type.unit_strindex]) == ("samples", "count")
    assert (strings[cpu.period_type.type_strindex], strings[cpu.period_type.unit_strindex]) == ("cpu", "nanoseconds")
    assert cpu.period == CPU.period > 0
    assert strings[off_cpu.sample_type.type_strindex] == "off_cpu" and off_cpu.period == 0
    # 5 on-CPU samples of pid 100: the 3 identical ones became one Sample with 3 observations.
    assert sorted(len(s.timestamps_unix_nano) for s in cpu.samples) == [1, 1, 3]
    merged = next(s for s in cpu.samples if len(s.values) == 3)
    assert list(merged.timestamps_unix_nano) == [T0, T0 + 1, T0 + 2] and sum(merged.values) == 3
    link = request.dictionary.link_table[merged.link_index]
    assert (link.trace_id, link.span_id) == (TRACE_A, SPAN_A)
    assert cpu.time_unix_nano == T0 and cpu.duration_nano == 12 and len(cpu.profile_id) == 16
    assert len(engine.scope_profiles[0].profiles) == 1
    # one dictionary for the whole request: the libc mapping and OUTER's function are there once
    functions = [strings[f.name_strindex] for f in request.dictionary.function_table]
    assert functions.count("outer") == 1
    assert_dictionary_well_formed(request)


def test_a_multi_value_type_becomes_one_profile_per_sample_type() -> None:
    samples = [Sample(GPU_ALLOC, 7, 7, T0, (INNER, OUTER), (2, 4096)), Sample(GPU_ALLOC, 7, 7, T0 + 1, (OUTER,), (1, 512))]
    request = encode_profiles(samples, {})
    profiles = request.resource_profiles[0].scope_profiles[0].profiles
    strings = request.dictionary.string_table
    kinds = [(strings[p.sample_type.type_strindex], strings[p.sample_type.unit_strindex]) for p in profiles]
    assert kinds == [("alloc_objects", "count"), ("alloc_space", "bytes")]
    assert [sum(v for s in p.samples for v in s.values) for p in profiles] == [3, 4608]
    expected = [observation(s, i) for i in range(2) for s in samples]
    assert sorted_observations(resolve(request)) == sorted_observations(expected)


def test_a_traces_url_endpoint_gets_the_profiles_path(otlp_receiver: OtlpReceiver) -> None:
    exporter = make_otlp_profile_exporter(otlp_receiver.http_endpoint + "/v1/traces", "http/protobuf", timeout_s=5)
    try:
        assert exporter.export(make_samples(), RESOURCES)
    finally:
        exporter.shutdown()
    assert len(otlp_receiver.wait_for_profile_requests(1)) == 1


def test_profiles_variables_choose_endpoint_and_protocol(otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # the generic one loses
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", otlp_receiver.http_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT", "5")
    exporter = make_otlp_profile_exporter()
    try:
        assert exporter.export(make_samples(), RESOURCES)
    finally:
        exporter.shutdown()
    assert len(otlp_receiver.wait_for_profile_requests(1)) == 1


# --- (e) a collector that is down -----------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_that_is_down_is_a_counted_failure_not_an_exception(protocol: str) -> None:
    counters = Counters()
    exporter = make_otlp_profile_exporter(f"http://127.0.0.1:{free_port()}", protocol, timeout_s=1, counters=counters)
    started = time.monotonic()
    try:
        assert exporter.export(make_samples(), RESOURCES) is False
    finally:
        exporter.shutdown()
    assert time.monotonic() - started < 5
    assert exporter.failures == 1 and exporter.exports == 0
    assert counters.get(EXPORT_FAILURES, "otlp-profiles") == 1


def test_nothing_to_export_sends_nothing(otlp_receiver: OtlpReceiver) -> None:
    exporter = make_otlp_profile_exporter(otlp_receiver.grpc_endpoint, "grpc", timeout_s=5)
    assert exporter.export([], RESOURCES) is True
    exporter.shutdown()
    assert otlp_receiver.profile_requests == [] and exporter.exports == 0


# --- (b) OTLP/JSON lines ----------------------------------------------------------------------------


def test_json_lines_file_parses_back_into_requests(tmp_path: Path) -> None:
    path = tmp_path / "profiles.jsonl"
    exporter = ProfilesJsonFileExporter(path)
    samples = make_samples()
    assert exporter.export(samples[:4], RESOURCES) and exporter.export(samples[4:], RESOURCES)
    exporter.shutdown()

    lines = path.read_text().splitlines()
    assert len(lines) == 2
    document = json.loads(lines[0])
    link = document["dictionary"]["linkTable"][1]
    assert (link["traceId"], link["spanId"]) == (TRACE_A.hex(), SPAN_A.hex())  # hex, as OTLP/JSON wants
    assert re.fullmatch(r"[0-9a-f]{32}", document["resourceProfiles"][0]["scopeProfiles"][0]["profiles"][0]["profileId"])
    requests = read_profiles_json_file(path)
    assert requests[0] == profiles_from_otlp_json(lines[0])
    got = [o for request in requests for o in resolve(request)]
    assert sorted_observations(got) == sorted_observations([observation(s) for s in samples])
    for request in requests:
        assert_dictionary_well_formed(request)


# --- (c) pprof ---------------------------------------------------------------------------------------


def go_pprof(tmp_path: Path, *args: str) -> str:
    env = dict(os.environ, GOFLAGS="-mod=mod", GOCACHE=str(tmp_path / "gocache"), GOPATH=str(tmp_path / "gopath"),
               HOME=str(tmp_path), GOTOOLCHAIN="local", PPROF_TMPDIR=str(tmp_path))  # fmt: skip
    result = subprocess.run(["go", "tool", "pprof", *args], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def flat_and_cum(top: str) -> dict[str, tuple[float, float]]:
    """``go tool pprof -top`` rows: function -> (flat, cum), units (``ns``, ``B``) stripped."""
    rows = {}
    for line in top.splitlines():
        match = re.match(r"\s*([\d.]+)[a-zA-Z]*\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)[a-zA-Z]*\s+[\d.]+%\s+(.+)$", line)
        if match:
            rows[match.group(3).strip()] = (float(match.group(1)), float(match.group(2)))
    return rows


@pytest.mark.skipif(shutil.which("go") is None, reason="go (for go tool pprof) not installed")
def test_pprof_files_read_by_go_tool_pprof(tmp_path: Path) -> None:
    exporter = PprofDirectoryExporter(tmp_path / "pprof")
    assert exporter.export(make_samples(), RESOURCES)
    names = sorted(path.name for path in exporter.written)
    assert [name.split("-")[:2] for name in names] == [["cpu", "100"], ["cpu", "200"], ["offcpu", "100"]]
    cpu = next(path for path in exporter.written if path.name.startswith("cpu-100-"))
    assert gzip.decompress(cpu.read_bytes())  # a gzipped profile.proto

    top = flat_and_cum(go_pprof(tmp_path, "-top", "-nodecount=100", str(cpu)))
    assert top["__memcpy_avx_unaligned"] == (4, 4)  # 3 linked + 1 unlinked
    assert top["do_syscall_64"] == (1, 1)
    assert top["Model.inner"] == (0, 5) and top["outer"] == (0, 5)

    tags = go_pprof(tmp_path, "-tags", str(cpu))
    assert SPAN_A.hex() in tags and SPAN_B.hex() in tags and TRACE_A.hex() in tags
    assert re.search(r"3(\.0)? \(\s*75(\.00)?%\): " + SPAN_A.hex(), tags)  # of the 4 linked samples
    assert "worker" in tags and "thread.id" in tags
    focused = flat_and_cum(go_pprof(tmp_path, "-top", f"-tagfocus=span_id={SPAN_A.hex()}", str(cpu)))
    assert focused["__memcpy_avx_unaligned"] == (3, 3)

    raw = go_pprof(tmp_path, "-raw", str(cpu))
    assert "/app/model.py:42" in raw and LIBC.build_id in raw and LIBC.path in raw

    off_cpu = next(path for path in exporter.written if path.name.startswith("offcpu-"))
    assert flat_and_cum(go_pprof(tmp_path, "-top", "-unit=ns", str(off_cpu)))["schedule"][0] == 5_000_000


def test_pprof_samples_keep_their_time_so_a_range_can_be_cut_out(tmp_path: Path) -> None:
    """Each sample carries the numeric label timestamp_ns (identical stacks at other instants stay
    apart): ``go tool pprof -tagfocus=timestamp_ns=A:B`` keeps one time range."""
    second = 1_000_000_000
    samples = [Sample(CPU, 100, 101, T0 + i * second, (MEMCPY, INNER, OUTER), (1,), "worker") for i in range(3)]
    samples += [Sample(CPU, 100, 101, T0 + 2 * second, (SYSCALL, READ, OUTER), (1,), "worker")] * 2
    exporter = PprofDirectoryExporter(tmp_path / "pprof")
    assert exporter.export(samples, RESOURCES)
    (cpu,) = exporter.written
    if shutil.which("go") is None:
        pytest.skip("go not installed")
    whole = flat_and_cum(go_pprof(tmp_path, "-top", str(cpu)))
    assert whole["__memcpy_avx_unaligned"] == (3, 3) and whole["do_syscall_64"] == (2, 2)
    early = flat_and_cum(go_pprof(tmp_path, "-top", f"-tagfocus=timestamp_ns={T0}:{T0 + second // 2}", str(cpu)))
    assert early["__memcpy_avx_unaligned"] == (1, 1) and "do_syscall_64" not in early
    late = flat_and_cum(go_pprof(tmp_path, "-top", f"-tagfocus=timestamp_ns={T0 + 3 * second // 2}:{T0 + 3 * second}", str(cpu)))
    assert late["__memcpy_avx_unaligned"] == (1, 1) and late["do_syscall_64"] == (2, 2)


def test_pprof_keeps_every_sample_type_of_a_multi_value_type(tmp_path: Path) -> None:
    exporter = PprofDirectoryExporter(tmp_path)
    assert exporter.export([Sample(GPU_ALLOC, 7, 7, T0, (INNER, OUTER), (2, 4096))], {})
    if shutil.which("go") is None:
        pytest.skip("go (for go tool pprof) not installed")
    (path,) = exporter.written
    top = flat_and_cum(go_pprof(tmp_path, "-top", "-sample_index=alloc_space", "-unit=B", str(path)))
    assert top["Model.inner"][0] == 4096


# --- exporters that hold their data -----------------------------------------------------------------


def test_flame_graph_exporter_writes_its_page_at_shutdown(tmp_path: Path) -> None:
    counters = Counters()
    exporter = FlameGraphExporter(tmp_path / "out" / "flame.html", counters=counters)
    assert exporter.export(make_samples(), RESOURCES) and exporter.export(make_samples(), RESOURCES)
    assert not exporter.path.exists()
    exporter.shutdown()
    page = exporter.path.read_text()
    assert "Model.inner" in page and "__OTELBPF_FLAMEGRAPH_DATA__" not in page
    assert counters.get(EXPORTS, "flamegraph") == 2
    assert exporter.export(make_samples(), RESOURCES) is False  # after shutdown: a failure, not a crash


def test_an_exporter_that_raises_is_a_counted_failure(tmp_path: Path) -> None:
    counters = Counters()
    exporter = PprofDirectoryExporter(tmp_path, counters=counters)
    bad = Sample(CPU, 1, 1, T0, (INNER,), ("not a number",))
    assert exporter.export([bad], {}) is False
    assert counters.get(EXPORT_FAILURES, "pprof") == 1


def test_the_export_thread_counts_its_own_cpu(tmp_path: Path) -> None:
    """otelbpf.profiles.cpu_time{export}: what encoding and writing the intervals cost the
    exporters' thread, in microseconds, beside the intervals delivered."""
    counters = Counters()
    background = BackgroundExporter([ProfilesJsonFileExporter(tmp_path / "p.jsonl", counters=counters)], counters=counters)
    for _ in range(3):
        assert background.export(make_samples() * 50, RESOURCES)
    background.shutdown()
    assert counters.get(EXPORTS, "jsonfile-profiles") == 3
    assert len(read_profiles_json_file(tmp_path / "p.jsonl")) == 3
    assert counters.get(CPU_TIME, "export") > 3 * 100  # 3 x (encoding ~450 samples, printing them as JSON)


def test_merging_counts_each_identity_once() -> None:
    """Samples differing only in time merge; a different thread, link or attribute does not."""
    base = make_samples()[0]
    variants = [base, Sample(**{**_fields(base), "time_unix_nano": T0 + 5}), Sample(**{**_fields(base), "tid": 999}),
                Sample(**{**_fields(base), "span_id": SPAN_B}), Sample(**{**_fields(base), "attributes": {"x": 1}})]  # fmt: skip
    request = encode_profiles(variants, RESOURCES)
    samples = request.resource_profiles[0].scope_profiles[0].profiles[0].samples
    counts = collections.Counter(len(s.values) for s in samples)
    assert counts == {2: 1, 1: 3}


def _fields(sample: Sample) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in Sample.__slots__}


# --- (e) encoding cost: shared stack tuples, cached hashes, the JSON fast path --------------------


def test_json_document_is_protobufs_json_mapping() -> None:
    """The samples and links written by hand come out as json_format writes them, key order included."""
    import json as _json

    from google.protobuf import json_format

    from otelbpf.profiles.export import _base64_to_hex, _convert_ids, profiles_document

    samples = make_samples() + [
        Sample(GPU_ALLOC, 100, 103, T0 + 30, (COMPUTE, OUTER), (4096, 1024), "gpu", TRACE_B, SPAN_A),
        Sample(CPU, 100, 101, T0 + 31, (), (1,), "worker"),
    ]
    request = encode_profiles(samples, RESOURCES)
    reference = json_format.MessageToDict(request, use_integers_for_enums=True)
    _convert_ids(reference, _base64_to_hex)
    document = profiles_document(request)
    assert _json.dumps(document) == _json.dumps(reference)
    assert len(document["dictionary"]["linkTable"]) == 4  # the zero entry and three links


def test_shared_stack_tuples_encode_as_equal_ones() -> None:
    """The stack builder hands one tuple per distinct stack; the encoders count it by identity, and
    a tuple equal to it but not the same object lands on the same entries."""
    from otelbpf.profiles.flamegraph import FlameGraph
    from otelbpf.profiles.pprof import pprof_profiles

    stack = (MEMCPY, INNER, OUTER)
    shared = [Sample(CPU, 100, 101, T0 + i, stack, (1,), "worker", TRACE_A, SPAN_A) for i in range(4)]
    copies = [Sample(CPU, 100, 101, T0 + i, tuple(list(stack)), (1,), "worker", TRACE_A, SPAN_A) for i in range(4)]
    a, b = encode_profiles(shared, RESOURCES), encode_profiles(copies, RESOURCES)
    a.resource_profiles[0].scope_profiles[0].profiles[0].profile_id = b""
    b.resource_profiles[0].scope_profiles[0].profiles[0].profile_id = b""
    assert a == b and len(a.dictionary.stack_table) == 2
    assert pprof_profiles(shared, RESOURCES) == pprof_profiles(copies, RESOURCES)
    graph_a, graph_b = FlameGraph(), FlameGraph()
    graph_a.add(shared, RESOURCES)
    graph_b.add(copies, RESOURCES)
    assert graph_a.document()["stacks"] == graph_b.document()["stacks"]


def test_frame_hash_is_cached_and_survives_pickling() -> None:
    import dataclasses
    import pickle

    frame = Frame(FRAME_NATIVE, "read", "", 0, 0x7F3A00054321, LIBC)
    twin = Frame(FRAME_NATIVE, "read", "", 0, 0x7F3A00054321, Mapping(*dataclasses.astuple(LIBC)[:5]))
    assert frame == twin and hash(frame) == hash(twin) and frame._hash  # kept after the first hash
    back = pickle.loads(pickle.dumps(frame))
    assert back == frame and hash(back) == hash(frame) and {frame: 1}[back] == 1
    assert "_hash" not in repr(frame) and dataclasses.replace(frame, line=3) != frame
