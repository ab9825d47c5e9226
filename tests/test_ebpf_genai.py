"""Real eBPF, real processes: LLM API calls traced from the wire, on both sides.

The bundled OpenAI-compatible mock server (examples/openai_mock_server.py) and
a client process using the real ``openai`` SDK run unmodified; the agent
(``python -m otelbpf run``) traces both. Every LLM call gives a CLIENT span (the
SDK's process) and a SERVER span (the mock's), both with the GenAI name and
attributes, equal to what the server sent (the client prints what the SDK
received), and the time to first chunk measured from kernel timestamps.

Tolerance of the time to first chunk: the mock sleeps its first-token delay
(300 ms) after it has read the request and before it writes the first token,
and ``time.sleep`` never returns early, so on both sides the measured time
(request's first byte -> first output chunk, one monotonic kernel clock) is at
least the delay. What comes on top is the mock's JSON parse and role-chunk
write (well under 1 ms), loopback delivery and scheduling: 250 ms above the
delay leaves a loaded machine room (436 ms was seen for 300 at a load of 4 on
2 CPUs) while still catching a timing taken from the wrong chunk (the role
chunk is written at once: ~0 ms) or the wrong end (the last chunk:
>= 300 + 5 x 60 ms = 600 ms).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import EXAMPLES
from otlp_receiver import attributes_dict
from test_ebpf_http import spans_in_file

from otelbpf.metrics import read_metrics_json_file

pytestmark = pytest.mark.ebpf

SERVER, CLIENT = 2, 3  # OTLP SpanKind
FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS = 300, 60
TTFT_SLACK_S = 0.250
SECRET = "sk-test-SECRET-not-to-be-exported"


def assert_stream_timing(attrs: dict, kind: int, chunks: int, first_token_delay_ms: int, token_delay_ms: int, what=None) -> None:
    """A streamed call's timing on one side, against the mock's delays: TTFT from the server's
    first-token delay up to TTFT_SLACK_S later, ``chunks`` chunks, and the mean gap between
    them at the token delay (to 50 ms above). The server writes a token every delay; the client
    reads them then, unless it falls behind and reads two at once (a late first read shortens
    the mean): 20% below is allowed there."""
    delay = first_token_delay_ms / 1000
    ttft = attrs["gen_ai.response.time_to_first_chunk"]
    assert delay <= ttft <= delay + TTFT_SLACK_S, (what, kind, ttft)
    assert attrs["otelbpf.gen_ai.response.chunks"] == chunks, (what, kind)
    per_chunk = attrs["otelbpf.gen_ai.response.time_per_output_chunk"]
    low = token_delay_ms / 1000 * (1.0 if kind == SERVER else 0.8)
    assert low <= per_chunk <= token_delay_ms / 1000 + 0.05, (what, kind, per_chunk)

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from openai import OpenAI

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=SECRET, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "hello mock world"}]
    out = {}

    r = client.chat.completions.create(model="gpt-mock", messages=messages, max_tokens=4, temperature=0.5, top_p=0.9)
    out["chat"] = {"id": r.id, "model": r.model, "input": r.usage.prompt_tokens, "output": r.usage.completion_tokens,
                   "finish": r.choices[0].finish_reason}

    def streamed(**kwargs):
        chunks = list(client.chat.completions.create(model="gpt-mock", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}, **kwargs))
        usage = chunks[-1].usage
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return {"id": chunks[0].id, "model": chunks[0].model, "input": usage.prompt_tokens,
                "output": usage.completion_tokens, "finish": finish[0], "bytes": len(text)}

    out["stream"] = streamed(max_tokens=6)
    out["big"] = streamed(max_tokens=300, extra_body={"mock_token_bytes": 1024, "mock_first_token_delay_ms": 0,
                                                      "mock_token_delay_ms": 5})
    e = client.embeddings.create(model="emb-mock", input=["a b", "c"], encoding_format="float")
    out["embeddings"] = {"model": e.model, "input": e.usage.prompt_tokens, "count": len(e.data)}
    print(json.dumps(out), flush=True)
    """
).replace("SECRET", repr(SECRET))


def metric_names(path) -> dict[str, list[dict]]:
    names: dict[str, list[dict]] = {}
    for request in read_metrics_json_file(path):
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.histogram.data_points:
                        names.setdefault(metric.name, []).append(attributes_dict(point.attributes))
    return names


class OpenAiRun(NamedTuple):
    out: Path  # spans, OTLP JSON lines
    metrics_out: Path
    sent: dict  # what the SDK received, per call
    run: object  # the stopped AgentProcess
    client_pid: int


def run_openai_client(
    agent, tmp_path, server, script_text: str, *script_args: str,
    capture: tuple[str, ...] = ("--capture-bytes", "8192"), after_attach=None, timeout: float = 120,
) -> OpenAiRun:  # fmt: skip
    """Start ``script_text`` (a CLIENT_SCRIPT variant) against ``server``, attach the agent to
    both, let the client make its calls, stop the agent. 8 KiB per syscall by default
    (``capture``): a read that gathers several 1 KiB events of the 300 KB stream (5 ms apart)
    is still copied whole unless the SDK falls 35 ms behind. ``after_attach`` runs once the
    agent is attached, before the client starts its calls."""
    script = tmp_path / "openai_client.py"
    script.write_text(script_text)
    client = subprocess.Popen(
        [sys.executable, str(script), str(server.port), *script_args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, metrics_out = tmp_path / "spans.json", tmp_path / "metrics.json"
    try:
        assert client.stdout.readline().strip() == "ready", client.stderr.read()
        run = agent(
            ["--pid", str(server.pid), "--pid", str(client.pid), *capture,
             "--json-file", str(out), "--metrics-json-file", str(metrics_out)]
        )  # fmt: skip
        if after_attach is not None:
            after_attach()
        client.stdin.write("go\n")
        client.stdin.flush()
        stdout, stderr = client.communicate(timeout=timeout)
    finally:
        if client.poll() is None:
            client.kill()
    assert client.returncode == 0, stderr
    sent = json.loads(stdout.strip().splitlines()[-1])
    assert run.stop() == 0, run.output
    return OpenAiRun(out, metrics_out, sent, run, client.pid)


def test_openai_sdk_against_the_mock_server_gives_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services(
        [str(EXAMPLES / "openai_mock_server.py"), "--port", "0",
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT)
    assert_genai_spans_match(out, metrics_out, sent, server.pid, client_pid, run.stats())


def assert_genai_spans_match(out, metrics_out, sent, server_pid, client_pid, stats) -> None:
    """The spans and metrics of CLIENT_SCRIPT's calls (``sent``: what the SDK received) on both sides."""
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 8, [(s.name, s.span.kind) for s in spans_in_file(out)]
    by_side = {(s.span.kind, s.attributes.get("gen_ai.response.id") or s.attributes["gen_ai.operation.name"]): s for s in spans}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server_pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client_pid}

    for call in ("chat", "stream", "big"):
        expected = sent[call]
        client_span, server_span = by_side[(CLIENT, expected["id"])], by_side[(SERVER, expected["id"])]
        assert server_span.span.parent_span_id == client_span.span.span_id  # one trace, both ends
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == "chat gpt-mock"
            assert attrs["gen_ai.operation.name"] == "chat"
            assert attrs["gen_ai.provider.name"] == "openai_compatible"
            assert attrs["gen_ai.request.model"] == "gpt-mock"
            assert attrs["gen_ai.response.model"] == expected["model"]
            assert attrs["gen_ai.usage.input_tokens"] == expected["input"]
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"]
            assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]]
            assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200
            assert attrs["gen_ai.request.stream"] is (call != "chat")

    chat = by_side[(CLIENT, sent["chat"]["id"])].attributes
    assert (chat["gen_ai.request.max_tokens"], chat["gen_ai.request.temperature"], chat["gen_ai.request.top_p"]) == (4, 0.5, 0.9)
    assert "gen_ai.response.time_to_first_chunk" not in chat

    for kind in (CLIENT, SERVER):
        assert_stream_timing(by_side[(kind, sent["stream"]["id"])].attributes, kind, 6, FIRST_TOKEN_DELAY_MS, TOKEN_DELAY_MS)

    assert sent["big"]["bytes"] > 256 * 1024
    for kind in (CLIENT, SERVER):
        attrs = by_side[(kind, sent["big"]["id"])].attributes
        assert attrs["http.response.body.size"] > 256 * 1024
        assert attrs["gen_ai.usage.output_tokens"] == 300 and attrs["otelbpf.gen_ai.response.chunks"] == 300

    for kind in (CLIENT, SERVER):
        embeddings = by_side[(kind, "embeddings")]
        assert embeddings.name == "embeddings emb-mock"
        assert embeddings.attributes["gen_ai.response.model"] == sent["embeddings"]["model"]
        assert embeddings.attributes["gen_ai.usage.input_tokens"] == sent["embeddings"]["input"]

    # private by default: no content, and never the API key
    for s in spans_in_file(out):
        assert "gen_ai.input.messages" not in s.attributes and "gen_ai.output.messages" not in s.attributes
        assert not any(SECRET in str(value) for value in s.attributes.values())

    names = metric_names(metrics_out)
    for name in ("gen_ai.client.operation.duration", "gen_ai.client.token.usage", "gen_ai.client.operation.time_to_first_chunk",
                 "gen_ai.client.operation.time_per_output_chunk", "gen_ai.server.request.duration",
                 "gen_ai.server.time_to_first_token", "gen_ai.server.time_per_output_token"):  # fmt: skip
        assert name in names, sorted(names)
    assert {p.get("gen_ai.token.type") for p in names["gen_ai.client.token.usage"]} == {"input", "output"}
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert not any(key.startswith("otelbpf.spans.failed") for key in stats), stats


#: The same calls over cleartext HTTP/2 (prior knowledge): httpx as the SDK's transport.
CLIENT_SCRIPT_H2 = CLIENT_SCRIPT.replace("from openai import OpenAI", "import httpx\nfrom openai import OpenAI").replace(
    "max_retries=0, timeout=60)", "max_retries=0, timeout=60,\n                http_client=httpx.Client(http1=False, http2=True, timeout=60))"
)


def test_openai_sdk_over_http2_gives_the_same_genai_spans(services, agent, tmp_path):
    """LLM calls on HTTP/2 streams (Hypercorn serving the mock, httpx speaking h2c):
    the same GenAI spans, TTFT and metrics on both sides as over HTTP/1.1."""
    assert "http2=True" in CLIENT_SCRIPT_H2
    server = services(
        [str(EXAMPLES / "openai_mock_asgi.py"), "--server", "hypercorn", "--port", "0",
         "--first-token-delay-ms", str(FIRST_TOKEN_DELAY_MS), "--token-delay-ms", str(TOKEN_DELAY_MS)]
    )  # fmt: skip
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT_H2)
    assert_genai_spans_match(out, metrics_out, sent, server.pid, client_pid, run.stats())
    for s in spans_in_file(out):
        if "gen_ai.operation.name" in s.attributes:
            assert s.attributes["network.protocol.version"] == "2", s.name
