"""Real eBPF: LLM streams as real engines send them, bursty, read tens of KiB at once.

The bundled mock (examples/openai_mock_server.py) writes many SSE events per write
(``--burst-events``); the real ``openai`` SDK reads them (httpx reads up to 64 KiB per
call). Both are traced with the default --capture-bytes (4 KiB), so a response read is
much larger than the prefix the kernel copies: once the agent saw the LLM request on a
connection it marks it for whole capture (bpf/socket.c, emit_whole) and every span keeps
its usage and finish reason. Two CPU hogs run beside them, so the agent is slow to mark
(what it misses is what the resync and the peer fill are for).

A capture gap is injected mid-stream: one server write larger than the whole-capture
bound (256 KiB); the bytes past it are cut, the stream resumes at the next chunk and the
usage chunk, written after it, is still read; the server span says so
(otelbpf.payload.truncated, otelbpf.gen_ai.response.gaps).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

SERVER, CLIENT = 2, 3
RUNS = 20

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from openai import OpenAI

    port, runs = int(sys.argv[1]), int(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "tell me a long story please"}]
    out = []

    def streamed(**extra):
        chunks = list(client.chat.completions.create(model="gpt-mock", messages=messages, stream=True, max_tokens=200,
                                                     stream_options={"include_usage": True}, extra_body=extra))
        usage = chunks[-1].usage
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return {"id": chunks[0].id, "input": usage.prompt_tokens, "output": usage.completion_tokens, "finish": finish[0]}

    for i in range(runs):
        out.append(streamed(mock_token_bytes=120, mock_burst_events=(0 if i % 2 else 50)))
    # the gap: one write of ~330 KB (over the 256 KiB bound), then the usage in its own write
    out.append(streamed(mock_token_bytes=1650, mock_burst_events=0))
    print(json.dumps(out), flush=True)
    """
)


@pytest.fixture
def cpu_hogs():
    """Starts two busy loops when called (after the agent attached: its start-up compile
    would take minutes beside them on a small machine)."""
    hogs: list[subprocess.Popen] = []

    def start() -> None:
        hogs.extend(subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2))

    yield start
    for hog in hogs:
        hog.kill()
        hog.wait()


def test_bursty_streams_keep_their_usage_and_a_gap_is_marked(services, agent, tmp_path, cpu_hogs):
    server = services([str(EXAMPLES / "openai_mock_server.py"), "--port", "0", "--first-token-delay-ms", "200",
                       "--token-delay-ms", "5"])  # fmt: skip
    # the default capture size: the bursts are what must be captured whole
    out, _metrics, sent, run, _client_pid = run_openai_client(
        agent, tmp_path, server, CLIENT_SCRIPT, str(RUNS), capture=(), after_attach=cpu_hogs, timeout=300
    )
    stats = run.stats()

    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    by_side = {(s.span.kind, s.attributes.get("gen_ai.response.id")): s for s in spans}
    assert len(spans) == 2 * (RUNS + 1), [(s.name, s.span.kind, s.attributes.get("gen_ai.response.id")) for s in spans]
    for expected in sent:
        for kind in (CLIENT, SERVER):
            attrs = by_side[(kind, expected["id"])].attributes
            assert attrs["gen_ai.usage.input_tokens"] == expected["input"], (kind, expected, attrs)
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"] == 200, (kind, expected, attrs)
            assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]], (kind, attrs)

    gap = by_side[(SERVER, sent[-1]["id"])].attributes
    assert gap["otelbpf.payload.truncated"] is True and gap["otelbpf.gen_ai.response.gaps"] >= 1, gap
    assert "otelbpf.genai.usage.source" not in gap  # its own usage chunk, read after the gap
    # the client read it 64 KiB at a time: captured whole, nothing lost
    assert "otelbpf.gen_ai.response.gaps" not in by_side[(CLIENT, sent[-1]["id"])].attributes
    # a span whose own bytes lost the usage (the agent, beside the hogs, marked its connection
    # late) took it from the other end: said so, and never both ends of one call
    peer_filled = [(s.span.kind, s.attributes.get("gen_ai.response.id")) for s in spans
                   if s.attributes.get("otelbpf.genai.usage.source") == "peer"]
    assert len({response_id for _, response_id in peer_filled}) == len(peer_filled), peer_filled
    assert stats.get("otelbpf.events.lost", 0) == 0
