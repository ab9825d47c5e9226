"""Real eBPF: LLM streams as real engines send them, bursty, read tens of KiB at once.

The bundled mock (examples/openai_mock_server.py) writes many SSE events per write
(``mock_burst_events``); the real ``openai`` SDK reads them (httpx reads up to 64 KiB per
call). Both are traced with the default --capture-bytes (4 KiB), so a response read is
much larger than the prefix the kernel copies: the connections of an LLM call are
captured whole (bpf/socket.c, emit_whole) and every span keeps its own usage and finish
reason, 20 runs in a row, beside two CPU hogs.

The hogs starve the agent (it runs at nice 10): it reads the ring up to seconds late, so
it marks a new connection for whole capture long after the stream's first bursts went
by. What makes the runs hold is the kernel's memory of the server endpoint (socket.c
whole_endpoints): the agent learns it from the first LLM call it sees there (the warm-up,
made before the hogs start), and every later connection to it, from any process, is
captured whole from its first byte. Each run is a new client process (forked: a real SDK
client, new connections), with a burst of 50 events per write and one of all 200 tokens at
once.

A capture gap is injected in the last run: one server write larger than the whole-capture
bound (256 KiB); the bytes past it are cut, the stream resumes at the next chunk and the
usage chunk, written after it, is still read; the server span says so
(otelbpf.payload.truncated, otelbpf.gen_ai.response.gaps).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

SERVER, CLIENT = 2, 3
RUNS = 20
#: each run's calls: a burst of 50 events (~16 KB) per write, then all 200 tokens (~64 KB) in one
BURSTS = [{"mock_token_bytes": 120, "mock_burst_events": 50}, {"mock_token_bytes": 120, "mock_burst_events": 0}]
#: the gap, in the last run: one write of ~330 KB (over the 256 KiB bound), then the usage in its own write
GAP = {"mock_token_bytes": 1650, "mock_burst_events": 0}

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from openai import OpenAI  # imported once: each run is a fork, a new process with a new client

    port, runs, run_calls, last_calls = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])

    def one_run(calls):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", max_retries=0, timeout=60)
        out = []
        for extra in calls:
            chunks = list(client.chat.completions.create(
                model="gpt-mock", messages=[{"role": "user", "content": "tell me a long story please"}], stream=True,
                max_tokens=200, stream_options={"include_usage": True}, extra_body=extra))
            usage = chunks[-1].usage
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            out.append({"id": chunks[0].id, "input": usage.prompt_tokens, "output": usage.completion_tokens,
                        "finish": finish[0]})
        return out

    print("ready", flush=True)
    sys.stdin.readline()
    out = []
    for i in range(runs):  # one after the other
        calls = run_calls + (last_calls if i == runs - 1 else [])
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(one_run(calls)))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            got = pipe.read()
        assert os.waitpid(pid, 0)[1] == 0 and got, f"run {i} failed"
        out += json.loads(got)
    print(json.dumps(out), flush=True)
    """
)


def stream_once(port: int) -> None:
    """One small streamed chat call from this (untraced) process: an event per write."""
    body = {"model": "gpt-mock", "messages": [{"role": "user", "content": "hello"}], "stream": True, "max_tokens": 5,
            "stream_options": {"include_usage": True}}  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert b"data: [DONE]" in response.read()


def wait_for_spans(run, count: int, timeout: float = 20.0) -> None:
    """Until the agent's periodic stats (--stats-interval) say it made ``count`` spans."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in reversed(run.stderr_lines):
            if line.startswith("otelbpf: stats "):
                if json.loads(line[len("otelbpf: stats ") :]).get("otelbpf.spans.created", 0) >= count:
                    return
                break
        time.sleep(0.05)
    raise AssertionError("the agent made no span of the warm-up call:\n" + run.output)


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


def test_bursty_streams_keep_their_usage_20_runs_in_a_row_beside_cpu_hogs(services, agent, tmp_path, cpu_hogs):
    server = services([str(EXAMPLES / "openai_mock_server.py"), "--port", "0", "--first-token-delay-ms", "200",
                       "--token-delay-ms", "5"])  # fmt: skip
    runs = []

    def started(args):
        runs.append(agent(args))
        return runs[-1]

    def warm_up_then_hogs() -> None:
        # The endpoint's first LLM call, with the CPU free: the agent learns the endpoint.
        stream_once(server.port)
        wait_for_spans(runs[0], 1)
        cpu_hogs()

    # the default capture size (the bursts are what must be captured whole); stats every 0.1 s
    out, _metrics, sent, run, _client_pid = run_openai_client(
        started, tmp_path, server, CLIENT_SCRIPT, str(RUNS), json.dumps(BURSTS), json.dumps([GAP]),
        capture=("--stats-interval", "0.1"), after_attach=warm_up_then_hogs, timeout=300,
    )  # fmt: skip
    stats = run.stats()

    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    by_side = {(s.span.kind, s.attributes.get("gen_ai.response.id")): s for s in spans}
    calls = RUNS * len(BURSTS) + 1
    assert len(sent) == calls and len(spans) == 2 * calls + 1, [(s.span.kind, s.attributes.get("gen_ai.response.id")) for s in spans]  # fmt: skip
    gap_id = sent[-1]["id"]
    for run_index in range(RUNS):
        for expected in sent[run_index * len(BURSTS) : (run_index + 1) * len(BURSTS)] + ([sent[-1]] if run_index == RUNS - 1 else []):
            for kind in (CLIENT, SERVER):
                attrs = by_side[(kind, expected["id"])].attributes
                where = (run_index, kind, expected)
                # its own usage: read from its own bytes, not filled from the other end
                assert "otelbpf.genai.usage.source" not in attrs, (where, attrs)
                assert attrs["gen_ai.usage.input_tokens"] == expected["input"], (where, attrs)
                assert attrs["gen_ai.usage.output_tokens"] == expected["output"] == 200, (where, attrs)
                assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]], (where, attrs)
                if (kind, expected["id"]) != (SERVER, gap_id):
                    assert "otelbpf.payload.truncated" not in attrs, (where, attrs)  # every burst captured whole
                    assert "otelbpf.gen_ai.response.gaps" not in attrs, (where, attrs)

    gap = by_side[(SERVER, gap_id)].attributes
    assert gap["otelbpf.payload.truncated"] is True and gap["otelbpf.gen_ai.response.gaps"] >= 1, gap
    assert "otelbpf.genai.usage.peer_filled" not in stats and stats.get("otelbpf.events.lost", 0) == 0, stats


def test_bursts_written_with_sendmsg_a_buffer_per_event_are_captured_whole(services, agent, tmp_path):
    """A server that writes each burst with one sendmsg of a buffer per SSE chunk (as
    asyncio's writelines does on Python 3.12+): the gathered writes (up to 64 iovecs, the
    probe's bound) are captured whole across their iovecs (bpf/socket.c,
    emit_whole_gathered), so the server spans have no gap and keep their usage."""
    server = services([str(EXAMPLES / "openai_mock_server.py"), "--port", "0", "--first-token-delay-ms", "200",
                       "--token-delay-ms", "5", "--gather"])  # fmt: skip
    runs = []

    def started(args):
        runs.append(agent(args))
        return runs[-1]

    def warm_up() -> None:
        stream_once(server.port)
        wait_for_spans(runs[0], 1)

    calls = [
        {"mock_token_bytes": 120, "mock_burst_events": 50},  # 50 iovecs of ~300 B
        {"mock_token_bytes": 600, "mock_burst_events": 40},  # 40 iovecs of ~800 B: ~32 KB, 3 pieces
        {"mock_token_bytes": 120, "mock_burst_events": 64},  # 64 iovecs: the bound (MAX_IOV)
    ]
    out, _metrics, sent, run, _client_pid = run_openai_client(
        started, tmp_path, server, CLIENT_SCRIPT, "1", json.dumps(calls), "[]",
        capture=("--stats-interval", "0.1"), after_attach=warm_up, timeout=120,
    )  # fmt: skip
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    by_side = {(s.span.kind, s.attributes.get("gen_ai.response.id")): s for s in spans}
    assert len(sent) == len(calls) and len(spans) == 2 * len(calls) + 1, [(s.span.kind, s.name) for s in spans]
    for expected in sent:
        for kind in (CLIENT, SERVER):
            attrs = by_side[(kind, expected["id"])].attributes
            assert "otelbpf.genai.usage.source" not in attrs, (kind, expected, attrs)
            assert attrs["gen_ai.usage.output_tokens"] == expected["output"] == 200, (kind, expected, attrs)
            assert attrs["gen_ai.response.finish_reasons"] == [expected["finish"]], (kind, attrs)
            assert "otelbpf.payload.truncated" not in attrs and "otelbpf.gen_ai.response.gaps" not in attrs, (kind, attrs)
    assert run.stats().get("otelbpf.events.lost", 0) == 0
