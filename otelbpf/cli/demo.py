"""`otelbpf demo`: trace the bundled example services end to end.

Starts examples/http_backend.py and examples/http_gateway.py (unmodified
Python services), attaches the probes to them and to curl, drives requests
through the gateway with curl, then runs the example gRPC service
(examples/grpc_service.py) with its client (one call of each kind and an
error), then asks the OpenAI-compatible mock model server
(examples/openai_mock_server.py, 80 ms to the first token) for streamed and
plain chat completions and embeddings with curl, then asks the example GPU
inference server (examples/gpu_inference_server.py, calling the stand-in CUDA
runtime and driver of examples/cuda_standin through ctypes) for two inferences
and a cached allocation, sends three concurrent requests to the example
batching server (examples/gpu_batching_server.py: its engine thread serves
them in one step, a ``gpu step`` span linked to each request), then prints
its GPU memory reserved (and with ``--dds``, the
examples/dds_pipeline.py camera -> detector -> planner chain over Cyclone DDS,
traced with UDP capture), then prints the trace trees
(LLM calls with their time to first chunk and token counts) and writes the
OTLP JSON file. The same code path as `otelbpf run`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time

from otelbpf import bundled
from otelbpf.cli.doctor import preflight
from otelbpf.cli.outputs import build_consumer, build_profile_exporters
from otelbpf.semantics.gpu_state import state_of

log = logging.getLogger("otelbpf")
#: The demo is short and its services are light: sample often enough that they show in the flame graph.
DEMO_PROFILE_HZ = 499
#: The example services: the checkout's examples/, or those an installed wheel put under
#: <prefix>/share/otelbpf/examples (the image), or OTELBPF_EXAMPLES (otelbpf/bundled.py).
EXAMPLES = bundled.EXAMPLES.locate()


def start_service(args: list[str]) -> tuple[subprocess.Popen, int]:
    """Start an example service and wait for its "listening on PORT" line."""
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"{args[0]} did not start: {line!r}")
    return proc, int(line.split()[-1])


def drive_traffic(port: int, count: int) -> dict[str, int]:
    """Send requests through the gateway with curl (a separate, traced process)."""
    base = f"http://127.0.0.1:{port}"
    statuses: dict[str, int] = {}
    plan = []
    for i in range(count):
        if i % 5 == 3:
            plan.append(["-X", "POST", "-H", "Content-Type: application/json", "-d", '{"prompt": "hello"}', f"{base}/api/predict"])
        else:
            plan.append([f"{base}/api/items/{1000 + i}"])
    plan.append([f"{base}/api/error"])
    plan.append([f"{base}/api/missing"])
    for args in plan:
        result = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", *args], capture_output=True, text=True, timeout=30
        )
        statuses[result.stdout] = statuses.get(result.stdout, 0) + 1
    return statuses


def drive_gpu(port: int) -> list[str]:
    """Inferences on the GPU example server (curl, traced): each request's CUDA calls
    become child spans of its SERVER span; /keep leaves memory reserved."""
    base = f"http://127.0.0.1:{port}"
    # The server loads its CUDA libraries on first use, like a process importing torch late;
    # the agent looks for new libraries when a traced process opens a connection, at most
    # once a second: load them, then let one more connection (a second later) get them probed.
    subprocess.run(["curl", "-s", "-o", "/dev/null", f"{base}/load"], timeout=30)
    time.sleep(1.1)
    subprocess.run(["curl", "-s", "-o", "/dev/null", f"{base}/health"], timeout=30)
    time.sleep(0.5)
    statuses = []
    for path in ("/infer?launches=8&bytes=1048576", "/infer?launches=3&bytes=65536", "/keep?bytes=4194304"):
        result = subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{base}{path}"], capture_output=True, text=True, timeout=30
        )
        statuses.append(result.stdout)
    return statuses


def drive_batching(port: int, count: int = 3) -> list[str]:
    """``count`` concurrent requests to the batching example (curl, traced): its engine
    thread serves them in one step, a ``gpu step`` span linked to each request."""
    clients = [
        subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                          f"http://127.0.0.1:{port}/generate/demo-{i}?launches={i + 2}"],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
        for i in range(count)
    ]
    return [client.communicate(timeout=30)[0] for client in clients]


def drive_llm(port: int) -> list[str]:
    """Call the mock model server as an LLM client would (curl, traced): a streamed chat,
    a plain chat and embeddings. Returns the HTTP statuses."""
    base = f"http://127.0.0.1:{port}/v1"
    messages = [{"role": "user", "content": "why is my GPU idle?"}]
    calls = [
        ("chat/completions", {"model": "llama-3-8b", "messages": messages, "max_tokens": 24, "stream": True,
                              "stream_options": {"include_usage": True}}),
        ("chat/completions", {"model": "llama-3-8b", "messages": messages, "max_tokens": 8}),
        ("embeddings", {"model": "bge-small", "input": ["a GPU", "idle"]}),
    ]  # fmt: skip
    statuses = []
    for path, body in calls:
        result = subprocess.run(
            ["curl", "-s", "-N", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json",
             "-H", "Authorization: Bearer sk-demo", "-d", json.dumps(body), f"{base}/{path}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        statuses.append(result.stdout)
    return statuses


def gpu_example_available() -> bool:
    """The GPU example server and the stand-in CUDA runtime it loads (built by install.sh)."""
    return (EXAMPLES / "gpu_inference_server.py").is_file() and (EXAMPLES / "cuda_standin" / "build" / "libcudart.so.12").exists()


def print_gpu_memory(pipeline, pid: int) -> None:
    """The GPU memory the example server's CUDA calls left reserved (the metric
    otelbpf.gpu.memory.reserved exports per process)."""
    state = state_of(pipeline)
    gauges = state.memory_gauges().get(pid, []) if state is not None else []
    for name, _description, unit, value in gauges:
        print(f"demo: gpu_inference_server {name} = {value:,} {unit}")


def demo_prerequisites() -> str | None:
    """What the demo needs besides the agent, said before anything starts."""
    if shutil.which("curl") is None:
        return "needs curl to drive requests (apt-get install -y curl)"
    for name in bundled.DEMO_SERVICES:
        if not (EXAMPLES / name).is_file():
            return f"example service {EXAMPLES / name} not found ({bundled.EXAMPLES.hint()})"
    return None


def start_dds_pipeline() -> subprocess.Popen:
    """examples/dds_pipeline.py camera -> detector -> planner (Cyclone DDS on UDP),
    under a launcher shell that starts them once told (``go``): the agent traces the
    launcher's children from their first datagram, discovery included."""
    role = f"{sys.executable} {EXAMPLES / 'dds_pipeline.py'}"
    script = (
        f"read go; {role} planner --seconds 6 >/dev/null & {role} detector --seconds 6 >/dev/null & "
        f"sleep 1; {role} camera --frames 3 --rate 5 --quiet >/dev/null; wait"
    )
    return subprocess.Popen(["bash", "-c", script], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def drive_dds(launcher: subprocess.Popen) -> None:
    launcher.communicate("go\n", timeout=60)


def run_demo(args) -> int:
    from otelbpf.core.selfmetrics import Counters
    from otelbpf.host.resources import ProcessResources
    from otelbpf.assembly import attach_profiles, build_pipeline
    from otelbpf.profiles.sampler import ProfileConfig
    from otelbpf.runtime.agent import Agent
    from otelbpf.sources.ebpf import CaptureConfig, CaptureError, EbpfSource

    missing = demo_prerequisites()
    if missing:
        print(f"otelbpf demo: {missing}", file=sys.stderr)
        return 1
    if not preflight():
        return 1
    args.console = True
    args.metrics_interval = None
    backend, backend_port = start_service([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    gateway, gateway_port = start_service(
        [str(EXAMPLES / "http_gateway.py"), "--port", "0", "--backend", f"127.0.0.1:{backend_port}"]
    )
    grpc_server, grpc_port = start_service([str(EXAMPLES / "grpc_service.py"), "serve", "--port", "0"])
    gpu_server, gpu_port = None, 0
    batching, batching_port = None, 0
    if gpu_example_available():
        gpu_server, gpu_port = start_service([str(EXAMPLES / "gpu_inference_server.py"), "--port", "0"])
        if importlib.util.find_spec("fastapi") and importlib.util.find_spec("uvicorn"):
            batching, batching_port = start_service(
                [str(EXAMPLES / "gpu_batching_server.py"), "--port", "0", "--batch-size", "3", "--batch-wait-ms", "2000"]
            )
    else:
        print("demo: no stand-in CUDA libraries (examples/cuda_standin/build, made by scripts/install.sh): GPU part skipped")
    llm_server, llm_port = start_service(
        [str(EXAMPLES / "openai_mock_server.py"), "--port", "0", "--first-token-delay-ms", "80", "--token-delay-ms", "10"]
    )
    grpc_client = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "grpc_service.py"), "call", "--port", str(grpc_port), "--gate"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    grpc_client.stdout.readline()  # "ready": its channel opens once the probes are attached
    print(f"demo: backend pid {backend.pid} on :{backend_port}, gateway pid {gateway.pid} on :{gateway_port}, "
          f"gRPC service pid {grpc_server.pid} on :{grpc_port}, model server pid {llm_server.pid} on :{llm_port}")  # fmt: skip
    counters = Counters()
    resources = ProcessResources()
    consumer, _metrics = build_consumer(args, resources, counters)
    dds = start_dds_pipeline() if getattr(args, "dds", False) else None
    pids = [backend.pid, gateway.pid, grpc_server.pid, grpc_client.pid, llm_server.pid]
    pids += [proc.pid for proc in (gpu_server, batching, dds) if proc is not None]
    profiles = ProfileConfig(hz=DEMO_PROFILE_HZ)
    source = EbpfSource(CaptureConfig(pids=pids, comms=["curl"], capture_udp=dds is not None, profiles=profiles))
    pipeline = build_pipeline(consumer, resources, counters, source=source)
    profile_exporter, flamegraph = build_profile_exporters(args, counters)
    agent = Agent(source, pipeline, consumer, counters)
    try:
        try:
            probes = source.start()
        except CaptureError as exc:
            print(f"otelbpf: {exc}", file=sys.stderr)
            return 1
        print(f"otelbpf: tracing, {probes} probes attached")
        if source.profiles is not None:
            attach_profiles(pipeline, source.profiles, [profile_exporter], resources, counters, profiles.hz)
        loop = threading.Thread(target=agent.run, name="otelbpf-agent")
        loop.start()
        try:
            statuses = drive_traffic(gateway_port, args.requests)
            print(f"demo: drove {sum(statuses.values())} requests through the gateway, statuses {statuses}")
            calls, _ = grpc_client.communicate("go\n", timeout=60)
            print(f"demo: gRPC calls {' '.join(line.split(maxsplit=1)[1] for line in calls.splitlines())}")
            print(f"demo: LLM calls (streamed chat, chat, embeddings) statuses {' '.join(drive_llm(llm_port))}")
            if gpu_server is not None:
                print(f"demo: GPU inferences (stand-in CUDA libraries) statuses {' '.join(drive_gpu(gpu_port))}")
            if batching is not None:
                print(f"demo: 3 concurrent requests to the batching engine (one 'gpu step' span, linked to each) "
                      f"statuses {' '.join(drive_batching(batching_port))}")  # fmt: skip
            if dds is not None:
                drive_dds(dds)
                print("demo: camera -> detector -> planner sent 3 frames over DDS (rt/camera/image, rt/detector/objects)")
            time.sleep(0.5)
        finally:
            # The agent thread reads the source: stop it before the source closes.
            agent.request_stop()
            loop.join()
    finally:
        source.close()
        if grpc_client.poll() is None:
            grpc_client.kill()
        for proc in (gateway, backend, grpc_server, llm_server, gpu_server, batching, dds):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=5)
    stats = agent.stats()
    if gpu_server is not None:
        print_gpu_memory(pipeline, gpu_server.pid)
    print(f"demo: {stats.get('otelbpf.spans.created', 0)} spans; OTLP JSON written to {args.json_file}")
    if flamegraph and source.profiles is not None:
        samples = sum(v for k, v in stats.items() if k.startswith("otelbpf.profiles.samples{"))
        print(f"demo: {samples} stack samples; flame graph written to {flamegraph} (open it in a browser)")
    print(f"demo: self-metrics {json.dumps(stats)}")
    problems = demo_problems(stats, args.json_file, flamegraph if source.profiles is not None else None)
    for problem in problems:
        print(f"otelbpf demo: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


def demo_problems(stats: dict[str, int], json_file: str, flamegraph: str | None) -> list[str]:
    """What the demo promised and did not deliver: trace trees on the console, the OTLP
    JSON file, the flame graph. A demo that traced nothing exits non-zero, so that
    `make demo` (and CI, which runs it) cannot pass on an empty run."""
    problems = []
    if not stats.get("otelbpf.spans.created"):
        problems.append("no span was traced (is this host able to trace? run `otelbpf doctor`)")
    elif not stats.get("otelbpf.export.spans{console}"):
        problems.append("no trace tree was printed")
    if not os.path.isfile(json_file) or os.path.getsize(json_file) == 0:
        problems.append(f"no OTLP JSON in {json_file}")
    if flamegraph is not None and (not os.path.isfile(flamegraph) or os.path.getsize(flamegraph) == 0):
        problems.append(f"no flame graph in {flamegraph}")
    return problems
