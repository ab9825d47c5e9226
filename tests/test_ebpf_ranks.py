"""Slow ranks across nodes, for real: two network namespaces ("nodes"), two NCCL ranks in each
on the stand-in libraries (examples/cuda_standin: collectives that wait for every rank), one
agent per node tracing only its node's ranks, a stand-in NCCL RAS server in each node's
namespace (examples/nccl_ras_standin.py), and Debian's real Prometheus scraping both agents'
/metrics and evaluating the shipped rules (deploy/prometheus/otelbpf-rules.yaml, windows
shortened from 5 minutes to 15 seconds, nothing else changed).

One rank is made slow in each way the rules tell apart (compute: a longer GPU wait; host: a
busy thread before the launch; communication: a slower collective) and each time:

* every rank's span of each all-reduce instance is in one trace, across both agents' output
  (each all-reduce's element count names its instance: one count per trace);
* Prometheus names the slow rank, its node and its kind, and never anything else for that
  communicator while it ran; every query of the shipped Grafana dashboard finds data.

Then node-b's agent is restarted after its ranks' communicator was created: while no RAS
answers on node-b its spans stay unjoined and counted, and the rules name no rank (the tempting
one, which waits least of those measured, is not the slow one); once RAS answers it aligns on
NCCL's counts and joins the right instances only, and the rules name the slow rank.

The three kinds and the late agent share one set-up (namespaces, agents, RAS stand-ins,
Prometheus): agents follow each scenario's new rank processes (``--pid`` of a launcher).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT, AgentProcess, wait_until
from test_ebpf_http import spans_in_file

from protocols.nccl.comm_hash import comm_hash

pytestmark = pytest.mark.ebpf

STANDIN = ROOT / "examples" / "cuda_standin"
RULES = ROOT / "deploy" / "prometheus" / "otelbpf-rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "otelbpf-nccl-ranks.json"
LAUNCHER = Path(__file__).with_name("ranks_launcher.py")
NODES = ("node-a", "node-b")
RANK_NODE = {0: 0, 1: 0, 2: 1, 3: 1}
SYNC_US = 2000
DELAY_MS = 15
COLLECTIVES = 1200
#: The previous scenario's rank processes exited: the agent detaches their uprobes one by one
#: before it scans again (tens of seconds on a busy 2-vCPU VM, shared with other tests' probes).
PROBE_WAIT_S = 240
#: An agent stopping detaches every uprobe it attached, one by one: as long.
STOP_WAIT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    netns: str
    address: str
    launcher: subprocess.Popen
    port: int
    spans: Path
    agent: AgentProcess | None = None
    ras: subprocess.Popen | None = None
    pids: dict[str, int] = field(default_factory=dict)

    def command(self, text: str) -> str:
        self.launcher.stdin.write(text + "\n")
        self.launcher.stdin.flush()
        return self.launcher.stdout.readline().strip()


@dataclass
class Cluster:
    nodes: list[Node]
    prefix: bytes
    prometheus: str
    tmp: Path
    #: the rank processes of the scenario running
    current_pids: set[int] = field(default_factory=set)

    def query(self, expr: str) -> list[dict]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.load(reply)["data"]["result"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict]:
        url = f"{self.prometheus}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": start, "end": end, "step": 1})
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.load(reply)["data"]["result"]

    def alerts(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.prometheus}/api/v1/alerts", timeout=10) as reply:
            return json.load(reply)["data"]["alerts"]


def start_agent(node: Node) -> AgentProcess:
    node.agent = AgentProcess(
        ["--pid", str(node.launcher.pid), "--json-file", str(node.spans), "--no-profiles",
         "--prometheus-port", str(node.port), "--nccl-ras-interval", "1", "--metrics-interval", "3600"],
        env={"OTEL_RESOURCE_ATTRIBUTES": f"host.name={node.name}"},
    )  # fmt: skip
    return node.agent


def start_ras(node: Node, prefix: bytes) -> None:
    node.ras = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, sys.executable, str(EXAMPLES / "nccl_ras_standin.py"), "--listen",
         "localhost:28028", "--shm-glob", f"/dev/shm/nccl-standin-{prefix.hex()}*"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert node.ras.stdout.readline().strip() == "listening"


def stop_ras(node: Node) -> None:
    if node.ras is not None:
        node.ras.kill()
        node.ras.wait()
        node.ras = None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root (eBPF, network namespaces)")
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("Debian's prometheus is not installed (scripts/install.sh installs it)")
    subprocess.run(["make", "-s", "-C", str(STANDIN)], check=True)
    tmp = tmp_path_factory.mktemp("ranks")
    prefix = os.urandom(4)
    tag = f"{os.getpid() % 100000}"
    nodes: list[Node] = []
    prom = None
    try:
        for index, name in enumerate(NODES):
            netns = f"otelbpf-rk{tag}-{name[-1]}"
            subprocess.run(["ip", "netns", "add", netns], check=True)
            subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
            launcher = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, str(LAUNCHER)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
            assert launcher.stdout.readline().strip() == "launcher"
            nodes.append(Node(name, netns, f"10.201.0.{index + 1}", launcher, free_port(), tmp / f"{name}.json"))
        for node in nodes:
            start_ras(node, prefix)
            start_agent(node)
        rules = tmp / "rules.yaml"  # the shipped rules, over 15 s windows instead of 5 min
        rules.write_text(RULES.read_text().replace("[5m]", "[15s]").replace("for: 5m", "for: 3s")
                         .replace("for: 2m", "for: 3s").replace("for: 1m", "for: 3s"))  # fmt: skip
        port = free_port()
        (tmp / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "otelbpf",
                                "static_configs": [{"targets": [f"127.0.0.1:{n.port}" for n in nodes]}]}],
        }))  # fmt: skip
        prom = subprocess.Popen(
            [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("w"),
        )  # fmt: skip
        cluster = Cluster(nodes, prefix, f"http://127.0.0.1:{port}", tmp)
        assert wait_until(lambda: _answers(cluster), timeout=30), (tmp / "prometheus.log").read_text()[-2000:]
        assert wait_until(lambda: len(cluster.query('up{job="otelbpf"} == 1')) == 2, timeout=30)
        yield cluster
    finally:
        if prom is not None:
            prom.kill()
            prom.wait()
        for node in nodes:
            with contextlib.suppress(Exception):
                node.command("stop")
            node.launcher.kill()
            node.launcher.wait()
            if node.agent is not None and node.agent.proc.poll() is None:
                node.agent.proc.kill()
                node.agent.proc.wait()
            stop_ras(node)
            subprocess.run(["ip", "netns", "del", node.netns], check=False)
        for leftover in Path("/dev/shm").glob(f"nccl-standin-{prefix.hex()}*"):
            leftover.unlink(missing_ok=True)


def _answers(cluster: Cluster) -> bool:
    try:
        cluster.query("1")
        return True
    except OSError:
        return False


def rank_args(rank: int, unique_id: bytes, slow: dict[int, tuple[str, float]], sync_us: dict[int, int], extra=()) -> list[str]:
    args = ["--rank", str(rank), "--nranks", "4", "--id", unique_id.hex(), "--collectives", str(COLLECTIVES),
            "--sync-us", str(sync_us.get(rank, SYNC_US)), "--count-by-iteration", *extra]  # fmt: skip
    if rank in slow:
        kind, delay = slow[rank]
        args += ["--slow-rank", str(rank), "--slow-kind", kind, "--delay-ms", str(delay)]
    return args


def start_ranks(cluster: Cluster, slow, sync_us=None, extra=(), env=None) -> tuple[bytes, dict[int, str]]:
    """Four ranks of a new communicator (0, 1 on node-a; 2, 3 on node-b), loaded and waiting."""
    unique_id = cluster.prefix + os.urandom(124)
    names = {}
    for rank, index in RANK_NODE.items():
        node = cluster.nodes[index]
        name = f"{unique_id[4:8].hex()}-{rank}"
        rank_env = {"NCCL_STANDIN_HOST": node.address, "NCCL_STANDIN_BARRIER": "1", **(env or {})}
        spec = {"args": rank_args(rank, unique_id, slow, sync_us or {}, extra), "env": rank_env}
        answer = node.command(f"start {name} {json.dumps(spec)}")
        node.pids[name] = int(answer.split()[2])
        names[rank] = name
    for rank, name in names.items():
        assert cluster.nodes[RANK_NODE[rank]].command(f"expect {name} ready") == f"got {name} ready"
    return unique_id, names


def wait_probed(cluster: Cluster, names: dict[int, str], ranks=(0, 1, 2, 3)) -> None:
    """Each rank's agent has probed its NCCL (found at its periodic re-scan)."""
    for rank in ranks:
        node = cluster.nodes[RANK_NODE[rank]]
        probing = f"GPU: pid {node.pids[names[rank]]}: probing {STANDIN}/build/libnccl.so.2 "
        assert wait_until(lambda: probing in node.agent.output, timeout=PROBE_WAIT_S), node.agent.output[-3000:]


def go(cluster: Cluster, names: dict[int, str], word: str | None = None) -> None:
    for rank, name in names.items():
        assert cluster.nodes[RANK_NODE[rank]].command(f"go {name}") == f"went {name}"
    if word is not None:
        for rank, name in names.items():
            assert cluster.nodes[RANK_NODE[rank]].command(f"expect {name} {word}") == f"got {name} {word}"


def finish(cluster: Cluster, names: dict[int, str]) -> None:
    for rank, name in names.items():
        assert cluster.nodes[RANK_NODE[rank]].command(f"expect {name} done") == f"got {name} done"


def verdicts(cluster: Cluster, comm: int) -> list[dict]:
    return [r["metric"] for r in cluster.query(f'otelbpf:nccl_slow_rank:info{{otelbpf_nccl_comm_hash="{comm:016x}"}}')]


def collective_spans(cluster: Cluster) -> list:
    """The all-reduce spans of the scenario's rank processes in both agents' output, joined or not."""
    out = []
    for node in cluster.nodes:
        if node.spans.exists():
            out += [s for s in spans_in_file(node.spans)
                    if s.name == "ncclAllReduce" and s.resource.get("process.pid") in cluster.current_pids]  # fmt: skip
    return out


def check_one_trace_per_instance(spans, expected_ranks=(0, 1, 2, 3), instances: int | None = COLLECTIVES) -> dict:
    """Every joined span sits in its instance's trace with the other ranks' spans of that
    instance, one per rank, all with the same element count (the instance's number)."""
    by_trace = defaultdict(list)
    for span in spans:
        if "otelbpf.nccl.sequence" in span.attributes:
            by_trace[span.span.trace_id].append(span)
    for members in by_trace.values():
        assert len({s.attributes["otelbpf.nccl.count"] for s in members}) == 1, [s.attributes for s in members]
        ranks = sorted(s.attributes["otelbpf.nccl.rank"] for s in members)
        assert len(ranks) == len(set(ranks))  # each rank once
        assert set(ranks) <= set(expected_ranks)
    if instances is not None:
        assert len(by_trace) == instances
        assert all(sorted(s.attributes["otelbpf.nccl.rank"] for s in m) == list(expected_ranks) for m in by_trace.values())
        assert all({s.resource["host.name"] for s in m} == set(NODES) for m in by_trace.values())  # both agents' output
    return by_trace


def run_kind(cluster: Cluster, rank: int, kind: str, env=None) -> None:
    unique_id, names = start_ranks(cluster, {rank: (kind, DELAY_MS)}, env=env)
    cluster.current_pids = {cluster.nodes[RANK_NODE[r]].pids[n] for r, n in names.items()}
    comm = comm_hash(unique_id)
    wait_probed(cluster, names)
    started = time.time()
    go(cluster, names)
    expected = {"otelbpf_nccl_comm_hash": f"{comm:016x}", "otelbpf_nccl_rank": str(rank),
                "host_name": NODES[RANK_NODE[rank]], "kind": kind}  # fmt: skip
    named = wait_until(lambda: any(_verdict(v) == expected for v in verdicts(cluster, comm)), timeout=60, interval=1)
    firing = wait_until(lambda: any(a["labels"].get("alertname") == "NcclSlowRank" and a["state"] == "firing"
                                    and a["labels"].get("otelbpf_nccl_comm_hash") == f"{comm:016x}" for a in cluster.alerts()),
                        timeout=30, interval=1)  # fmt: skip
    empty = wait_until(lambda: not empty_dashboard_queries(cluster, comm), timeout=20, interval=1) or empty_dashboard_queries(cluster, comm)
    finish(cluster, names)
    history = cluster.query_range(f'otelbpf:nccl_slow_rank:info{{otelbpf_nccl_comm_hash="{comm:016x}"}}', started, time.time())
    waits = cluster.query(f'otelbpf:nccl_rank_state_seconds:mean5m{{otelbpf_nccl_comm_hash="{comm:016x}"}}')
    assert named, (verdicts(cluster, comm), waits)
    assert firing, cluster.alerts()
    assert [_verdict(series["metric"]) for series in history] == [expected]  # never another rank or kind
    assert empty is True, f"dashboard queries without data: {empty}"
    # The last spans leave with the agents' next export, later when a busy agent detaches the
    # exited ranks' probes first.
    complete = wait_until(lambda: len(collective_spans(cluster)) >= 4 * COLLECTIVES, timeout=90)
    spans = collective_spans(cluster)
    assert complete and len(spans) == 4 * COLLECTIVES, (missing(spans), cluster.query('{__name__=~"otelbpf_(events_lost|nccl_spans_unmatched|calls_unhandled|spans_failed)_total"}'))
    check_one_trace_per_instance(spans)


def empty_dashboard_queries(cluster: Cluster, comm: int) -> list[str]:
    """The shipped Grafana dashboard's queries (deploy/grafana) that find no series of the
    communicator (its panels would be blank)."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return [q for q in queries if not cluster.query(q.replace("$communicator", f"{comm:016x}").replace("[5m]", "[15s]"))]


def missing(spans) -> dict:
    """Which instances (element counts) each rank's spans lack: a failure's explanation."""
    seen = defaultdict(set)
    for span in spans:
        seen[(span.resource["host.name"], span.resource["process.pid"])].add(span.attributes["otelbpf.nccl.count"])
    return {rank: sorted(set(range(1, COLLECTIVES + 1)) - counts)[:20] for rank, counts in seen.items()}


def _verdict(metric: dict) -> dict:
    return {key: metric.get(key) for key in ("otelbpf_nccl_comm_hash", "otelbpf_nccl_rank", "host_name", "kind")}


def test_a_compute_slow_rank_is_named_and_every_instance_is_one_trace(cluster):
    run_kind(cluster, 2, "compute")


def test_a_host_slow_rank_is_named(cluster):
    run_kind(cluster, 1, "host")


def test_a_communication_slow_rank_is_named(cluster):
    run_kind(cluster, 3, "communication", env={"NCCL_STANDIN_US": "1000"})


def test_a_late_agent_joins_no_wrong_instance_and_aligns_on_nccls_counts(cluster):
    """Node-b's agent is restarted after its ranks' communicator was created (and 40
    all-reduces made): it never sees the set-up. Rank 3 (node-b) is compute-slow, rank 1
    (node-a) somewhat (5 ms more GPU wait): of the ranks measured without node-b's, rank 1
    waits least, the tempting wrong answer. Each rank has 20 ms of GPU work per step, so that
    RAS gathers find the fast ranks between collectives (a reply aligns a handle only then).

    First, no RAS answers on node-b: node-b's spans stay unjoined and counted, the agent says
    so once, and the rules name no rank. Then node-b's RAS answers: the agent aligns on
    NCCL's counts, joins the right instances only (each joined span's sequence is its
    instance's), and the rules name rank 3, compute-slow, on node-b, and nothing else."""
    node_b = cluster.nodes[1]
    assert node_b.agent.stop(timeout=STOP_WAIT_S) == 0
    stop_ras(node_b)
    try:
        sync_us = 20_000
        unique_id, names = start_ranks(cluster, {3: ("compute", DELAY_MS)}, extra=("--init-first", "--before", "40"),
                                       sync_us={0: sync_us, 1: sync_us + 5000, 2: sync_us, 3: sync_us})  # fmt: skip
        cluster.current_pids = {cluster.nodes[RANK_NODE[r]].pids[n] for r, n in names.items()}
        comm = comm_hash(unique_id)
        info = f'otelbpf:nccl_slow_rank:info{{otelbpf_nccl_comm_hash="{comm:016x}"}}'
        wait_probed(cluster, names, ranks=(0, 1))  # node-a's agent sees the set-up
        go(cluster, names, "initialised")
        late_agent = start_agent(node_b)  # after the set-up: node-b's agent never sees it
        wait_probed(cluster, names, ranks=(2, 3))
        started = time.time()
        go(cluster, names)

        # Without RAS on node-b.
        measured = f'otelbpf:nccl_rank_wait_seconds:mean5m{{otelbpf_nccl_comm_hash="{comm:016x}"}}'
        assert wait_until(lambda: len(cluster.query(measured)) == 2, timeout=60, interval=1)
        time.sleep(10)  # the rules had time to misjudge, had they been going to
        waits = {r["metric"]["otelbpf_nccl_rank"]: float(r["value"][1]) for r in cluster.query(measured)}
        without_ras = time.time()
        history_without = cluster.query_range(info, started, without_ras)
        said = late_agent.output.count("NCCL RAS: no answer on localhost:28028")
        early = [s for s in collective_spans(cluster) if s.resource["host.name"] == "node-b"]

        # With RAS on node-b.
        start_ras(node_b, cluster.prefix)
        expected = {"otelbpf_nccl_comm_hash": f"{comm:016x}", "otelbpf_nccl_rank": "3", "host_name": "node-b", "kind": "compute"}
        named = wait_until(lambda: any(_verdict(v) == expected for v in verdicts(cluster, comm)), timeout=60, interval=1)
        finish(cluster, names)
        history = cluster.query_range(info, started, time.time())
        assert late_agent.stop(timeout=STOP_WAIT_S) == 0
    finally:
        if node_b.ras is None:
            start_ras(node_b, cluster.prefix)
    assert sorted(waits) == ["0", "1"] and waits["1"] < waits["0"]  # rank 1 waits least of those measured ...
    assert history_without == []  # ... and is never named: ranks 2 and 3 are not measured
    assert said == 1  # said once
    assert early and all(s.attributes.get("otelbpf.nccl.unjoined") == "setup_not_seen" for s in early)
    assert named
    assert [_verdict(series["metric"]) for series in history] == [expected]  # never another rank or kind
    assert "set-up not seen, aligned on NCCL's counts (RAS)" in late_agent.output

    spans = collective_spans(cluster)
    late = [s for s in spans if s.resource["host.name"] == "node-b"]
    assert len(late) == 2 * (COLLECTIVES - 40)
    joined = [s for s in late if "otelbpf.nccl.sequence" in s.attributes]
    unjoined = [s for s in late if "otelbpf.nccl.sequence" not in s.attributes]
    assert joined and unjoined and {s.attributes["otelbpf.nccl.rank"] for s in joined} == {2, 3}
    assert all(s.attributes["otelbpf.nccl.sequence"] == s.attributes["otelbpf.nccl.count"] - 1 for s in joined)
    for rank in (2, 3):  # once aligned, a rank stays joined: its joined spans are its last ones
        counts = sorted(s.attributes["otelbpf.nccl.count"] for s in joined if s.attributes["otelbpf.nccl.rank"] == rank)
        assert counts == list(range(counts[0], COLLECTIVES + 1)), rank
    stats = late_agent.stats()
    assert sum(v for k, v in stats.items() if k.startswith("otelbpf.nccl.collectives.unjoined")) == len(unjoined)
    by_trace = check_one_trace_per_instance(spans, instances=None)
    assert any(len(members) == 4 for members in by_trace.values())
    node_b.agent = None  # stopped: the cluster's teardown has nothing to stop
