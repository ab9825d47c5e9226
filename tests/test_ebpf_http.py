"""Real eBPF, real processes: the agent traces unmodified HTTP/1.1 servers and clients.

Each test starts real servers and clients as separate processes, runs
`python -m otelbpf run` against them as a user would, and reads the OTLP
JSON file it writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from otlp_receiver import ReceivedSpan, attributes_dict

from conftest import EXAMPLES, ROOT
from otelbpf.export import read_json_file

pytestmark = pytest.mark.ebpf

CLIENTS = ROOT / "tests" / "clients"
SERVER, CLIENT = 2, 3  # OTLP SpanKind


def spans_in_file(path) -> list[ReceivedSpan]:
    out = []
    for request in read_json_file(path):
        for resource_spans in request.resource_spans:
            resource = attributes_dict(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    out.append(ReceivedSpan(span, resource, scope_spans.scope.name, scope_spans.scope.version))
    return out


def start_client(args: list[str]) -> subprocess.Popen:
    """A client process that waits for a line on stdin before it starts."""
    proc = subprocess.Popen(
        [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def go(proc: subprocess.Popen) -> None:
    proc.stdin.write("go\n")
    proc.stdin.flush()


def duration_ms(span) -> float:
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6


def test_200_keepalive_requests_give_200_server_and_200_client_spans(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "20"])
    client = start_client([str(CLIENTS / "keepalive_client.py"), f"http://127.0.0.1:{backend.port}/items/", "200"])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--pid", str(client.pid), "--json-file", str(out)])
    go(client)
    stdout, _ = client.communicate(timeout=60)
    assert stdout.split().count("200") == 200
    assert run.stop() == 0

    spans = spans_in_file(out)
    server = [s for s in spans if s.span.kind == SERVER]
    client_spans = [s for s in spans if s.span.kind == CLIENT]
    assert len(server) == 200 and len(client_spans) == 200
    assert {s.resource["process.pid"] for s in server} == {backend.pid}
    assert {s.resource["process.pid"] for s in client_spans} == {client.pid}
    assert server[0].resource["service.name"] == "http_backend"
    assert client_spans[0].resource["service.name"] == "keepalive_client"

    paths = sorted(s.attributes["url.path"] for s in server)
    assert paths == sorted(f"/items/{i}" for i in range(200))
    for s in server:
        attrs = s.attributes
        assert s.name == "GET /items/{id}"
        assert attrs["http.request.method"] == "GET"
        assert attrs["http.response.status_code"] == 200
        assert attrs["http.route"] == "/items/{id}"
        assert attrs["server.port"] == backend.port
        assert attrs["network.peer.address"] == "127.0.0.1"
        assert attrs["network.protocol.version"] == "1.1"
        assert attrs["user_agent.original"].startswith("python-requests/")
        assert 20 <= duration_ms(s.span) < 2000, duration_ms(s.span)
    for s in client_spans:
        assert s.name == "GET"
        assert s.attributes["http.response.status_code"] == 200
        assert s.attributes["server.port"] == backend.port
        assert s.attributes["url.full"].startswith(f"http://127.0.0.1:{backend.port}/items/")
        assert 20 <= duration_ms(s.span) < 2000
    # one connection: every client span has the same local port as peer of the server spans
    assert len({s.attributes["network.peer.port"] for s in server}) == 1
    # both ends traced: each server span is the child of the client span of the same request
    client_by_id = {c.span.span_id: c for c in client_spans}
    for s in server:
        parent = client_by_id[s.span.parent_span_id]
        assert parent.span.trace_id == s.span.trace_id
        assert parent.attributes["url.full"].endswith(s.attributes["url.path"])
        assert s.attributes["otelbpf.association"] == "connection"
    stats = run.stats()
    assert stats["otelbpf.spans.created"] == 400
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert stats.get("otelbpf.parse.errors", 0) == 0


def test_keepalive_connection_opened_before_the_agent_has_its_tuple_and_links(services, agent, tmp_path):
    """The client's connection (and its first request) predate the agent: the kernel never
    saw it reach ESTABLISHED, so its tuple comes from /proc. The client ends it right after
    its last request and the server closes its socket then, usually before the agent has
    decoded the server's first event: the tuple noted when the agent started must serve.
    Few requests, so the connection ends soon after the agent starts."""
    REQUESTS = 3
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    client = subprocess.Popen(
        [sys.executable, str(CLIENTS / "keepalive_client.py"), f"http://127.0.0.1:{backend.port}/items/", str(REQUESTS), "--early"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert client.stdout.readline().split() == ["early", "200"]
    assert client.stdout.readline().strip() == "ready"
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--pid", str(client.pid), "--json-file", str(out)])
    go(client)
    stdout, stderr = client.communicate(timeout=60)
    assert stdout.split().count("200") == REQUESTS, stderr
    assert run.stop() == 0

    spans = spans_in_file(out)
    server = [s for s in spans if s.span.kind == SERVER]
    client_spans = [s for s in spans if s.span.kind == CLIENT]
    assert len(server) == REQUESTS == len(client_spans), [(s.name, s.span.kind) for s in spans]
    client_ports = {s.attributes["network.peer.port"] for s in server}
    assert len(client_ports) == 1 and backend.port not in client_ports  # one connection, the client's port
    for s in server:
        assert s.attributes["network.peer.address"] == "127.0.0.1"
    for s in client_spans:
        assert s.attributes["network.peer.address"] == "127.0.0.1"
        assert s.attributes["network.peer.port"] == backend.port
    client_by_id = {c.span.span_id: c for c in client_spans}
    for s in server:
        parent = client_by_id[s.span.parent_span_id]
        assert parent.span.trace_id == s.span.trace_id
        assert parent.attributes["url.full"].endswith(s.attributes["url.path"])


def test_curl_posts_and_gets_traced_by_comm_including_processes_started_later(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--comm", "curl", "--json-file", str(out)])
    base = f"http://127.0.0.1:{backend.port}"
    body = '{"prompt": "' + "x" * 300 + '"}'
    subprocess.run(
        ["curl", "-sf", "-o", "/dev/null", "-X", "POST", "-H", "Content-Type: application/json", "-d", body, f"{base}/predict"],
        check=True,
    )
    subprocess.run(["curl", "-s", "-o", "/dev/null", f"{base}/items/7?token=secret", f"{base}/nope", f"{base}/error"], check=True)
    assert run.stop() == 0
    spans = spans_in_file(out)
    by_kind_path = {(s.span.kind, s.attributes.get("url.path") or s.attributes.get("url.full")): s for s in spans}
    server_post = by_kind_path[(SERVER, "/predict")]
    assert server_post.attributes["http.request.method"] == "POST"
    assert server_post.attributes["http.request.body.size"] == len(body)
    assert server_post.attributes["user_agent.original"].startswith("curl/")
    assert server_post.span.status.code == 0
    server_items = by_kind_path[(SERVER, "/items/7")]
    assert "url.query" not in server_items.attributes  # private by default
    assert not any("secret" in str(a) for s in spans for a in s.attributes.values())
    not_found = by_kind_path[(SERVER, "/nope")]
    assert not_found.attributes["http.response.status_code"] == 404
    assert not_found.span.status.code == 0  # 4xx is not a server error
    server_error = by_kind_path[(SERVER, "/error")]
    assert server_error.span.status.code == 2 and server_error.attributes["error.type"] == "500"
    curl_spans = [s for s in spans if s.resource.get("process.executable.name") == "curl"]
    assert len(curl_spans) == 4 and all(s.span.kind == CLIENT for s in curl_spans)
    client_404 = [s for s in curl_spans if s.attributes["http.response.status_code"] == 404]
    assert client_404 and client_404[0].span.status.code == 2  # 4xx is a client error


def test_garbage_client_does_not_break_tracing(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    client = start_client([str(CLIENTS / "raw_client.py"), "garbage", "127.0.0.1", str(backend.port)])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--pid", str(client.pid), "--json-file", str(out)])
    go(client)
    assert client.stdout.readline().strip() == "sent"
    client.wait(timeout=30)
    assert run.stop() == 0
    spans = spans_in_file(out)
    server = [s for s in spans if s.span.kind == SERVER]
    assert [s.attributes["url.path"] for s in server] == ["/items/after-garbage"]
    stats = run.stats()
    # The garbage connection (both ends) was seen and recognised as no known protocol.
    assert stats["otelbpf.connections.unrecognized"] >= 2
    assert stats["otelbpf.spans.created"] == 2


def test_client_killed_mid_request_ends_its_span_with_an_error(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "500"])
    waiting = start_client([str(CLIENTS / "raw_client.py"), "request", "127.0.0.1", str(backend.port), "/items/slow"])
    partial = start_client([str(CLIENTS / "raw_client.py"), "partial", "127.0.0.1", str(backend.port)])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--pid", str(waiting.pid), "--pid", str(partial.pid), "--json-file", str(out)])
    go(waiting)
    go(partial)
    assert waiting.stdout.readline().strip() == "sent"
    assert partial.stdout.readline().strip() == "sent"
    time.sleep(0.1)
    waiting.send_signal(signal.SIGKILL)
    partial.send_signal(signal.SIGKILL)
    waiting.wait()
    partial.wait()
    time.sleep(1.0)  # the backend finishes its 500 ms sleep and writes into the dead socket
    assert run.stop() == 0
    spans = spans_in_file(out)
    client_spans = [s for s in spans if s.span.kind == CLIENT]
    assert len(client_spans) == 1
    killed = client_spans[0]
    assert killed.span.status.code == 2
    assert killed.attributes["otelbpf.exchange.end_reason"] == "connection_closed"
    assert "http.response.status_code" not in killed.attributes
    server = [s for s in spans if s.span.kind == SERVER]
    assert [s.attributes["url.path"] for s in server] == ["/items/slow"]
    # The backend writes its head into the dead socket (accepted); the body
    # write then normally fails with EPIPE once the peer's RST is in: the
    # response is then honestly incomplete, and counted.
    served = server[0].attributes
    assert served["http.response.status_code"] == 200
    server_incomplete = served.get("otelbpf.exchange.end_reason") == "connection_closed"
    assert server_incomplete == served.get("otelbpf.response.incomplete", False)
    stats = run.stats()
    assert stats["otelbpf.exchanges.incomplete{connection_closed}"] == 1 + server_incomplete, stats
    # the half-sent request head never became an exchange, and nothing crashed
    assert stats["otelbpf.spans.created"] == 2


def test_server_that_closes_early_gives_client_error_span(services, agent, tmp_path):
    server = services([str(CLIENTS / "early_close_server.py")])
    out = tmp_path / "spans.json"
    run = agent(["--comm", "curl", "--pid", str(server.pid), "--json-file", str(out)])
    result = subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{server.port}/closes"])
    assert result.returncode != 0  # curl saw the empty reply
    assert run.stop() == 0
    spans = spans_in_file(out)
    client_spans = [s for s in spans if s.span.kind == CLIENT]
    server_spans = [s for s in spans if s.span.kind == SERVER]
    assert len(client_spans) == 1 and len(server_spans) == 1
    for s in client_spans + server_spans:
        assert s.span.status.code == 2
        assert s.attributes["otelbpf.exchange.end_reason"] == "connection_closed"
    assert run.stats()["otelbpf.exchanges.incomplete{connection_closed}"] == 2


def test_bodies_larger_than_the_capture_size_are_counted_not_lost(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--capture-bytes", "256", "--json-file", str(out)])
    payload = tmp_path / "big.json"
    payload.write_text('{"prompt": "' + "y" * 100_000 + '"}')
    for _ in range(3):
        subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", "-X", "POST", "--data-binary", f"@{payload}", f"http://127.0.0.1:{backend.port}/predict"],
            check=True,
        )
    assert run.stop() == 0
    spans = [s for s in spans_in_file(out) if s.span.kind == SERVER]
    assert len(spans) == 3
    for s in spans:
        assert s.attributes["http.request.body.size"] == payload.stat().st_size
        assert s.attributes["otelbpf.payload.truncated"] is True
        assert s.attributes["http.response.status_code"] == 200
    assert run.stats()["otelbpf.payload.truncated"] >= 3


# Sends one POST whose 2.4 MB body goes out in 600 send()s of 4 KiB once told to
# on stdin: 600 records of ~4 KiB each, more than a 1 MiB ring holds.
RING_FILLER = """
import socket, sys
port = int(sys.argv[1])
sys.stdin.readline()
chunk = b"z" * 4096
with socket.create_connection(("127.0.0.1", port)) as conn:
    conn.sendall(b"POST /predict HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: %d\\r\\n\\r\\n" % (600 * len(chunk)))
    for _ in range(600):
        conn.sendall(chunk)
    conn.recv(65536)
"""


def test_a_full_ring_drops_are_counted_and_tracing_recovers(services, agent, tmp_path):
    """An agent that cannot keep up (here: stopped) fills the ring; the probes then
    count each record they cannot fit (bpf/common.h ring_full_for) instead of
    copying it, and once the agent reads again, new requests are traced whole."""
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "0"])
    filler = subprocess.Popen([sys.executable, "-c", RING_FILLER, str(backend.port)], stdin=subprocess.PIPE, text=True)
    try:
        out = tmp_path / "spans.json"
        run = agent(["--pid", str(backend.pid), "--pid", str(filler.pid), "--ring-buffer-mb", "1", "--json-file", str(out)])
        run.proc.send_signal(signal.SIGSTOP)
        try:
            filler.communicate("go\n", timeout=30)
        finally:
            run.proc.send_signal(signal.SIGCONT)
    finally:
        filler.kill()
    assert filler.returncode == 0
    time.sleep(1.0)  # let the agent drain what did fit
    url = f"http://127.0.0.1:{backend.port}"
    for i in range(3):
        subprocess.run(["curl", "-sf", "-o", "/dev/null", f"{url}/items/after-{i}"], check=True)
    assert run.stop() == 0
    assert run.stats().get("otelbpf.events.lost", 0) > 0, run.stats()
    after = [s for s in spans_in_file(out) if "after-" in s.attributes.get("url.path", "")]
    assert sorted(s.attributes["url.path"] for s in after) == [f"/items/after-{i}" for i in range(3)]
    for s in after:
        assert s.span.kind == SERVER
        assert s.attributes["http.response.status_code"] == 200


def test_discard_events_reads_every_record_and_builds_nothing(services, agent, tmp_path):
    """--discard-events (the benchmarks' "user space dropping everything"): the kernel
    captures as when tracing, the agent reads each record and drops it undecoded. Ten
    curl requests: records counted as discarded (at least a request and a response each),
    none lost, no span written."""
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "0"])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--discard-events", "--json-file", str(out)])
    assert "--discard-events: every captured record is dropped undecoded" in run.output
    url = f"http://127.0.0.1:{backend.port}"
    subprocess.run(["curl", "-sf", "-o", "/dev/null", *[f"{url}/items/{i}" for i in range(10)]], check=True)
    time.sleep(0.5)
    assert run.stop() == 0
    stats = run.stats()
    assert stats.get("otelbpf.events.discarded", 0) >= 20, stats
    assert stats.get("otelbpf.events.lost", 0) == 0 and stats.get("otelbpf.spans.created", 0) == 0, stats
    assert spans_in_file(out) == []


def test_sendfile_body_is_counted_and_marked(services, agent, tmp_path):
    server = services([str(CLIENTS / "sendfile_server.py"), "300000"])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(server.pid), "--json-file", str(out)])
    url = f"http://127.0.0.1:{server.port}/file"
    subprocess.run(["curl", "-sf", "-o", "/dev/null", url, url], check=True)
    assert run.stop() == 0
    spans = spans_in_file(out)
    assert len(spans) == 2
    for s in spans:
        assert s.attributes["http.response.status_code"] == 200
        assert s.attributes["http.response.body.size"] == 300000
        assert s.attributes["otelbpf.response.body.sendfile"] is True
        assert "otelbpf.response.incomplete" not in s.attributes


def test_sigterm_flushes_and_exits_zero(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(backend.pid), "--json-file", str(out)])
    subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/1"], check=True)
    assert run.stop(signal.SIGTERM) == 0
    assert len(spans_in_file(out)) == 1


def test_duration_stops_cleanly(services, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    out = tmp_path / "spans.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "otelbpf", "run", "--pid", str(backend.pid), "--duration", "4", "--json-file", str(out)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(ROOT),
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("otelbpf: tracing,"):
            subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/2"], check=True)
    assert proc.wait(timeout=60) == 0, "".join(lines)
    assert any("probes attached" in line for line in lines)
    assert [s.attributes["url.path"] for s in spans_in_file(out)] == ["/items/2"]


def test_all_traces_processes_started_later_but_never_the_agent(services, agent, tmp_path):
    out = tmp_path / "spans.json"
    run = agent(["--all", "--json-file", str(out)])
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])  # started after
    subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/all"], check=True)
    assert run.stop() == 0
    spans = [s for s in spans_in_file(out) if s.attributes.get("url.path") == "/items/all" or s.attributes.get("url.full", "").endswith("/items/all")]
    assert {(s.resource["process.pid"], s.span.kind) for s in spans} >= {(backend.pid, SERVER)}
    assert any(s.resource["process.executable.name"] == "curl" and s.span.kind == CLIENT for s in spans)
    assert all(s.resource["process.pid"] != run.proc.pid for s in spans_in_file(out))


def _niceness(stat_path: str) -> int:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of proc(5), counted after the comm


def test_agent_yields_the_cpu_to_the_services_on_every_thread(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    run = agent(["--pid", str(backend.pid), "--json-file", str(tmp_path / "spans.json")])
    pid = run.proc.pid
    threads = [f"/proc/{pid}/task/{tid}/stat" for tid in os.listdir(f"/proc/{pid}/task")]
    assert len(threads) > 1  # the main loop and the export workers
    assert {_niceness(path) for path in threads} == {10}  # the --nice default
    assert _niceness(f"/proc/{backend.pid}/stat") == 0  # the traced service is left alone
    assert run.stop() == 0


@pytest.mark.parametrize("regs_read", ["probe", "load"])
def test_both_ways_of_reading_the_syscall_registers_give_the_same_spans(services, agent, tmp_path, regs_read):
    """OTELBPF_REGS_READ=probe is the fallback for a verifier that refuses plain
    loads from bpf_task_pt_regs: it must capture exactly what the default does."""
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    client = start_client([str(CLIENTS / "keepalive_client.py"), f"http://127.0.0.1:{backend.port}/items/", "20"])
    out = tmp_path / "spans.json"
    run = agent(
        ["--pid", str(backend.pid), "--pid", str(client.pid), "--json-file", str(out)],
        env={"OTELBPF_REGS_READ": regs_read},
    )
    go(client)
    stdout, _ = client.communicate(timeout=60)
    assert stdout.split().count("200") == 20
    assert run.stop() == 0
    expected = "by plain loads" if regs_read == "load" else "with bpf_probe_read_kernel"
    assert f"syscall registers: read {expected}" in run.output
    spans = spans_in_file(out)
    server = sorted(s.attributes["url.path"] for s in spans if s.span.kind == SERVER)
    assert server == sorted(f"/items/{i}" for i in range(20))
    assert [s.attributes["server.port"] for s in spans if s.span.kind == CLIENT] == [backend.port] * 20
    assert run.stats().get("otelbpf.events.lost", 0) == 0


def test_a_wrong_regs_read_setting_is_refused_by_name(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "otelbpf", "run", "--pid", str(os.getpid()), "--json-file", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "OTELBPF_REGS_READ": "peek"},
        cwd=str(ROOT),
        timeout=120,
    )
    assert result.returncode != 0
    assert "OTELBPF_REGS_READ='peek': expected load or probe" in result.stderr
    assert "Traceback" not in result.stderr


def test_doctor_loads_the_register_read_the_capture_uses():
    from otelbpf.cli.doctor import OK, check_task_regs

    check = check_task_regs()
    assert check.status == OK, check
    assert "plain loads" in check.detail


def test_doctor_names_a_wrong_regs_read_setting(monkeypatch):
    from otelbpf.cli.doctor import FAIL, check_task_regs

    monkeypatch.setenv("OTELBPF_REGS_READ", "peek")
    check = check_task_regs()
    assert check.status == FAIL and "OTELBPF_REGS_READ='peek': expected load or probe" in check.detail
