"""Real eBPF, real processes: HTTPS traced from OpenSSL's plaintext, on both sides.

A self-signed certificate is made per test with ``openssl``; the clients trust
it explicitly. The agent's TLS probes (bpf/tls.c) attribute plaintext to the
socket it travels on in two ways, both exercised here:

* socket-bound SSL objects (curl, nginx, ``requests``, the ``openai`` SDK):
  the socket I/O inside SSL_read/SSL_write names the connection;
* memory BIOs (uvicorn doing TLS itself on asyncio): no socket I/O inside the
  call; the thread's receive just before a read / send just after a write.

Each test also checks the ciphertext was never parsed: no span but the
expected ones, no parse errors or protocol violations.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from conftest import EXAMPLES, ROOT
from test_ebpf_genai import CLIENT_SCRIPT, FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS, assert_genai_spans_match, run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

SERVER, CLIENT = 2, 3  # OTLP SpanKind


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1 / localhost: (cert path, key path)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def nginx_https(tmp_path, certificate):
    """nginx serving HTTPS on 127.0.0.1 (master + one worker), HTTP/1.1 or HTTP/2 by
    ALPN: (master pid, port)."""
    cert, key = certificate
    port = free_port()
    conf = tmp_path / "nginx.conf"
    temp = tmp_path / "nginx-temp"
    temp.mkdir()
    conf.write_text(
        textwrap.dedent(
            f"""
            worker_processes 1;
            daemon off;
            pid {tmp_path}/nginx.pid;
            error_log {tmp_path}/error.log;
            events {{ worker_connections 64; }}
            http {{
              access_log off;
              client_body_temp_path {temp}/body; proxy_temp_path {temp}/proxy; fastcgi_temp_path {temp}/fcgi;
              uwsgi_temp_path {temp}/uwsgi; scgi_temp_path {temp}/scgi;
              server {{
                listen 127.0.0.1:{port} ssl http2;
                ssl_certificate {cert};
                ssl_certificate_key {key};
                location / {{ return 200 "hello over tls\\n"; }}
                location = /teapot {{ return 418; }}
              }}
            }}
            """
        )
    )
    proc = subprocess.Popen(["nginx", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"nginx did not start: {proc.stderr.read()}")
                subprocess.run(["sleep", "0.05"])
        yield proc.pid, port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def assert_ciphertext_never_parsed(spans, stats, expected_spans: int) -> None:
    assert len(spans) == expected_spans, [(s.name, s.span.kind) for s in spans]
    assert stats["otelbpf.spans.created"] == expected_spans
    assert stats.get("otelbpf.parse.errors", 0) == 0, stats
    assert not any(key.startswith("otelbpf.protocol.violations") for key in stats), stats
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert stats["otelbpf.tls.connections"] >= 1
    assert stats.get("otelbpf.tls.unattributed", 0) == 0  # every plaintext call found its connection


def test_curl_to_nginx_over_https_gives_spans_on_both_sides(nginx_https, certificate, agent, tmp_path):
    nginx_pid, port = nginx_https
    cert, _ = certificate
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(nginx_pid), "--comm", "curl", "--json-file", str(out)])
    assert "TLS: pid %d: plaintext of " % nginx_pid in run.output  # the start-up log says what covers it
    base = f"https://127.0.0.1:{port}"
    # curl starts after the agent: the host libssl was probed once, for every process
    curl = ["curl", "--http1.1", "--cacert", str(cert), "-o", "/dev/null"]
    subprocess.run([*curl, "-sf", f"{base}/items/42"], check=True)
    subprocess.run([*curl, "-s", "-X", "POST", "-d", "abc", f"{base}/teapot"], check=True)
    assert run.stop() == 0
    spans = [s for s in spans_in_file(out) if s.span.kind == SERVER or f":{port}/" in s.attributes.get("url.full", "")]
    by_side = {(s.span.kind, s.attributes.get("http.request.method")): s for s in spans}

    get_server, get_client = by_side[(SERVER, "GET")], by_side[(CLIENT, "GET")]
    assert get_server.name == "GET /items/{id}" and get_server.resource["process.executable.name"] == "nginx"
    assert get_server.attributes["url.scheme"] == "https" and get_server.attributes["server.port"] == port
    assert get_server.attributes["http.response.status_code"] == 200
    assert get_server.attributes["http.response.body.size"] == len("hello over tls\n")
    assert get_client.resource["process.executable.name"] == "curl"
    assert get_client.attributes["url.full"] == f"{base}/items/42"
    assert get_client.attributes["server.port"] == port and get_client.attributes["http.response.status_code"] == 200
    assert get_server.span.parent_span_id == get_client.span.span_id  # one trace across the TLS connection

    teapot_server, teapot_client = by_side[(SERVER, "POST")], by_side[(CLIENT, "POST")]
    assert teapot_server.name == "POST /teapot" and teapot_server.attributes["http.response.status_code"] == 418
    assert teapot_server.attributes["http.request.body.size"] == 3
    assert teapot_client.attributes["http.response.status_code"] == 418 and teapot_client.span.status.code == 2
    stats = run.stats()
    server_spans = [s for s in spans if s.span.kind == SERVER]
    assert len(server_spans) == 2  # nothing parsed from the ciphertext
    assert stats.get("otelbpf.parse.errors", 0) == 0, stats
    assert not any(key.startswith("otelbpf.protocol.violations") for key in stats), stats
    assert stats["otelbpf.tls.connections"] >= 4


def test_curl_to_nginx_over_https_with_http2_gives_http2_spans(nginx_https, certificate, agent, tmp_path):
    """HTTP/2 over TLS (ALPN h2): the plaintext the SSL probes see is parsed as HTTP/2."""
    nginx_pid, port = nginx_https
    cert, _ = certificate
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(nginx_pid), "--comm", "curl", "--json-file", str(out)])
    base = f"https://127.0.0.1:{port}"
    subprocess.run(["curl", "-sf", "--http2", "--cacert", str(cert), "-o", "/dev/null", f"{base}/items/42"], check=True)
    assert run.stop() == 0
    spans = [s for s in spans_in_file(out) if s.attributes.get("network.protocol.version") == "2"]
    by_kind = {s.span.kind: s for s in spans}
    assert set(by_kind) == {SERVER, CLIENT} and len(spans) == 2, [(s.name, s.span.kind) for s in spans_in_file(out)]
    server, client = by_kind[SERVER], by_kind[CLIENT]
    assert server.name == "GET /items/{id}" and server.resource["process.executable.name"] == "nginx"
    assert server.attributes["url.scheme"] == "https" and server.attributes["http.response.status_code"] == 200
    assert client.attributes["url.full"] == f"{base}/items/42" and client.attributes["http.response.status_code"] == 200
    assert server.span.parent_span_id == client.span.span_id
    stats = run.stats()
    assert stats.get("otelbpf.parse.errors", 0) == 0, stats
    assert not any(key.startswith("otelbpf.protocol.violations") for key in stats), stats


REQUESTS_CLIENT = textwrap.dedent(
    """
    import sys, requests
    base, ca = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    sys.stdin.readline()
    session = requests.Session()  # one keep-alive TLS connection
    codes = [session.get(f"{base}/v1/models", verify=ca).status_code for _ in range(3)]
    codes.append(session.post(f"{base}/v1/embeddings", json={"model": "emb", "input": ["a b", "c"]}, verify=ca).status_code)
    codes.append(session.get(f"{base}/nope", verify=ca).status_code)
    print(" ".join(map(str, codes)), flush=True)
    """
)


def start_script(tmp_path, name: str, text: str, *args: str) -> subprocess.Popen:
    script = tmp_path / name
    script.write_text(text)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc


def test_requests_to_uvicorn_doing_tls_over_memory_bios(services, agent, certificate, tmp_path):
    cert, key = certificate
    server = services([str(EXAMPLES / "openai_mock_asgi.py"), "--port", "0", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert)])
    client = start_script(tmp_path, "requests_client.py", REQUESTS_CLIENT, f"https://127.0.0.1:{server.port}", str(cert))
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(server.pid), "--pid", str(client.pid), "--json-file", str(out)])
    client.stdin.write("go\n")
    client.stdin.flush()
    stdout, stderr = client.communicate(timeout=60)
    assert stdout.split() == ["200", "200", "200", "200", "404"], stderr
    assert run.stop() == 0
    spans = spans_in_file(out)
    server_spans = [s for s in spans if s.span.kind == SERVER]
    client_spans = [s for s in spans if s.span.kind == CLIENT]
    assert [s.attributes["url.path"] for s in server_spans] == ["/v1/models"] * 3 + ["/v1/embeddings", "/nope"]
    assert [s.attributes["http.response.status_code"] for s in server_spans] == [200, 200, 200, 200, 404]
    for s in server_spans:
        assert s.resource["process.pid"] == server.pid
        assert s.attributes["url.scheme"] == "https" and s.attributes["server.port"] == server.port
        assert s.attributes["user_agent.original"].startswith("python-requests/")
    assert server_spans[3].name == "embeddings emb" and server_spans[3].attributes["gen_ai.usage.input_tokens"] == 3
    assert [s.attributes["url.full"] for s in client_spans] == [
        f"https://127.0.0.1:{server.port}{path}" for path in ["/v1/models"] * 3 + ["/v1/embeddings", "/nope"]
    ]
    client_by_id = {c.span.span_id: c for c in client_spans}
    for s in server_spans:  # the memory-BIO plaintext landed on the right connection: parent by tuple
        assert client_by_id[s.span.parent_span_id].attributes["url.full"].endswith(s.attributes["url.path"])
        assert s.attributes["otelbpf.association"] == "connection"
    assert_ciphertext_never_parsed(spans, run.stats(), 10)


def test_openai_sdk_over_https_to_the_mock_under_uvicorn_gives_the_plaintext_spans(services, agent, certificate, tmp_path):
    cert, key = certificate
    server = services(
        [str(EXAMPLES / "openai_mock_asgi.py"), "--port", "0", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert),
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    plain = 'client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", '
    assert plain in CLIENT_SCRIPT
    https_script = CLIENT_SCRIPT.replace(
        plain, 'import httpx\nclient = OpenAI(base_url=f"https://127.0.0.1:{port}/v1", http_client=httpx.Client(verify=sys.argv[2]), '
    )
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, https_script, str(cert))
    stats = run.stats()
    assert_genai_spans_match(out, metrics_out, sent, server.pid, client_pid, stats)
    for s in spans_in_file(out):
        assert s.attributes.get("url.scheme", "https") == "https"
        assert s.attributes.get("url.full", "https://").startswith("https://")
    assert_ciphertext_never_parsed(spans_in_file(out), stats, 8)


def test_plaintext_http_still_traced_with_tls_probes_attached_and_no_tls_turns_them_off(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1"])
    for flags, probed in (([], True), (["--no-tls"], False)):
        out = tmp_path / f"spans{len(flags)}.json"
        run = agent(["--pid", str(backend.pid), "--comm", "curl", "--json-file", str(out), *flags])
        assert ("TLS: probing " in run.output) is probed, run.output
        subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/9"], check=True)
        assert run.stop() == 0
        spans = [s for s in spans_in_file(out) if s.span.kind == SERVER]
        assert [(s.name, s.attributes["url.scheme"]) for s in spans] == [("GET /items/{id}", "http")]
        if not probed:
            assert "otelbpf.tls.connections" not in run.stats()


def test_doctor_names_the_tls_libraries_it_can_probe_and_what_it_cannot():
    out = subprocess.run(
        [sys.executable, "-m", "otelbpf", "doctor"], capture_output=True, text=True, cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if "TLS" in line]
    assert any("[  ok]" in line and "libssl" in line and "OpenSSL" in line for line in lines), out.stdout
    assert any("BoringSSL" in line and "not covered" in line for line in lines), out.stdout


ASYNC_CLIENT = textwrap.dedent(
    """
    import asyncio, sys, httpx
    base, ca = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    sys.stdin.readline()

    async def main():
        # asyncio TLS: memory BIOs on the client too, and its first call on a connection is a write
        async with httpx.AsyncClient(base_url=base, verify=ca) as client:
            codes = [(await client.get("/v1/models")).status_code for _ in range(3)]
            posted = await client.post("/v1/embeddings", json={"model": "emb", "input": ["a b", "c"]})
            codes.append(posted.status_code)
        print(" ".join(map(str, codes)), flush=True)

    asyncio.run(main())
    """
)


def test_asyncio_client_and_server_both_on_memory_bios(services, agent, certificate, tmp_path):
    cert, key = certificate
    server = services([str(EXAMPLES / "openai_mock_asgi.py"), "--port", "0", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert)])
    client = start_script(tmp_path, "async_client.py", ASYNC_CLIENT, f"https://127.0.0.1:{server.port}", str(cert))
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(server.pid), "--pid", str(client.pid), "--json-file", str(out)])
    client.stdin.write("go\n")
    client.stdin.flush()
    stdout, stderr = client.communicate(timeout=60)
    assert stdout.split() == ["200"] * 4, stderr
    assert run.stop() == 0
    spans = spans_in_file(out)
    client_spans = [s for s in spans if s.span.kind == CLIENT]
    server_spans = [s for s in spans if s.span.kind == SERVER]
    # the first request of the connection too: its write waited for the send that carried it
    assert [s.attributes["url.full"] for s in client_spans] == [
        f"https://127.0.0.1:{server.port}{path}" for path in ["/v1/models"] * 3 + ["/v1/embeddings"]
    ]
    assert [s.attributes["http.response.status_code"] for s in client_spans] == [200] * 4
    assert client_spans[3].name == "embeddings emb"
    client_by_id = {c.span.span_id: c for c in client_spans}
    for s in server_spans:
        assert client_by_id[s.span.parent_span_id].attributes["url.full"].endswith(s.attributes["url.path"])
    assert_ciphertext_never_parsed(spans, run.stats(), 8)


LATE_SSL_CLIENT = textwrap.dedent(
    """
    import sys, time, socket
    port, ca = int(sys.argv[1]), sys.argv[2]
    maps = open("/proc/self/maps").read()
    print("ready", "ssl" in sys.modules or "libssl" in maps, flush=True)
    sys.stdin.readline()
    import ssl  # loads libssl now (dlopen of _ssl and its libssl), after the agent started

    def get(path):
        context = ssl.create_default_context(cafile=ca)
        with context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as tls:
            tls.sendall(f"GET {path} HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\nConnection: close\\r\\n\\r\\n".encode())
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        return answer.split(b" ", 2)[1].decode()

    codes = [get("/v1/models")]
    time.sleep(1.5)  # the agent re-reads the maps of a process opening a connection (at most once a second)
    codes += [get("/v1/models?late=1"), get("/nope")]
    print(" ".join(codes), flush=True)
    """
)


def test_a_libssl_loaded_after_the_agent_started_is_found_at_the_next_connection(services, agent, certificate, tmp_path):
    cert, key = certificate
    server = services([str(EXAMPLES / "openai_mock_asgi.py"), "--port", "0", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert)])
    script = tmp_path / "late_ssl_client.py"
    script.write_text(LATE_SSL_CLIENT)
    client = subprocess.Popen(
        [sys.executable, "-S", str(script), str(server.port), str(cert)],  # -S: no site module, nothing imports ssl early
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert client.stdout.readline().split() == ["ready", "False"]  # no libssl mapped when the agent starts
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(server.pid), "--pid", str(client.pid), "--json-file", str(out)])
    assert f"TLS: pid {client.pid}:" not in run.output
    client.stdin.write("go\n")
    client.stdin.flush()
    stdout, stderr = client.communicate(timeout=60)
    assert stdout.split() == ["200", "200", "404"], stderr
    assert run.stop() == 0
    assert f"TLS: pid {client.pid}: plaintext of " in run.output  # found once ssl was imported
    client_spans = [s for s in spans_in_file(out) if s.span.kind == CLIENT]
    base = f"https://127.0.0.1:{server.port}"
    # the calls after the first connection are traced on the client side (the first may be missed)
    assert [s.attributes["url.full"] for s in client_spans][-2:] == [f"{base}/v1/models", f"{base}/nope"]
    assert [s.attributes["http.response.status_code"] for s in client_spans][-2:] == [200, 404]
    assert len([s for s in spans_in_file(out) if s.span.kind == SERVER]) == 3


BURSTY_TLS_CLIENT = textwrap.dedent(
    """
    import json, sys
    import httpx
    from openai import OpenAI

    port, ca = int(sys.argv[1]), sys.argv[2]
    print("ready", flush=True)
    sys.stdin.readline()
    client = OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0, timeout=60,
                    http_client=httpx.Client(verify=ca))
    out = []
    for extra in json.loads(sys.argv[3]):
        chunks = list(client.chat.completions.create(
            model="gpt-mock", messages=[{"role": "user", "content": "tell me a long story please"}], stream=True,
            max_tokens=extra.pop("max_tokens"), stream_options={"include_usage": True}, extra_body=extra))
        usage = chunks[-1].usage
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        out.append({"id": chunks[0].id, "input": usage.prompt_tokens, "output": usage.completion_tokens, "finish": finish[0]})
    print(json.dumps(out), flush=True)
    """
)


def test_bursty_llm_streams_over_tls_are_captured_whole_on_both_sides(services, agent, certificate, tmp_path):
    """The bursty mock over TLS on its socket (Python's ssl: one SSL_write per burst, up to
    ~200 KB), read by the openai SDK (SSL_read of a record, up to 16 KiB, into a 64 KiB
    buffer): with the default 4 KiB capture the plaintext of both sides is captured whole
    (bpf/tls.c), so no span has a gap or lost its usage, and none took it from its peer."""
    cert, key = certificate
    server = services(
        [str(EXAMPLES / "openai_mock_server.py"), "--port", "0", "--first-token-delay-ms", "200", "--token-delay-ms", "5",
         "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    )  # fmt: skip
    calls = [
        {"max_tokens": 5},  # one event per write: the first LLM call on the connection's endpoint
        {"max_tokens": 200, "mock_token_bytes": 120, "mock_burst_events": 50},  # ~16 KB per SSL_write
        {"max_tokens": 200, "mock_token_bytes": 120, "mock_burst_events": 0},  # ~64 KB in one
        {"max_tokens": 200, "mock_token_bytes": 1000, "mock_burst_events": 0},  # ~220 KB in one (under 256 KiB)
    ]
    client = start_script(tmp_path, "bursty_tls_client.py", BURSTY_TLS_CLIENT, str(server.port), str(cert), json.dumps(calls))
    out = tmp_path / "spans.json"
    run = agent(["--pid", str(server.pid), "--pid", str(client.pid), "--json-file", str(out)])
    client.stdin.write("go\n")
    client.stdin.flush()
    stdout, stderr = client.communicate(timeout=120)
    assert client.returncode == 0, stderr
    sent = json.loads(stdout.strip().splitlines()[-1])
    assert run.stop() == 0
    stats = run.stats()
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    by_side = {(s.span.kind, s.attributes.get("gen_ai.response.id")): s for s in spans}
    assert len(spans) == 2 * len(calls), [(s.span.kind, s.attributes.get("gen_ai.response.id")) for s in spans]
    for expected, call in zip(sent, calls):
        for kind in (CLIENT, SERVER):
            s = by_side[(kind, expected["id"])]
            attrs = s.attributes
            assert attrs.get("url.scheme", "https") == "https" and attrs.get("url.full", "https://").startswith("https://")
            assert attrs["gen_ai.usage.input_tokens"] == expected["input"], (kind, expected, attrs)
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"] == call["max_tokens"], (kind, attrs)
            assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]], (kind, attrs)
            assert "otelbpf.genai.usage.source" not in attrs, (kind, attrs)  # its own, not the peer's
            assert "otelbpf.payload.truncated" not in attrs and "otelbpf.gen_ai.response.gaps" not in attrs, (kind, attrs)
    assert_ciphertext_never_parsed(spans_in_file(out), stats, 2 * len(calls))
