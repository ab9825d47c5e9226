"""Whole traces across nodes: two nodes on one machine, one agent each (docs/cross-node.md).

The module builds two network namespaces joined by a veth pair (tests/netnodes.py),
each with a cgroup and a launcher process, and starts one agent per node for all its
tests: node A's agent traces A's launcher and what it starts (``--pid``) and attaches
its sock_ops program to A's cgroup, as a DaemonSet's agent covers its node; node B's
likewise. Each agent sees one end of every connection between the nodes, so what joins
their traces is what the upstream agent put on the wire: the TCP option (OBI's layout)
by default. Each test starts its own servers and reads the spans of those (by port and
process) and how much the agents' counters grew while it ran.

Real clients and servers (curl, urllib, the openai SDK, grpcio) run unmodified;
both agents' OTLP JSON files are read with the official protobufs, and every
span's parent is checked across them. A tcpdump in a namespace checks the
bytes: what the option looks like, that a mode that is off writes nothing (nodes and
an agent of its own), that untraced processes are untouched; a stripped option leaves
one-side traces.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netnodes import Node, TwoNodes, remove_cgroup
from obi_option import KIND_OTEL, LEGACY_LEN, ObiStyleWriter, otel_option, segments

from conftest import EXAMPLES, ROOT, AgentProcess, wait_until
from otelbpf.sources import bpfsys
from otelbpf.sources.crossnode import cgroup2_root
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

SERVER, CLIENT = 2, 3  # OTLP SpanKind
CLIENTS = ROOT / "tests" / "clients"
PYTHON = sys.executable


# -- helpers -------------------------------------------------------------------------------


#: The agents log their self-metrics this often (the tests read the counters as they go).
STATS_INTERVAL_S = "0.5"


class NodeAgents:
    """One agent per node, each writing its own OTLP JSON file, running for the whole
    module: each test starts its own servers, and reads the spans of those (by port or
    process) and the counters' growth while it ran."""

    def __init__(self, nodes: TwoNodes, directory: Path, mode: str = "tcp") -> None:
        self.files = {}
        self.agents = {}
        for node in nodes.nodes:
            out = directory / f"node-{node.name}.json"
            self.files[node.name] = out
            self.agents[node.name] = AgentProcess(
                ["--pid", str(node.pid), "--propagation", mode, "--propagation-cgroup", node.cgroup,
                 "--json-file", str(out), "--no-profiles", "--stats-interval", STATS_INTERVAL_S]
            )  # fmt: skip

    def spans(self, node: str) -> list:
        path = self.files[node]
        return spans_in_file(path) if path.exists() else []

    def counters(self) -> dict[str, dict[str, int]]:
        """Both agents' self-metrics, logged after a fresh read of the kernel's counters
        (every second; a line every 0.5 s): three new lines each."""
        seen = {name: agent.output.count("otelbpf: stats ") for name, agent in self.agents.items()}
        wait_until(lambda: all(a.output.count("otelbpf: stats ") >= seen[n] + 3 for n, a in self.agents.items()))
        return {name: agent.stats() for name, agent in self.agents.items()}

    def grown(self, before: dict, node: str, name: str) -> int:
        return self.agents[node].stats().get(name, 0) - before[node].get(name, 0)

    def settled_growth(self, before: dict, expected: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
        """How much each (node, counter) grew since ``before``: once each reached at least
        what is expected (or 20 s passed), and after one more read of the kernel's counters (a
        count past it shows)."""
        wait_until(lambda: all(self.grown(before, n, c) >= v for (n, c), v in expected.items()), timeout=20)
        now = self.counters()
        return {(n, c): now[n].get(c, 0) - before[n].get(c, 0) for n, c in expected}

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.proc.send_signal(signal.SIGINT)
        for agent in self.agents.values():  # both at once: one SIGINT each, then wait
            try:
                rc = agent.proc.wait(timeout=180)  # detaching waits on the kernel, shared with other tracers
                agent._reader.join(timeout=5)
            except subprocess.TimeoutExpired:
                raise AssertionError("the agent did not stop:\n" + agent.output[-5000:]) from None
            assert rc == 0, agent.output

    def kill(self) -> None:
        for agent in self.agents.values():
            if agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()


@pytest.fixture(scope="module")
def two_nodes():  # noqa: F811 - one pair of nodes for the module
    with TwoNodes() as nodes:
        yield nodes


@pytest.fixture(scope="module")
def agents(two_nodes, tmp_path_factory):
    """Node A's and node B's agents, --propagation tcp (the default), for the module. At
    the end they are stopped (SIGINT) and their sock_ops programs must be gone."""
    running = NodeAgents(two_nodes, tmp_path_factory.mktemp("agents"))
    try:
        assert wait_until(lambda: all("otelbpf: stats " in a.output for a in running.agents.values()), timeout=10)
        yield running
        running.stop()
    finally:
        running.kill()
    for node in two_nodes.nodes:
        assert not [p for p in bpfsys.cgroup_programs(node.cgroup) if p.name == "prop_sock_ops"]


def of_kind(spans, kind: int) -> list:
    return sorted((s for s in spans if s.span.kind == kind), key=lambda s: s.span.start_time_unix_nano)


def clients_to(agents: NodeAgents, port: int) -> list:
    """Node A's CLIENT spans of calls to ``port``."""
    return [s for s in of_kind(agents.spans("a"), CLIENT) if s.attributes.get("server.port") == port]


def served_by(agents: NodeAgents, pid: int, node: str = "b") -> list:
    """A node's SERVER spans of the process ``pid``."""
    return [s for s in of_kind(agents.spans(node), SERVER) if s.resource["process.pid"] == pid]


def hop(agents: NodeAgents, server, clients: int, servers: int | None = None) -> tuple[list, list]:
    """Once they are all exported: node A's CLIENT spans to ``server`` (a Service on node
    B) and B's SERVER spans of it."""
    servers = clients if servers is None else servers
    wait_until(lambda: len(clients_to(agents, server.port)) >= clients
               and len(served_by(agents, server.pid)) >= servers, timeout=30)  # fmt: skip
    return clients_to(agents, server.port), served_by(agents, server.pid)


def assert_children_across(clients_a: list, servers_b: list, count: int) -> None:
    """Each of node B's SERVER spans is the child of one of node A's CLIENT spans, in its
    trace, and each CLIENT span has its one SERVER child: ``count`` hops joined."""
    by_span = {c.span.span_id: c for c in clients_a}
    assert len(servers_b) == count and len(clients_a) == count
    parents = set()
    for server in servers_b:
        parent = by_span.get(server.span.parent_span_id)
        assert parent is not None, f"{server.span.name} on node B has no parent on node A"
        assert parent.span.trace_id == server.span.trace_id
        assert server.attributes["otelbpf.association"] == "tcp_option"
        parents.add(parent.span.span_id)
    assert len(parents) == count


def tcpdump(node: Node, path: Path) -> subprocess.Popen:
    """Capture the node's veth until stopped (stop_capture)."""
    proc = subprocess.Popen(
        node.in_netns("tcpdump", "--immediate-mode", "-i", node.device, "-U", "-s", "256", "-w", str(path), "tcp"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert wait_until(lambda: path.exists() and path.stat().st_size > 0, timeout=10), proc.stderr.read()
    return proc


def stop_capture(proc: subprocess.Popen) -> None:
    time.sleep(0.3)  # let the last segments reach the file (tcpdump -U writes per packet)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=10)


def curl(node: Node, *args: str) -> str:
    return node.run(["curl", "-gsf", *args])["stdout"]


def start_backend(node: Node, host: str = "0.0.0.0"):
    return node.start([PYTHON, EXAMPLES / "http_backend.py", "--port", "0", "--host", host, "--delay-ms", "1"])


def warm_up(node: Node, gateway) -> None:
    """The gateway's first request with the agent on: its first call out (a request read
    before a process ever called out carries no context to its calls: see
    test_the_first_call_of_a_process_that_never_called_out_carries_no_context)."""
    curl(node, f"http://127.0.0.1:{gateway.port}/api/items/warm")


def after_warm_up(backend_spans: list) -> list:
    return [s for s in backend_spans if s.attributes["url.path"] != "/items/warm"]


def warmed_at(spans: list, gateway_pid: int) -> int:
    """When the gateway's warm-up request ended."""
    return max(s.span.end_time_unix_nano for s in spans
               if s.resource["process.pid"] == gateway_pid and s.attributes.get("url.path") == "/api/items/warm")


# -- HTTP/1 ----------------------------------------------------------------------------------


def test_http1_keep_alive_calls_join_the_other_nodes_trace(two_nodes, agents):
    """curl on node A, three requests on one keep-alive connection to a backend on node B:
    each of B's SERVER spans is the child of A's CLIENT span (the option on each request's
    first segment)."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    before = agents.counters()
    curl(a, *[f"http://{b.ipv4}:{backend.port}/items/{i}" for i in range(3)])
    assert_children_across(*hop(agents, backend, 3), 3)
    grown = agents.settled_growth(before, {("a", "otelbpf.propagation.contexts.written"): 3,
                                           ("b", "otelbpf.propagation.contexts.read"): 3,
                                           ("b", "otelbpf.propagation.adopted"): 3})  # fmt: skip
    assert list(grown.values())[1:] == [3, 3]
    assert grown["a", "otelbpf.propagation.contexts.written"] >= 3  # a retransmit carries it again


def test_plain_urllib_requests_join_the_other_nodes_trace(two_nodes, agents):
    """urllib (a new connection per request) on node A: each request's option joins."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    script = "import sys, urllib.request\nfor u in sys.argv[1:]: urllib.request.urlopen(u).read()"
    a.python("-c", script, *[f"http://{b.ipv4}:{backend.port}/items/{i}" for i in range(2)])
    assert_children_across(*hop(agents, backend, 2), 2)


def test_a_gateway_on_one_node_and_its_backend_on_another_form_one_trace(two_nodes, agents):
    """curl -> gateway (node A) -> backend (node B): curl's CLIENT, the gateway's SERVER and
    CLIENT spans, and the backend's SERVER span, one trace per request, every parent right."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    gateway = a.start([PYTHON, EXAMPLES / "http_gateway.py", "--port", "0", "--backend", f"{b.ipv4}:{backend.port}"])
    warm_up(a, gateway)
    for i in range(3):
        curl(a, f"http://127.0.0.1:{gateway.port}/api/items/{i}")
    hop(agents, backend, 4)
    wait_until(lambda: len(clients_to(agents, gateway.port)) >= 4 and len(served_by(agents, gateway.pid, "a")) >= 4)
    on_a = agents.spans("a")
    servers_b = after_warm_up(served_by(agents, backend.pid))
    assert len(servers_b) == 3
    by_id = {s.span.span_id: s for s in on_a}
    for backend_span in servers_b:
        call = by_id[backend_span.span.parent_span_id]  # the gateway's CLIENT span
        assert call.span.kind == CLIENT and call.attributes["otelbpf.association"] == "thread"
        served = by_id[call.span.parent_span_id]  # the gateway's SERVER span
        assert served.span.kind == SERVER and served.resource["process.pid"] == gateway.pid
        assert served.attributes["otelbpf.association"] == "connection"
        sent = by_id[served.span.parent_span_id]  # curl's CLIENT span, the root
        assert sent.span.kind == CLIENT and not sent.span.parent_span_id
        assert {backend_span.span.trace_id, call.span.trace_id, served.span.trace_id} == {sent.span.trace_id}


@pytest.mark.parametrize(
    "header, joined",
    [
        ("traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        ("uber-trace-id: 4bf92f3577b34da6a3ce929d0e0e4736:00f067aa0ba902b7:0:1", False),
    ],
    ids=["w3c", "jaeger"],
)
def test_an_applications_own_context_still_wins_across_nodes(two_nodes, agents, header, joined):
    """curl sends its own trace header to the gateway: the gateway's spans join that trace
    (as they always did) and so does the backend on node B when it is a traceparent (the
    kernel reads it before the gateway calls out). A Jaeger header the kernel cannot read
    leaves that hop unjoined: B's span a root, never a child in another trace."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    gateway = a.start([PYTHON, EXAMPLES / "http_gateway.py", "--port", "0", "--backend", f"{b.ipv4}:{backend.port}"])
    warm_up(a, gateway)
    curl(a, "-H", header, f"http://127.0.0.1:{gateway.port}/api/items/7")
    hop(agents, backend, 2)
    wait_until(lambda: len(served_by(agents, gateway.pid, "a")) >= 2)
    on_a = agents.spans("a")
    warmed = warmed_at(on_a, gateway.pid)
    gateway_spans = [s for s in on_a if s.resource["process.pid"] == gateway.pid and s.span.start_time_unix_nano > warmed]
    assert {s.span.trace_id.hex() for s in gateway_spans} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    [call] = [s for s in gateway_spans if s.span.kind == CLIENT]
    [backend_span] = after_warm_up(served_by(agents, backend.pid))
    if joined:
        assert backend_span.span.trace_id == call.span.trace_id
        assert backend_span.span.parent_span_id == call.span.span_id
    else:
        assert not backend_span.span.parent_span_id
        assert backend_span.span.trace_id != call.span.trace_id


def test_the_first_call_of_a_process_that_never_called_out_carries_no_context(two_nodes, agents):
    """A gateway started with the agents calls out for the first time while serving its
    first request: the kernel had not read that request's headers (a process is looked at
    once it calls out), so that one call carries nothing and B's span is a root; the
    next requests join."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    gateway = a.start([PYTHON, EXAMPLES / "http_gateway.py", "--port", "0", "--backend", f"{b.ipv4}:{backend.port}"])
    for i in range(3):
        curl(a, f"http://127.0.0.1:{gateway.port}/api/items/{i}")
    calls, (first, *later) = hop(agents, backend, 3)
    assert not first.span.parent_span_id
    assert first.span.trace_id not in {c.span.trace_id for c in calls}
    assert_children_across(calls[1:], later, 2)


def test_ipv6(two_nodes, agents):
    a, b = two_nodes.nodes
    backend = start_backend(b, "::")
    curl(a, *[f"http://[{b.ipv6}]:{backend.port}/items/{i}" for i in range(2)])
    clients, servers = hop(agents, backend, 2)
    assert_children_across(clients, servers, 2)
    assert {s.attributes["network.peer.address"] for s in servers} == {a.ipv6}


# -- HTTP/2, gRPC, TLS, LLM calls ------------------------------------------------------------


def test_grpc_calls_on_one_channel_join_across_nodes(two_nodes, agents):
    """grpcio on node A, one h2c channel, every call kind and calls one after another:
    each of B's SERVER spans is the child of its own CLIENT span on A (the first call of
    the channel included, read together with the connection preface)."""
    a, b = two_nodes.nodes
    server = b.start([PYTHON, EXAMPLES / "grpc_service.py", "serve", "--port", "0", "--host", "0.0.0.0"])
    grpc_call = [PYTHON, EXAMPLES / "grpc_service.py", "call", "--port", str(server.port), "--host", b.ipv4]
    out = a.run([*grpc_call, "--mode", "all"])["stdout"] + a.run([*grpc_call, "--mode", "sequence", "--count", "4"])["stdout"]
    assert out.count("ok ") == 9
    clients, servers = hop(agents, server, 9)
    assert_children_across(clients, servers, 9)
    by_span = {c.span.span_id: c for c in clients}
    for server_span in servers:  # the same method on both ends
        assert by_span[server_span.span.parent_span_id].span.name == server_span.span.name


def test_concurrent_grpc_calls_are_never_given_a_wrong_parent(two_nodes, agents):
    """Ten calls at once on one channel: the kernel cannot tell their streams apart in one
    write or read, so at most the first of a write joins; every parent there is is right."""
    a, b = two_nodes.nodes
    server = b.start([PYTHON, EXAMPLES / "grpc_service.py", "serve", "--port", "0", "--host", "0.0.0.0"])
    a.run([PYTHON, EXAMPLES / "grpc_service.py", "call", "--port", str(server.port), "--host", b.ipv4,
           "--mode", "concurrent", "--count", "10"])  # fmt: skip
    client_spans, servers = hop(agents, server, 10)
    clients = {c.span.span_id: c for c in client_spans}
    assert len(clients) == len(servers) == 10
    joined = [s for s in servers if s.span.parent_span_id]
    assert joined, "not even the first call joined"
    for server_span in joined:
        parent = clients[server_span.span.parent_span_id]
        assert parent.span.trace_id == server_span.span.trace_id
    assert len({s.span.parent_span_id for s in joined}) == len(joined)


@pytest.fixture(scope="module")
def certificate(two_nodes, tmp_path_factory):
    """A self-signed certificate for node B's addresses: (cert, key)."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    b = two_nodes.b
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=node-b", "-addext", f"subjectAltName=IP:{b.ipv4},IP:{b.ipv6}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def probed(agent: AgentProcess, service) -> None:
    """Until the agent has attached its TLS probes to a process it saw start (before that,
    its plaintext is not seen: a server's first request would be missed)."""
    assert wait_until(lambda: f"TLS: pid {service.pid}: plaintext" in agent.output, timeout=30), agent.output


def gated_client(node: Node, agent: AgentProcess, argv: list, tmp_path: Path, tls: bool) -> list[str]:
    """Run a tests/clients/llm_calls.py client that waits, its libraries loaded, until the
    node's agent has attached its TLS probes to it (a process started after the agent is
    probed when it is first seen), then makes its calls; its result lines."""
    gate, out = tmp_path / "gate", tmp_path / f"calls-{time.monotonic_ns()}.out"
    client = node.start([PYTHON, CLIENTS / "llm_calls.py", *argv, "--gate", gate, "--out", out])
    if tls:
        probed(agent, client)
    gate.touch()
    assert wait_until(lambda: out.exists() and "done" in out.read_text(), timeout=60)
    gate.unlink()
    return out.read_text().splitlines()[:-1]


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_streamed_llm_call_joins_across_nodes(two_nodes, agents, certificate, tmp_path, tls):
    """The openai SDK on node A streams chat completions from the mock server on node B,
    in plaintext and through TLS (OpenSSL on both ends): B's GenAI SERVER spans are the
    children of A's CLIENT spans."""
    a, b = two_nodes.nodes
    cert, key = certificate
    args = [PYTHON, EXAMPLES / "openai_mock_server.py", "--port", "0", "--host", "0.0.0.0", "--token-delay-ms", "2"]
    server = b.start(args + (["--ssl-certfile", cert, "--ssl-keyfile", key] if tls else []))
    if tls:
        probed(agents.agents["b"], server)
    url = f"{'https' if tls else 'http'}://{b.ipv4}:{server.port}/v1"
    lines = gated_client(a, agents.agents["a"], ["openai", url, "--stream", "--count", "3"]
                         + (["--cafile", cert] if tls else []), tmp_path, tls)  # fmt: skip
    assert len(lines) == 3 and all(line.startswith("ok ") for line in lines)
    clients, servers = hop(agents, server, 3)
    assert_children_across(clients, servers, 3)
    assert {s.attributes["gen_ai.operation.name"] for s in servers + clients} == {"chat"}


def test_https_requests_through_openssl_join_across_nodes(two_nodes, agents, certificate, tmp_path):
    """urllib (CPython's ssl: OpenSSL's SSL_write_ex inside which the socket write is made)
    on node A, HTTPS to node B: the option rides on the TLS record of each request."""
    a, b = two_nodes.nodes
    cert, key = certificate
    server = b.start([PYTHON, EXAMPLES / "openai_mock_server.py", "--port", "0", "--host", "0.0.0.0",
                      "--ssl-certfile", cert, "--ssl-keyfile", key])  # fmt: skip
    probed(agents.agents["b"], server)
    lines = gated_client(a, agents.agents["a"], ["https", f"https://{b.ipv4}:{server.port}/v1", "--count", "3",
                                                 "--cafile", cert], tmp_path, tls=True)  # fmt: skip
    assert lines == ["ok 200"] * 3
    assert_children_across(*hop(agents, server, 3), 3)


# -- the bytes on the wire -------------------------------------------------------------------


def test_the_option_is_obis_layout_on_each_requests_first_segment(two_nodes, agents, tmp_path):
    """Captured on node B's veth: one option per request, on the segment that starts it,
    and read with OBI's reader (kind 25, length 26: trace id, span id) it names A's CLIENT
    span. No other segment carries it (the requests are acknowledged at once)."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    pcap = tmp_path / "b.pcap"
    capture = tcpdump(b, pcap)
    curl(a, *[f"http://{b.ipv4}:{backend.port}/items/{i}" for i in range(3)])
    stop_capture(capture)
    clients, _servers = hop(agents, backend, 3)
    carried = []
    for segment in segments(str(pcap)):
        options = [otel_option(raw) for kind, raw in segment.options if kind == KIND_OTEL]
        if options:
            assert segment.src == a.ipv4 and segment.payload.startswith(b"GET /items/")
            [option] = options
            assert option is not None and option.length == LEGACY_LEN
            carried.append(option)
    assert [(o.trace_id, o.span_id) for o in carried] == [(c.span.trace_id, c.span.span_id) for c in clients]


@pytest.fixture
def outside_cgroup(two_nodes):
    """A cgroup of its own beside node A's (none of A's agent's programs see it) and a
    preexec function that puts a process in it."""
    path = f"{two_nodes.a.cgroup}-outside"
    os.makedirs(path, exist_ok=True)

    def enter() -> None:
        with open(f"{path}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    yield path, enter
    remove_cgroup(path)


@pytest.mark.parametrize("flags", [1, 0], ids=["sampled-legacy", "unsampled-extended"])
def test_options_written_as_obi_writes_them_are_adopted(two_nodes, agents, outside_cgroup, flags):
    """On node A, OBI's writer, not otelbpf (the option built from OBI's own structs, on
    the next header the kernel builds: the handshake's last ACK or the request), writes for
    a curl that A's agent does not trace: node B's agent reads it, legacy and extended
    layouts alike, and B's SERVER span is the child of the span it names."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    cgroup, enter = outside_cgroup
    writer = ObiStyleWriter(cgroup)
    sent = []
    try:
        for i in range(2):
            trace_id, span_id = os.urandom(16), os.urandom(8)
            writer.schedule(trace_id, span_id, flags)
            url = f"http://{b.ipv4}:{backend.port}/items/{i}"
            subprocess.run(a.in_netns("curl", "-sf", "-o", "/dev/null", url), check=True, preexec_fn=enter)
            sent.append((trace_id, span_id))
        assert writer.written == 2
    finally:
        writer.close()
    wait_until(lambda: len(served_by(agents, backend.pid)) >= 2, timeout=30)
    servers = served_by(agents, backend.pid)
    assert [(s.span.trace_id, s.span.parent_span_id) for s in servers] == sent
    assert {s.attributes["otelbpf.association"] for s in servers} == {"tcp_option"}


def segments_at(path: Path, port: int) -> list[tuple]:
    """Per segment to or from ``port``: direction, the options (kind, length), the payload
    (a request's bytes; a response's length: its Date header changes from run to run)."""
    out = []
    for segment in segments(str(path)):
        if port in (segment.sport, segment.dport):
            options = [(kind, len(raw)) for kind, raw in segment.options]
            to_server = segment.dport == port
            out.append(("to" if to_server else "from", options, segment.payload if to_server else len(segment.payload)))
    return out


def test_off_changes_no_byte(tmp_path):
    """With --propagation off the segments are those of a run with no agent: the same
    options and the same request bytes, segment for segment. Nodes of its own, with one
    agent tracing both (the module's agents write options)."""
    with TwoNodes() as nodes:
        a, b = nodes.nodes
        server = b.start([PYTHON, CLIENTS / "bulk_server.py", "--host", "0.0.0.0"])
        runs = {}
        for mode in ("none", "off"):
            agent = None
            if mode == "off":
                agent = AgentProcess(["--pid", str(a.pid), "--pid", str(b.pid), "--propagation", "off",
                                      "--json-file", str(tmp_path / "off.json"), "--no-profiles"])  # fmt: skip
            pcap = tmp_path / f"{mode}.pcap"
            capture = tcpdump(b, pcap)
            # one connection, a request at a time: the segments are the same from run to run
            curl(a, "-o", "/dev/null", "-o", "/dev/null",
                 *[f"http://{b.ipv4}:{server.port}/download/{size}" for size in (100, 5000)])  # fmt: skip
            stop_capture(capture)
            if agent is not None:
                assert agent.stop() == 0
            runs[mode] = segments_at(pcap, server.port)
        assert runs["none"] and all(KIND_OTEL not in dict(options) for _, options, _ in runs["none"] + runs["off"])
        assert runs["off"] == runs["none"]
        assert len(spans_in_file(tmp_path / "off.json")) >= 4  # the agent did trace both ends


def test_processes_the_agents_do_not_trace_are_not_touched(two_nodes, agents, tmp_path):
    """curl run in node A's namespace and cgroup but outside its launcher (not traced):
    none of its segments carries an option, while the traced curl's requests do."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    pcap = tmp_path / "b.pcap"
    capture = tcpdump(b, pcap)
    url = f"http://{b.ipv4}:{backend.port}/items/untraced"

    def enter_cgroup(path=f"{a.cgroup}/cgroup.procs") -> None:
        with open(path, "w") as f:
            f.write(str(os.getpid()))

    for _ in range(2):
        subprocess.run(a.in_netns("curl", "-sf", "-o", "/dev/null", url), check=True, preexec_fn=enter_cgroup)
    curl(a, f"http://{b.ipv4}:{backend.port}/items/traced")
    stop_capture(capture)
    seen = {"untraced": 0, "traced": 0}
    for segment in segments(str(pcap)):
        carries = any(kind == KIND_OTEL for kind, _ in segment.options)
        if segment.payload.startswith(b"GET /items/untraced"):
            assert not carries
            seen["untraced"] += 1
        elif segment.payload.startswith(b"GET /items/traced"):
            assert carries
            seen["traced"] += 1
    assert seen == {"untraced": 2, "traced": 1}


def test_a_path_that_strips_the_option_leaves_one_side_traces(two_nodes, agents, tmp_path):
    """A middlebox on node B's side starts stripping option 25 (iptables TCPOPTSTRIP) after
    the first request of a keep-alive connection: the first hop joins, the next ones give
    one-side traces (B's spans roots, complete, no error), and B counts the contexts it
    found stripped."""
    a, b = two_nodes.nodes
    backend = start_backend(b)
    before = agents.counters()
    gate, out = tmp_path / "strip-now", tmp_path / "statuses"
    a.start([PYTHON, CLIENTS / "stepped_client.py", b.ipv4, backend.port, 3, gate, out])
    assert wait_until(lambda: out.exists() and out.read_text().count("200") == 1, timeout=30)
    rule = ["-t", "mangle", "PREROUTING", "-p", "tcp", "--dport", str(backend.port), "-j", "TCPOPTSTRIP",
            "--strip-options", str(KIND_OTEL)]  # fmt: skip
    subprocess.run(b.in_netns("iptables", rule[0], rule[1], "-A", *rule[2:]), check=True)
    try:
        gate.touch()
        assert wait_until(lambda: "done" in out.read_text(), timeout=30)
    finally:
        subprocess.run(b.in_netns("iptables", rule[0], rule[1], "-D", *rule[2:]), check=True)
    assert out.read_text().split() == ["200", "200", "200", "done"]
    clients, servers = hop(agents, backend, 3)
    assert len(clients) == len(servers) == 3
    assert_children_across(clients[:1], servers[:1], 1)
    for stripped in servers[1:]:
        assert not stripped.span.parent_span_id
        assert stripped.span.trace_id not in {c.span.trace_id for c in clients}
        assert stripped.span.status.code != 2  # not an error
    grown = agents.settled_growth(before, {("a", "otelbpf.propagation.contexts.written"): 3,
                                           ("b", "otelbpf.propagation.contexts.read"): 1,
                                           ("b", "otelbpf.propagation.contexts.stripped"): 2})  # fmt: skip
    assert list(grown.values())[1:] == [1, 2]
    assert grown["a", "otelbpf.propagation.contexts.written"] >= 3  # a retransmit carries it again


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_bulk_transfers_arrive_intact_with_propagation_on(two_nodes, agents, tmp_path, family):
    """32 MiB up and 32 MiB down, twice on one keep-alive connection, across the nodes
    with the option on: the SHA-256 of what arrived is that of what was sent."""
    a, b = two_nodes.nodes
    server = b.start([PYTHON, CLIENTS / "bulk_server.py", "--host", "0.0.0.0" if family == "ipv4" else "::"])
    before = agents.counters()
    upload = tmp_path / "upload.bin"
    upload.write_bytes(os.urandom(32 * 1024 * 1024))
    sent = hashlib.sha256(upload.read_bytes()).hexdigest()
    base = f"http://{b.ipv4}:{server.port}" if family == "ipv4" else f"http://[{b.ipv6}]:{server.port}"
    answer = curl(a, "--data-binary", f"@{upload}", f"{base}/upload", "--next", "-s", "--data-binary", f"@{upload}",
                  f"{base}/upload")  # fmt: skip
    assert answer == sent + sent
    size = 32 * 1024 * 1024
    for i in range(2):
        got = tmp_path / f"download{i}.bin"
        headers = a.run(["curl", "-gsf", "-D", "-", "-o", str(got), f"{base}/download/{size}"])["stdout"]
        expected = next(line.split(":", 1)[1].strip() for line in headers.splitlines() if line.lower().startswith("x-sha256"))
        assert hashlib.sha256(got.read_bytes()).hexdigest() == expected
    grown = agents.settled_growth(before, {("a", "otelbpf.propagation.contexts.written"): 4,
                                           ("b", "otelbpf.propagation.adopted"): 4})  # fmt: skip
    assert all(count >= 4 for count in grown.values()), grown


def test_the_sock_ops_program_leaves_the_root_cgroup_with_a_killed_agent(two_nodes, tmp_path):
    """By default the sock_ops program sits on the cgroup v2 root (the whole host). It is
    attached through a BPF link: gone when the agent is killed (SIGKILL; an agent that
    exits is checked at the end of the module)."""
    a, _b = two_nodes.nodes
    root = cgroup2_root()

    def ours() -> set[int]:
        return {p.id for p in bpfsys.cgroup_programs(root) if p.name == "prop_sock_ops"}

    before = ours()
    agent = AgentProcess(["--pid", str(a.pid), "--json-file", str(tmp_path / "killed.json"), "--no-profiles"])
    attached = ours() - before
    assert len(attached) == 1, agent.output
    agent.proc.kill()
    agent.proc.wait()
    assert wait_until(lambda: not (ours() & attached), timeout=10)
