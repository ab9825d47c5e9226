#!/usr/bin/env python3
"""What cross-node propagation costs (docs/cross-node.md), side by side with it off.

Two nodes on this machine, as the tests build them (tests/netnodes.py: two network
namespaces joined by a veth pair, a cgroup and a launcher each), nginx on node B, the
clients (wrk, curl) on node A, one agent per node tracing its own processes. Each window
starts both agents fresh in one mode, runs every part's load in turn, and stops them; the
modes alternate round after round so that the machine's drift hits them alike:

* ``none``: no agent (the reference for throughput);
* ``off``: both agents, ``--propagation off`` (nothing compiled in, nothing on the wire);
* ``tcp``: both agents, ``--propagation tcp`` (the default): A writes an option on every
  request, B reads and adopts it.

Parts (``--only``):

* ``requests``: ``wrk -t1 -c1`` (one keep-alive connection: every request a new turn, so
  every request carries a context) at ``--rate`` requests/s (default 2000, which the agents
  keep up with) for ``--seconds``: **kernel ns per request** on each
  node (``kernel.bpf_stats_enabled``: every program of the agent, per run, summed, divided by
  the requests) and **agent µs of CPU per request** on each node (utime + stime until caught
  up), off against tcp;
* ``nginx``: ``wrk -t1 -c50`` at saturation: requests per second, **tcp / off** and
  **off / none**;
* ``bulk``: ``--bulk-mb`` MiB down (GET of a static file) and up (POST, discarded by nginx)
  with curl, one transfer per window: MB/s, tcp / off.

Numbers, not asserts. Run as root from the project's venv, with nginx, wrk and curl
installed; on a 2-vCPU machine shared with other work, quote medians of several rounds.
Writes the report as JSON to bench/results/crossnode_cost-<UTC time>.json.

    .venv/bin/python bench/crossnode_cost.py                     # every part, 3 rounds
    .venv/bin/python bench/crossnode_cost.py --only bulk --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import bpf_stats  # noqa: E402
from netnodes import TwoNodes  # noqa: E402

NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile off;
    tcp_nodelay on;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    default_type text/plain;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    server {{
        listen {address}:{port} backlog=4096;
        client_max_body_size 0;
        location = / {{ return 200 "hello\\n"; }}
        location = /upload {{ return 204; }}
        location /files/ {{ root {dir}/www; }}
    }}
}}
"""


class Agent:
    """``otelbpf run`` for one node: its launcher's tree, its cgroup, one mode."""

    def __init__(self, node, mode: str, out: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otelbpf", "run", "--pid", str(node.pid), "--propagation", mode,
             "--propagation-cgroup", node.cgroup, "--json-file", str(out), "--no-profiles"],
            cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line)
                if line.startswith("otelbpf: tracing,"):
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(180) or self.proc.poll() is not None:
            raise RuntimeError("agent did not start:\n" + "".join(self.lines))

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        for line in reversed(self.lines):
            if line.startswith("otelbpf: stats "):
                return json.loads(line[len("otelbpf: stats ") :])
        return {}


def wait_idle(agents: list[Agent], max_s: float = 10.0) -> None:
    """Until the agents have caught up (their CPU falls below 0.1 core)."""
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        before = sum(a.cpu_seconds() for a in agents)
        time.sleep(0.5)
        if (sum(a.cpu_seconds() for a in agents) - before) / 0.5 < 0.1:
            return


def start_nginx(node, workdir: Path) -> tuple[int, Path]:
    d = workdir / "nginx"
    (d / "tmp").mkdir(parents=True, exist_ok=True)
    files = d / "www" / "files"
    files.mkdir(parents=True, exist_ok=True)
    for path in (workdir, d, d / "www", files):
        path.chmod(0o755)
    port = 18000 + os.getpid() % 1000
    (d / "nginx.conf").write_text(NGINX_CONF.format(dir=d, address=node.ipv4, port=port))
    node.start(["sh", "-c", f'echo "listening on {port}"; exec nginx -c {d}/nginx.conf'])
    return port, files


def wrk_at_rate(node, url: str, seconds: int, rate: float, workdir: Path) -> int:
    """``wrk -t1 -c1`` at a fixed rate (bench/wrkbench's rate.lua: Debian's wrk has no -R),
    so that the agents keep up and their CPU per request is their cost, not a saturated
    share; the requests sent."""
    from wrkbench.wrk import LUA_COMMON, LUA_RATE

    script = workdir / "rate.lua"
    script.write_text(LUA_COMMON.replace("{PATHS}", '{"/"}') + LUA_RATE)
    script.chmod(0o644)
    out = node.run(["wrk", "-t1", "-c1", f"-d{seconds}s", "-s", str(script), url, "--", f"{rate:.3f}"],
                   timeout=seconds + 60)["stdout"]  # fmt: skip
    line = next((l for l in out.splitlines() if l.startswith("NWB_RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk said: {out}")
    return json.loads(line[len("NWB_RESULT ") :])["requests"]


def wrk(node, url: str, seconds: int, connections: int) -> float:
    out = node.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url], timeout=seconds + 60)["stdout"]
    match = re.search(r"(\d+) requests in", out)
    if not match:
        raise RuntimeError(f"wrk said: {out}")
    return int(match.group(1))


#: The windows' modes, in the order each round runs them.
MODES = ("none", "off", "tcp")


def window(nodes, mode: str, loads: dict) -> dict:
    """One measured window: both agents started in ``mode`` (none: no agent), then each
    part's ``load(agents)`` in turn; each part's result, with the agents' final stats."""
    agents = [] if mode == "none" else [Agent(n, mode, Path(os.devnull)) for n in nodes.nodes]
    results = {}
    try:
        for part, load in loads.items():
            results[part] = load(agents)
            wait_idle(agents)
    finally:
        stats = [a.stop() for a in agents]
    for result in results.values():
        result["stats"] = stats
    return results


def part_requests(nodes, url: str, seconds: int, workdir: Path, rate: float = 0) -> dict:
    a, b = nodes.nodes

    def load(agents):
        was = bpf_stats.set_stats(True)
        try:
            before = [bpf_stats.snapshot(x.proc.pid) for x in agents]
            cpu_before = [x.cpu_seconds() for x in agents]
            requests = wrk_at_rate(a, url, seconds, rate, workdir) if rate else wrk(a, url, seconds, 1)
            wait_idle(agents)
            after = [bpf_stats.snapshot(x.proc.pid) for x in agents]
            cpu_after = [x.cpu_seconds() for x in agents]
        finally:
            bpf_stats.set_stats(was)
        out = {"requests": requests, "rate": rate}
        for name, agent_before, agent_after, c0, c1 in zip("ab", before, after, cpu_before, cpu_after):
            result = bpf_stats.delta(agent_before, agent_after, requests)
            out[f"kernel_ns_per_request_{name}"] = result["total_ns"] / requests
            out[f"programs_{name}"] = {p["name"]: round(p["ns_per_request"], 1) for p in result["programs"] if p["runs"]}
            out[f"agent_us_per_request_{name}"] = (c1 - c0) * 1e6 / requests
        return out

    return load


def part_nginx(nodes, url: str, seconds: int):
    a, _ = nodes.nodes

    def load(agents):
        return {"rps": wrk(a, url, seconds, 50) / seconds}

    return load


def part_bulk(nodes, base: str, size_mb: int, upload: Path):
    a, _ = nodes.nodes

    def load(agents):
        speeds = {}
        for what, args in (("down", ["-o", "/dev/null", f"{base}/files/bulk.bin"]),
                           ("up", ["-o", "/dev/null", "--data-binary", f"@{upload}", f"{base}/upload"])):  # fmt: skip
            out = a.run(["curl", "-sf", "-w", "%{speed_download} %{speed_upload}", *args], timeout=600)["stdout"]
            down, up = (float(x) for x in out.split()[-2:])
            speeds[f"{what}_MBps"] = (down if what == "down" else up) / 1e6
        return speeds

    return load


def median_of(windows: list[dict], key: str) -> float:
    return statistics.median(w[key] for w in windows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="requests,nginx,bulk")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8, help="length of a wrk window")
    parser.add_argument("--bulk-mb", type=int, default=256)
    parser.add_argument("--rate", type=float, default=2000,
                        help="requests/s of the requests part (0: as fast as one connection goes, which"
                        " saturates the agents on a small machine: their CPU per request is then a share)")
    parser.add_argument("--output")
    args = parser.parse_args()
    parts = args.only.split(",")
    report: dict = {"parts": {}, "rounds": args.rounds, "machine": os.uname().release, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="crossnode-bench-") as tmp, TwoNodes() as nodes:
        workdir = Path(tmp)
        workdir.chmod(0o755)
        _, b = nodes.nodes
        port, files = start_nginx(b, workdir)
        base = f"http://{b.ipv4}:{port}"
        time.sleep(0.5)
        bulk_file = files / "bulk.bin"
        upload = workdir / "upload.bin"
        if "bulk" in parts:
            data = os.urandom(args.bulk_mb * 1024 * 1024)
            bulk_file.write_bytes(data)
            bulk_file.chmod(0o644)
            upload.write_bytes(data)
        loads = {
            "requests": part_requests(nodes, f"{base}/", args.seconds, workdir, args.rate),
            "nginx": part_nginx(nodes, f"{base}/", args.seconds),
            "bulk": part_bulk(nodes, base, args.bulk_mb, upload),
        }
        windows: dict[str, dict[str, list[dict]]] = {part: {m: [] for m in MODES} for part in parts}
        for round_ in range(args.rounds):
            for mode in MODES:
                wanted = [p for p in parts if mode != "none" or p != "requests"]  # no agent: no agent cost
                for part, result in window(nodes, mode, {p: loads[p] for p in wanted}).items():
                    windows[part][mode].append(result)
                    shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in result.items()
                             if not isinstance(v, (dict, list))}  # fmt: skip
                    print(f"[{part}] round {round_ + 1} {mode}: {shown}", flush=True)
        for part in parts:
            report["parts"][part] = windows[part]
            summarize(part, windows[part])
    name = args.output or ROOT / "bench" / "results" / f"crossnode_cost-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    Path(name).parent.mkdir(parents=True, exist_ok=True)
    Path(name).write_text(json.dumps(report, indent=1))
    print(f"report: {name}")
    return 0


def summarize(part: str, windows: dict[str, list[dict]]) -> None:
    if part == "requests":
        for side in "ab":
            off = median_of(windows["off"], f"kernel_ns_per_request_{side}")
            tcp = median_of(windows["tcp"], f"kernel_ns_per_request_{side}")
            agent_off = median_of(windows["off"], f"agent_us_per_request_{side}")
            agent_tcp = median_of(windows["tcp"], f"agent_us_per_request_{side}")
            print(f"== node {side.upper()}: kernel {off:.0f} -> {tcp:.0f} ns/request (+{tcp - off:.0f}); "
                  f"agent {agent_off:.1f} -> {agent_tcp:.1f} us/request")  # fmt: skip
    elif part == "nginx":
        none, off, tcp = (median_of(windows[m], "rps") for m in ("none", "off", "tcp"))
        print(f"== nginx req/s: none {none:.0f}, off {off:.0f} ({off / none:.3f}x), tcp {tcp:.0f} "
              f"({tcp / none:.3f}x); tcp / off = {tcp / off:.3f}")  # fmt: skip
    elif part == "bulk":
        for key in ("down_MBps", "up_MBps"):
            none, off, tcp = (median_of(windows[m], key) for m in ("none", "off", "tcp"))
            print(f"== bulk {key}: none {none:.0f}, off {off:.0f}, tcp {tcp:.0f}; tcp / off = {tcp / off:.3f}")


if __name__ == "__main__":
    sys.exit(main())
