"""What tracing DDS costs a publisher, and the rate the agent traces without loss.

A Cyclone DDS publisher (examples/dds_pipeline.py camera, reliable, 64-byte
images) and a reader (sink) on loopback UDP, traced by ``otelbpf run --udp``
(OTLP JSON file) or not, alternated per round. Reported per target rate (1 kHz
and as fast as the publisher goes): the publisher's samples/s off and on,
their ratio, and the share of samples sent that became PRODUCER spans
(1.0 = traced without loss). Numbers, not asserts; quote only quiet-machine runs.

    .venv/bin/python bench/dds_rate.py [--seconds 5] [--rounds 3] [--rates 1000,0]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = str(ROOT / "examples" / "dds_pipeline.py")


def run_once(rate: float, seconds: float, traced: bool, workdir: Path) -> dict:
    frames = int(rate * seconds) if rate else int(20000 * seconds)
    launcher = subprocess.Popen(
        ["bash", "-c", f"read go; {sys.executable} {PIPELINE} sink --seconds {seconds + 15} > {workdir}/sink.out & sink=$!; "
         f"sleep 1; {sys.executable} {PIPELINE} camera --quiet --frames {frames} --rate {rate} --linger 1; kill $sink; wait"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    agent = None
    spans_file = workdir / f"spans-{time.monotonic_ns()}.json"
    if traced:
        agent = subprocess.Popen(
            [sys.executable, "-m", "otelbpf", "run", "--pid", str(launcher.pid), "--udp", "--json-file", str(spans_file)],
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in agent.stderr:
            if line.startswith("otelbpf: tracing"):
                break
    out, _ = launcher.communicate("go\n", timeout=seconds * 10 + 60)
    achieved = next((float(line.split()[1]) for line in out.splitlines() if line.startswith("rate ")), 0.0)
    result = {"rate": rate, "traced": traced, "frames": frames, "samples_per_s": achieved}
    if agent is not None:
        agent.send_signal(signal.SIGINT)
        agent.communicate(timeout=60)
        sent_spans = sum(1 for span in _spans(spans_file) if span.get("kind") == 4 and "rt/camera/image" in span.get("name", ""))
        result["producer_spans"] = sent_spans
        result["traced_share"] = sent_spans / frames if frames else 0.0
    return result


def _spans(path: Path):
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        for resource_spans in json.loads(line).get("resourceSpans", []):
            for scope_spans in resource_spans.get("scopeSpans", []):
                yield from scope_spans.get("spans", [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rates", default="1000,0", help="target samples/s, comma-separated (0: as fast as possible)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("dds_rate: run as root (the agent loads eBPF programs)")
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(r) for r in args.rates.split(",")):
            off, on, shares = [], [], []
            for _ in range(args.rounds):
                off.append(run_once(rate, args.seconds, False, Path(tmp))["samples_per_s"])
                traced = run_once(rate, args.seconds, True, Path(tmp))
                on.append(traced["samples_per_s"])
                shares.append(traced["traced_share"])
            row = {
                "target": rate or "max",
                "off_samples_per_s": statistics.median(off),
                "on_samples_per_s": statistics.median(on),
                "ratio": statistics.median(on) / statistics.median(off) if statistics.median(off) else 0.0,
                "traced_share": min(shares),
                "raw": {"off": off, "on": on, "traced_share": shares},
            }
            report.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "raw"}), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
