"""Real eBPF, real processes: CUDA runtime/driver and NCCL calls under the requests that made them.

No GPU: examples/gpu_inference_server.py calls the stand-in libraries of
examples/cuda_standin (real symbol names, signatures, versions and aliases;
the runtime calls the driver like the real one) through ctypes from its
request handlers. The server loads them on its first GPU request, after the
agent started, so every test also proves that a library loaded later is
found and probed. Requests go through curl; spans are read from the OTLP
JSON file the agent writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest
from conftest import EXAMPLES, ROOT, wait_until
from otlp_receiver import OtlpReceiver, attributes_dict
from test_ebpf_http import spans_in_file

from otelbpf.metrics import read_metrics_json_file
from otelbpf.semantics.nccl_collectives import collective_span_id, collective_trace_id

pytestmark = pytest.mark.ebpf

STANDIN = ROOT / "examples" / "cuda_standin"
SERVER, INTERNAL = 2, 1  # OTLP SpanKind
SYNC_US, COPY_US = 30_000, 8_000


@pytest.fixture(scope="module", autouse=True)
def standin_libraries():
    """Built by scripts/install.sh; built here too so the test runs after a plain checkout."""
    subprocess.run(["make", "-s", "-C", str(STANDIN)], check=True)


def curl(port: int, path: str) -> dict:
    out = subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if out.stdout else {}


@pytest.fixture
def traced_server(services, agent, tmp_path):
    """The inference server (delays set), the agent tracing it (every call a span), and its GPU
    libraries loaded and probed."""
    return start_traced_server(services, agent, tmp_path, ["--gpu-min-call-duration", "0"])


def start_traced_server(services, agent, tmp_path, agent_args: list[str]):
    server = services(
        [str(EXAMPLES / "gpu_inference_server.py"), "--port", "0"],
        env={"CUDA_STANDIN_SYNC_US": str(SYNC_US), "CUDA_STANDIN_COPY_US": str(COPY_US)},
    )
    out = tmp_path / "spans.json"
    run = agent(
        ["--pid", str(server.pid), "--json-file", str(out), "--metrics-json-file", str(tmp_path / "metrics.json")]
        + agent_args
    )
    assert "cuda_standin" not in open(f"/proc/{server.pid}/maps").read()  # not loaded yet
    curl(server.port, "/health")
    curl(server.port, "/load")  # loads the libraries and calls nothing (no call can race the attaching)
    for name in ("libcudart.so.12", "libcuda.so.1", "libnccl.so.2"):
        probing = f"GPU: pid {server.pid}: probing {STANDIN}/build/{name} "
        assert wait_until(lambda: probing in run.output, timeout=15), run.output
    return server, run, out


def by_trace(spans) -> dict:
    """url.path (or span name) of each SERVER span -> (server span, its children sorted by start)."""
    servers = [s for s in spans if s.span.kind == SERVER]
    out = {}
    for server in servers:
        children = [s for s in spans if s.span.parent_span_id == server.span.span_id]
        out.setdefault(server.attributes["url.path"], []).append(
            (server, sorted(children, key=lambda s: s.span.start_time_unix_nano))
        )
    return out


def test_cuda_calls_are_child_spans_with_arguments_durations_and_launch_counts(traced_server):
    server, run, out = traced_server
    first = curl(server.port, "/infer?launches=7&bytes=3000")
    second = curl(server.port, "/infer?launches=12&bytes=512")
    pinned = curl(server.port, "/pinned?bytes=8192")
    driver = curl(server.port, "/driver?launches=3")
    assert run.stop() == 0

    spans = spans_in_file(out)
    traces = by_trace(spans)
    infers = traces["/infer"]
    assert len(infers) == 2
    for (request, children), answer, size in ((infers[0], first, 3000), (infers[1], second, 512)):
        names = [c.name for c in children]
        # one span per operation: the driver calls the runtime made are not spans of their own
        assert names == ["cudaMalloc", "cudaMemcpy", "cudaDeviceSynchronize", "cudaMemcpy", "cudaFree"]
        assert request.attributes["otelbpf.gpu.kernel_launches"] == answer["launches"]
        assert "otelbpf.gpu.kernel_launch.duration" not in request.attributes  # not timed by default
        for child in children:
            assert child.span.kind == INTERNAL and child.scope == "otelbpf.cuda"
            assert child.span.trace_id == request.span.trace_id
            assert request.span.start_time_unix_nano <= child.span.start_time_unix_nano
            assert child.span.end_time_unix_nano <= request.span.end_time_unix_nano
            assert child.attributes["thread.id"] > 0
        malloc, h2d, sync, d2h, free = children
        assert malloc.attributes["otelbpf.gpu.memory.bytes"] == size
        assert malloc.attributes["otelbpf.gpu.memory.address"] == answer["device_ptr"]
        assert free.attributes["otelbpf.gpu.memory.address"] == answer["device_ptr"]
        assert free.attributes["otelbpf.gpu.memory.bytes"] == size  # known from the malloc
        assert (h2d.attributes["otelbpf.gpu.memcpy.kind"], h2d.attributes["otelbpf.gpu.memcpy.bytes"]) == ("host_to_device", size)
        assert (d2h.attributes["otelbpf.gpu.memcpy.kind"], d2h.attributes["otelbpf.gpu.memcpy.bytes"]) == ("device_to_host", size)
        assert h2d.attributes["otelbpf.gpu.memcpy.pageable"] is True  # a ctypes buffer: pageable
        assert duration_us(sync) >= SYNC_US and duration_us(h2d) >= COPY_US and duration_us(d2h) >= COPY_US
        assert duration_us(malloc) < SYNC_US  # durations are the calls', not the request's

    [(request, children)] = traces["/pinned"]
    assert [c.name for c in children] == [
        "cudaHostAlloc", "cudaMalloc", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaFree", "cudaFreeHost",
    ]
    host_alloc, _malloc, copy, _sync, _free, free_host = children
    assert host_alloc.attributes["otelbpf.gpu.memory.address"] == pinned["host_ptr"] == free_host.attributes["otelbpf.gpu.memory.address"]
    assert copy.attributes["otelbpf.gpu.memcpy.pageable"] is False  # from the cudaHostAlloc'ed buffer
    assert copy.attributes["otelbpf.gpu.stream"] == 0
    assert "otelbpf.gpu.kernel_launches" not in request.attributes  # launched nothing

    [(request, children)] = traces["/driver"]
    assert [c.name for c in children] == ["cuStreamSynchronize"]
    assert request.attributes["otelbpf.gpu.kernel_launches"] == driver["launches"] == 4  # 3 cuLaunchKernelEx + 1 cuGraphLaunch


def test_nccl_calls_decode_rank_bytes_and_communicator(traced_server):
    server, run, out = traced_server
    answer = curl(server.port, "/allreduce?count=100&rank=3&nranks=5")
    assert run.stop() == 0

    spans = spans_in_file(out)
    [(request, children)] = by_trace(spans)["/allreduce"]
    assert [c.name for c in children] == ["ncclCommInitRank", "ncclCommDestroy"]
    init, destroy = children
    assert all(c.scope == "otelbpf.nccl" and c.span.parent_span_id == request.span.span_id for c in children)
    # the 128-byte ncclUniqueId went by value on the stack: the rank is the third integer register
    assert (init.attributes["otelbpf.nccl.rank"], init.attributes["otelbpf.nccl.nranks"]) == (3, 5)
    assert init.attributes["otelbpf.nccl.unique_id"] == bytes(range(16)).hex()  # read from the stack
    # ... and read whole: NCCL's commHash of those 128 bytes (2.28.9's hash; protocols/nccl/tests known answer)
    assert init.attributes["otelbpf.nccl.comm_hash"] == "6afe1cc17717e1f4"
    # the all-reduce is in its collective instance's trace (communicator, operation, sequence 0), as
    # rank 3's span, linked to the request that issued it
    [allreduce] = [s for s in spans if s.name == "ncclAllReduce"]
    assert allreduce.span.trace_id == collective_trace_id(0x6AFE1CC17717E1F4, "AllReduce", 0)
    assert allreduce.span.span_id == collective_span_id(0x6AFE1CC17717E1F4, "AllReduce", 0, 3)
    assert allreduce.span.parent_span_id == b"" and allreduce.attributes["otelbpf.association"] == "collective"
    [link] = allreduce.span.links
    assert (link.trace_id, link.span_id) == (request.span.trace_id, request.span.span_id)
    assert (allreduce.attributes["otelbpf.nccl.comm_hash"], allreduce.attributes["otelbpf.nccl.sequence"]) == ("6afe1cc17717e1f4", 0)
    assert (allreduce.attributes["otelbpf.nccl.rank"], allreduce.attributes["otelbpf.nccl.nranks"]) == (3, 5)
    comm = f"{answer['comm']:x}"
    assert init.attributes["otelbpf.nccl.communicator"] == comm == destroy.attributes["otelbpf.nccl.communicator"]
    attrs = allreduce.attributes
    assert attrs["otelbpf.nccl.communicator"] == comm
    assert (attrs["otelbpf.nccl.operation"], attrs["otelbpf.nccl.count"], attrs["otelbpf.nccl.datatype"]) == ("AllReduce", 100, "float32")
    assert (attrs["otelbpf.nccl.bytes"], attrs["otelbpf.nccl.reduce_op"]) == (400, "sum")


def test_gpu_memory_reserved_per_process_is_allocated_minus_freed(traced_server, tmp_path):
    server, run, _out = traced_server
    curl(server.port, "/keep?bytes=1000")
    curl(server.port, "/keep?bytes=5000")
    curl(server.port, "/infer?bytes=700")  # allocates and frees within the request
    curl(server.port, "/release")  # frees the 1000
    assert run.stop() == 0

    last: dict[str, int] = {}
    for request in read_metrics_json_file(tmp_path / "metrics.json"):
        for resource_metrics in request.resource_metrics:
            resource = attributes_dict(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name.startswith("otelbpf.gpu.memory.reserved"):
                        assert resource["process.pid"] == server.pid and metric.unit == "By"
                        last[metric.name] = metric.gauge.data_points[-1].as_int
    assert last == {"otelbpf.gpu.memory.reserved": 5000, "otelbpf.gpu.memory.reserved.max": 6700}


def duration_us(span) -> float:
    return (span.span.end_time_unix_nano - span.span.start_time_unix_nano) / 1e3


REAL_RUNTIME_SCRIPT = """
import ctypes, sys
import nvidia.cuda_runtime
runtime = ctypes.CDLL(next(iter(nvidia.cuda_runtime.__path__)) + "/lib/libcudart.so.12")
print("ready", flush=True)
sys.stdin.readline()
device = ctypes.c_void_p()
host = ctypes.create_string_buffer(777)
codes = [
    runtime.cudaMalloc(ctypes.byref(device), ctypes.c_size_t(12345)),
    runtime.cudaMemcpy(ctypes.c_void_p(0x1000), host, ctypes.c_size_t(777), 1),
    runtime.cudaStreamSynchronize(ctypes.c_void_p(0x42)),
]
print(*codes, flush=True)
"""


def test_the_real_cuda_runtime_without_a_gpu_still_fires_the_probes(agent, tmp_path):
    """libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel: with no GPU (no driver) each call
    returns an error, but the versioned symbols are probed and the arguments decoded."""
    script = tmp_path / "real_runtime.py"
    script.write_text(REAL_RUNTIME_SCRIPT)
    proc = subprocess.Popen(
        [subprocess.sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = tmp_path / "spans.json"
        run = agent(["--pid", str(proc.pid), "--json-file", str(out)])
        assert "libcudart.so.12 (" in run.output and "nvidia/cuda_runtime/lib/libcudart.so.12" in run.output
        proc.stdin.write("go\n")
        proc.stdin.flush()
        codes = [int(c) for c in proc.stdout.readline().split()]
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(codes) == 3 and all(codes)  # no GPU here: every call fails (cudaErrorInsufficientDriver...)
    assert run.stop() == 0

    spans = sorted(
        (s for s in spans_in_file(out) if s.scope == "otelbpf.cuda"), key=lambda s: s.span.start_time_unix_nano
    )
    assert [s.name for s in spans] == ["cudaMalloc", "cudaMemcpy", "cudaStreamSynchronize"]
    malloc, copy, sync = spans
    assert [s.attributes["otelbpf.gpu.error_code"] for s in spans] == codes
    assert all(s.span.status.code == 2 for s in spans)  # ERROR
    assert malloc.attributes["otelbpf.gpu.memory.bytes"] == 12345
    assert "otelbpf.gpu.memory.address" not in malloc.attributes  # failed: no address
    assert (copy.attributes["otelbpf.gpu.memcpy.kind"], copy.attributes["otelbpf.gpu.memcpy.bytes"]) == ("host_to_device", 777)
    assert sync.attributes["otelbpf.gpu.stream"] == 0x42



def run_ranks(agent, communicators, agent_args, *, by_reference=False, env=None, extra=()):
    """Start NCCL ranks (examples/nccl_ranks.py, one process each) for ``communicators``
    [(hex id, nranks)], trace them with ``agent_args``, run their collectives; (ranks, run).
    ``extra``: nccl_ranks.py options per communicator, by its id."""
    ranks, lib = [], "build/byref/libnccl.so.2" if by_reference else "build/libnccl.so.2"
    try:
        for comm_id, nranks in communicators:
            for rank in range(nranks):
                ranks.append(
                    subprocess.Popen(
                        [subprocess.sys.executable, str(EXAMPLES / "nccl_ranks.py"), "--rank", str(rank), "--nranks",
                         str(nranks), "--id", comm_id, *(["--id-by-reference"] if by_reference else []),
                         *dict(extra).get(comm_id, ())],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    )  # fmt: skip
                )
        assert all(p.stdout.readline().strip() == "ready" for p in ranks)
        run = agent([arg for p in ranks for arg in ("--pid", str(p.pid))] + agent_args, env=env)
        for p in ranks:
            assert f"GPU: pid {p.pid}: probing {STANDIN}/{lib} " in run.output, run.output
        for p in ranks:
            p.stdin.write("go\n")
            p.stdin.flush()
        assert all(p.stdout.readline().strip() == "done" for p in ranks)
        assert run.stop() == 0
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
        for comm_id, _ in communicators:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/nccl-standin-{comm_id}")
    return ranks, run


def test_the_rank_that_enters_collectives_late_is_named_marked_and_measured(agent, tmp_path):
    """Two communicators on stand-in NCCL ranks (separate processes whose collectives wait for each
    other): in the first, rank 2 enters every all-reduce 15 ms late; in the second no rank is late.
    The late rank is named in the log, its collective spans are marked last to enter (the others'
    are not), and the lateness histogram shows it."""
    slow_id, fair_id = os.urandom(8).hex(), os.urandom(8).hex()
    common = ["--delay-ms", "15", "--collectives", "30"]
    ranks, run = run_ranks(
        agent, [(slow_id, 4), (fair_id, 3)],
        ["--json-file", str(tmp_path / "spans.json"), "--metrics-json-file", str(tmp_path / "metrics.json")],
        extra={slow_id: ["--slow-rank", "2", *common], fair_id: common},
    )  # fmt: skip
    named = [line for line in run.output.splitlines() if "straggler:" in line]
    assert len(named) == 1, run.output
    assert f"straggler: rank 2 of communicator {slow_id[:8]}… entered last in " in named[0]
    assert " all-reduces (median 1" in named[0]  # 15 ms late (or a little more)
    spans = spans_in_file(tmp_path / "spans.json")
    init_ids = {s.attributes["otelbpf.nccl.unique_id"] for s in spans if s.name == "ncclCommInitRank"}
    assert init_ids == {slow_id + "00" * 8, fair_id + "00" * 8}  # the ncclUniqueId, read from the stack
    assert run.stats().get("otelbpf.nccl.spans.unmatched", 0) == 0  # every collective was whole

    # the spans: every all-reduce matched across its ranks, exactly one rank last in each
    collectives: dict[tuple[str, int], list[dict]] = {}
    for rank_pid in {s.resource["process.pid"] for s in spans}:
        mine = sorted((s for s in spans if s.resource["process.pid"] == rank_pid and s.name == "ncclAllReduce"),
                      key=lambda s: s.span.start_time_unix_nano)  # fmt: skip
        assert len(mine) == 30
        for n, span in enumerate(mine):
            collectives.setdefault((span.attributes["otelbpf.nccl.unique_id"], n), []).append(span.attributes)
    assert len(collectives) == 60
    for (unique_id, _n), ranks_attrs in collectives.items():
        assert len(ranks_attrs) == (4 if unique_id.startswith(slow_id) else 3)
        assert sum(a["otelbpf.nccl.last_to_enter"] for a in ranks_attrs) == 1
        assert min(a["otelbpf.nccl.lateness"] for a in ranks_attrs) == 0  # the first rank in
        if unique_id.startswith(slow_id):  # the delayed rank, and only it, is marked
            [last] = [a for a in ranks_attrs if a["otelbpf.nccl.last_to_enter"]]
            assert last["otelbpf.nccl.rank"] == 2 and last["otelbpf.nccl.lateness"] >= 10_000_000

    # the metric: lateness per communicator and rank, the delayed rank's ~15 ms per all-reduce
    lateness: dict[tuple[str, int], tuple[int, float]] = {}
    for request in read_metrics_json_file(tmp_path / "metrics.json"):
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == "otelbpf.nccl.collective.lateness":
                        assert metric.unit == "s"
                        for point in metric.histogram.data_points:
                            attrs = attributes_dict(point.attributes)
                            assert attrs["otelbpf.nccl.operation"] == "AllReduce"
                            key = (attrs["otelbpf.nccl.unique_id"][:16], attrs["otelbpf.nccl.rank"])
                            lateness[key] = (point.count, point.sum)
    assert sorted(lateness) == sorted([(slow_id, r) for r in range(4)] + [(fair_id, r) for r in range(3)])
    assert all(count == 30 for count, _sum in lateness.values())
    late_mean = lateness[(slow_id, 2)][1] / 30
    assert late_mean >= 0.010
    assert all(total / 30 < late_mean / 2 for key, (_count, total) in lateness.items() if key != (slow_id, 2))


# -- launches per process, time in launch calls, folded short calls, rank lateness --------------

EXITING_RANK_SCRIPT = """
import ctypes, sys, threading
driver = ctypes.CDLL(sys.argv[1])
driver.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
print("ready", flush=True)
sys.stdin.readline()
def launch(n):
    for _ in range(n):
        driver.cuLaunchKernel(None, 1, 1, 1, 128, 1, 1, 0, None, None, None)
worker = threading.Thread(target=launch, args=(int(sys.argv[2]),))  # a thread that ends with its launches unreported
worker.start()
worker.join()
launch(int(sys.argv[3]))
"""


def sums_by_pid(requests, name: str) -> dict[int, int | float]:
    """The last value of the per-process Sum ``name`` in each process's Resource."""
    last = {}
    for request in requests:
        for resource_metrics in request.resource_metrics:
            resource = attributes_dict(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == name:
                        assert metric.sum.is_monotonic and metric.sum.aggregation_temporality == 2  # cumulative
                        point = metric.sum.data_points[-1]
                        last[resource["process.pid"]] = point.as_int if point.HasField("as_int") else point.as_double
    return last


def test_kernel_launches_per_process_reach_the_receiver_with_or_without_a_timeline_call_after(services, agent, tmp_path):
    """Launches are counted in BPF per process and read at collection and at exit: launches no
    timeline call follows (a request that only launches; a thread, then a process, that ends
    right after launching) are in the metric as well as those a call carried."""
    exiting = tmp_path / "launch_and_exit.py"
    exiting.write_text(EXITING_RANK_SCRIPT)
    proc = subprocess.Popen(
        [subprocess.sys.executable, str(exiting), str(STANDIN / "build" / "libcuda.so.1"), "4", "5"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        with OtlpReceiver(http_port=None) as receiver:
            server, run, _out = start_traced_server(
                services, agent, tmp_path, ["--pid", str(proc.pid), "--otlp-endpoint", receiver.grpc_endpoint]
            )
            assert f"GPU: pid {proc.pid}: probing {STANDIN}/build/libcuda.so.1 " in run.output
            launched = curl(server.port, "/launch?launches=5")["launches"]  # no timeline call after them
            launched += curl(server.port, "/infer?launches=7")["launches"]  # carried by the cudaMemcpy after
            launched += curl(server.port, "/driver?launches=3")["launches"]  # 3 + 1 graph launch
            proc.stdin.write("go\n")
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
            assert run.stop() == 0
            requests = receiver.metric_requests
    finally:
        if proc.poll() is None:
            proc.kill()
    launches = sums_by_pid(requests, "otelbpf.gpu.kernel.launches")
    assert launches == {server.pid: launched, proc.pid: 9} and launched == 16
    assert sums_by_pid(requests, "otelbpf.gpu.kernel.launch.time") == {}  # not timed by default


def test_time_inside_launch_calls_on_the_request_span_when_asked(services, agent, tmp_path):
    server, run, out = start_traced_server(services, agent, tmp_path, ["--gpu-launch-time", "--gpu-min-call-duration", "0"])
    curl(server.port, "/infer?launches=7")
    curl(server.port, "/driver?launches=3")
    assert run.stop() == 0
    traces = by_trace(spans_in_file(out))
    for path, launches in (("/infer", 7), ("/driver", 4)):
        [(request, _children)] = traces[path]
        assert request.attributes["otelbpf.gpu.kernel_launches"] == launches
        spent = request.attributes["otelbpf.gpu.kernel_launch.duration"]
        assert 0 < spent < request.span.end_time_unix_nano - request.span.start_time_unix_nano
    timed = {}
    for request in read_metrics_json_file(tmp_path / "metrics.json"):
        timed.update(sums_by_pid([request], "otelbpf.gpu.kernel.launch.time"))
    assert timed[server.pid] > 0


def test_short_calls_are_folded_into_their_request_span_and_still_counted(services, agent, tmp_path):
    # 5 ms: far above a stand-in malloc/free even on a loaded machine, far below the 30 ms sync
    server, run, out = start_traced_server(services, agent, tmp_path, ["--gpu-min-call-duration", "5ms"])
    curl(server.port, "/small?calls=3")
    assert run.stop() == 0
    [(request, children)] = by_trace(spans_in_file(out))["/small"]
    assert [c.name for c in children] == ["cudaDeviceSynchronize"]  # 30 ms: exported
    attrs = request.attributes
    assert attrs["otelbpf.gpu.folded_calls.function"] == ["cudaFree", "cudaMalloc"]
    assert attrs["otelbpf.gpu.folded_calls.count"] == [3, 3]
    assert all(0 < ns < 3 * 5_000_000 for ns in attrs["otelbpf.gpu.folded_calls.duration"])
    counted = {}
    for request in read_metrics_json_file(tmp_path / "metrics.json"):
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == "otelbpf.gpu.call.duration":
                        for point in metric.histogram.data_points:
                            counted[attributes_dict(point.attributes)["code.function.name"]] = point.count
    assert counted == {"cudaMalloc": 3, "cudaFree": 3, "cudaDeviceSynchronize": 1}


def test_the_arm64_way_of_passing_the_nccl_unique_id_is_decoded_from_real_probes(agent, tmp_path):
    """AAPCS64 passes the 128-byte ncclUniqueId by reference: x2 points to the caller's copy, x3
    holds the rank. The stand-in built with the id taken by pointer (build/byref) gets the same
    layout on x86-64 (rdx, ecx), so the agent told to decode the arm64 way
    (OTELBPF_NCCL_ID_ABI=aarch64) reads the id through the third argument with the real probe."""
    comm_id = os.urandom(8).hex()
    ranks, _ = run_ranks(
        agent, [(comm_id, 2)], ["--json-file", str(tmp_path / "spans.json")], by_reference=True,
        env={"OTELBPF_NCCL_ID_ABI": "aarch64"}, extra={comm_id: ["--collectives", "3"]},
    )  # fmt: skip
    spans = spans_in_file(tmp_path / "spans.json")
    inits = {s.resource["process.pid"]: s.attributes for s in spans if s.name == "ncclCommInitRank"}
    assert {pid: (a["otelbpf.nccl.rank"], a["otelbpf.nccl.nranks"]) for pid, a in inits.items()} == {
        ranks[0].pid: (0, 2), ranks[1].pid: (1, 2),
    }  # fmt: skip
    assert {a["otelbpf.nccl.unique_id"] for a in inits.values()} == {comm_id + "00" * 8}  # read through x2's pointer
    allreduces = [s.attributes for s in spans if s.name == "ncclAllReduce"]
    assert len(allreduces) == 6 and sum(a["otelbpf.nccl.last_to_enter"] for a in allreduces) == 3  # matched across ranks
