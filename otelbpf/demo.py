"""`otelbpf demo`: trace the bundled example services end to end.

Starts examples/http_backend.py and examples/http_gateway.py (unmodified
Python services), and with ``--dds`` the examples/dds_pipeline.py chain over
Cyclone DDS (traced with UDP capture), attaches the probes to them and to curl, drives requests
through the gateway with curl, then prints the trace trees and writes the
OTLP JSON file. The same code path as `otelbpf run`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from otelbpf.cli import build_consumer, preflight

log = logging.getLogger("otelbpf")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


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
    from otelbpf.agent import Agent, live_pipeline
    from otelbpf.resources import ProcessResources
    from otelbpf.selfmetrics import Counters
    from otelbpf.sources.ebpf import CaptureConfig, CaptureError, EbpfSource

    if not preflight():
        return 1
    args.console = True
    args.metrics_interval = None
    backend, backend_port = start_service([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    gateway, gateway_port = start_service(
        [str(EXAMPLES / "http_gateway.py"), "--port", "0", "--backend", f"127.0.0.1:{backend_port}"]
    )
    print(f"demo: backend pid {backend.pid} on :{backend_port}, gateway pid {gateway.pid} on :{gateway_port}")
    dds = start_dds_pipeline() if getattr(args, "dds", False) else None
    pids = [backend.pid, gateway.pid] + ([dds.pid] if dds is not None else [])
    counters = Counters()
    resources = ProcessResources()
    consumer, _metrics = build_consumer(args, resources, counters)
    source = EbpfSource(CaptureConfig(pids=pids, comms=["curl"], capture_udp=dds is not None))
    pipeline = live_pipeline(source, consumer, resources, counters)
    agent = Agent(source, pipeline, consumer, counters)
    try:
        try:
            probes = source.start()
        except CaptureError as exc:
            print(f"otelbpf: {exc}", file=sys.stderr)
            return 1
        print(f"otelbpf: tracing, {probes} probes attached")
        loop = threading.Thread(target=agent.run, name="otelbpf-agent")
        loop.start()
        statuses = drive_traffic(gateway_port, args.requests)
        print(f"demo: drove {sum(statuses.values())} requests through the gateway, statuses {statuses}")
        if dds is not None:
            drive_dds(dds)
            print("demo: camera -> detector -> planner sent 3 frames over DDS (rt/camera/image, rt/detector/objects)")
        time.sleep(0.5)
        agent.request_stop()
        loop.join()
    finally:
        source.close()
        for proc in (gateway, backend, dds):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=5)
    stats = agent.stats()
    print(f"demo: {stats.get('otelbpf.spans.created', 0)} spans; OTLP JSON written to {args.json_file}")
    print(f"demo: self-metrics {json.dumps(stats)}")
    return 0
