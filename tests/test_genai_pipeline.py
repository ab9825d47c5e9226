"""LLM API calls on HTTP/1 through the in-process pipeline: synthetic events in, GenAI spans and metrics out.

Both sides (the client's CLIENT span, the server's SERVER span), streamed and
not, a streamed response far longer than any byte prefix, embeddings, content
opt-in, and the pipeline without GenAI.
"""

from __future__ import annotations

import json

from otelbpf import semconv as sc
from otelbpf.cli.main import build_parser
from otelbpf.core.model import SpanKind
from otelbpf.metrics.histograms import SpanMetrics
from otelbpf.semantics import genai
from otelbpf.semantics.common import SpanOptions
from protocols.base import Direction
from tests.test_pipeline import accepted, connected, data, make_pipeline

IN, OUT = Direction.INGRESS, Direction.EGRESS
CLIENT_PID, SERVER_PID = 100, 200
SECRET = "sk-proj-SECRET-0123456789"


def post(path: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: OpenAI/Python 1.99\r\n"
        f"Authorization: Bearer {SECRET}\r\napi-key: {SECRET}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(raw)}\r\n\r\n"
    ).encode()
    return head + raw


def json_response(body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw)


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def sse_chunk(payload) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    event = f"data: {text}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(event), event)


def delta(content=None, finish=None, role=None) -> dict:
    d = {"role": role} if role else {}
    if content is not None:
        d["content"] = content
    return {"id": "chatcmpl-7", "object": "chat.completion.chunk", "model": "gpt-mock-0613", "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def both_sides(request: bytes, response: list[tuple[int, bytes]], *, capture=False, attach=True):
    """The client (pid 100) writes ``request`` at 10, the server (pid 200) reads it at 11;
    each (ts, bytes) of ``response`` is written by the server at ts and read by the client at ts + 1."""
    pipeline, out, counters = make_pipeline()
    pipeline.options = SpanOptions(capture_genai_content=capture)
    layer = genai.attach(pipeline) if attach else None
    metrics = SpanMetrics(pipeline.resources, pipeline.registry.instruments())
    events = [connected(1, CLIENT_PID, local_port=40000, peer_port=8000), accepted(2, SERVER_PID, local_port=8000, peer_port=40000)]
    events += [data(10, 1, CLIENT_PID, OUT, request, fd=6), data(11, 2, SERVER_PID, IN, request)]
    for ts, payload in response:
        events += [data(ts, 2, SERVER_PID, OUT, payload), data(ts + 1, 1, CLIENT_PID, IN, payload, fd=6)]
    pipeline.handle(events)
    for span in out.spans:
        metrics.record(span)
    spans = {span.kind: span for span in out.spans}
    assert set(spans) == {SpanKind.CLIENT, SpanKind.SERVER}
    if layer is not None:
        assert len(layer) == 0  # every call's state was dropped with its span
    return spans[SpanKind.CLIENT], spans[SpanKind.SERVER], metrics, counters


CHAT = {"messages": [{"role": "user", "content": "hello mock world"}], "model": "gpt-mock", "max_tokens": 4, "temperature": 0.5, "top_p": 0.9}


def no_secret_anywhere(*spans) -> None:
    for span in spans:
        for key, value in span.attributes.items():
            assert SECRET not in str(value), key
            assert "authorization" not in key.lower() and "api-key" not in key.lower()


def test_non_streamed_chat_on_both_sides() -> None:
    body = {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-mock-0613",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok0 tok1"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }  # fmt: skip
    client, server, _, _ = both_sides(post("/v1/chat/completions", CHAT), [(50, json_response(body))])
    assert server.parent_span_id == client.span_id
    for span in (client, server):
        attrs = span.attributes
        assert span.name == "chat gpt-mock"
        assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[sc.GEN_AI_PROVIDER_NAME] == "openai_compatible"
        assert (attrs[sc.GEN_AI_REQUEST_MODEL], attrs[sc.GEN_AI_RESPONSE_MODEL]) == ("gpt-mock", "gpt-mock-0613")
        assert (attrs[sc.GEN_AI_REQUEST_MAX_TOKENS], attrs[sc.GEN_AI_REQUEST_TEMPERATURE], attrs[sc.GEN_AI_REQUEST_TOP_P]) == (4, 0.5, 0.9)
        assert attrs[sc.GEN_AI_REQUEST_STREAM] is False
        assert (attrs[sc.GEN_AI_RESPONSE_ID], attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ("chatcmpl-1", ["length"])
        assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (3, 4)
        assert sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK not in attrs  # not streamed
        # still an HTTP exchange
        assert (attrs[sc.HTTP_REQUEST_METHOD], attrs[sc.HTTP_RESPONSE_STATUS_CODE]) == ("POST", 200)
        assert sc.GEN_AI_INPUT_MESSAGES not in attrs and sc.GEN_AI_OUTPUT_MESSAGES not in attrs  # opt-in only
    assert server.attributes[sc.HTTP_ROUTE] == "/v1/chat/completions"
    no_secret_anywhere(client, server)


def streamed_chat(tokens: list[str], *, token_bytes: int = 0, usage=True) -> tuple[list[tuple[int, bytes]], int]:
    """(ts, bytes) the server writes: the head and the role chunk at 100, tokens from 300 every 10, then the end."""
    out = [(100, SSE_HEAD + sse_chunk(delta("", role="assistant")))]
    ts = 300
    for token in tokens:
        out.append((ts, sse_chunk(delta(token + "x" * token_bytes))))
        ts += 10
    out.append((ts, sse_chunk(delta(finish="stop"))))
    if usage:
        out.append((ts + 1, sse_chunk({"id": "chatcmpl-7", "model": "gpt-mock-0613", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}})))
    out.append((ts + 2, sse_chunk("[DONE]") + b"0\r\n\r\n"))
    return out, ts - 10


def test_streamed_chat_times_its_first_chunk_from_the_wire_on_both_sides() -> None:
    request = post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    response, last = streamed_chat(["tok0 ", "tok1 ", "tok2 ", "tok3 "])
    client, server, metrics, _ = both_sides(request, response)
    # The role chunk (at 100) is not output: the first token is (written at 300, read at 301).
    assert server.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == (300 - 11) / 1e9
    assert client.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == (301 - 10) / 1e9
    for span in (client, server):
        attrs = span.attributes
        assert attrs[sc.GEN_AI_REQUEST_STREAM] is True
        assert attrs[sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS] == 4
        assert attrs[sc.OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK] == 10 / 1e9
        assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (3, 4)
        assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"] and attrs[sc.GEN_AI_RESPONSE_ID] == "chatcmpl-7"
    points = metric_points(metrics)
    assert points[sc.GEN_AI_CLIENT_TOKEN_USAGE] == {"input": [3.0], "output": [4.0]}
    assert points[sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK] == {None: [(301 - 10) / 1e9]}
    assert points[sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK] == {None: [10 / 1e9]}
    assert points[sc.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN] == {None: [(300 - 11) / 1e9]}
    [per_token] = points[sc.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN][None]  # 4 chunks carried 4 tokens
    assert abs(per_token - 10 / 1e9) < 1e-15
    assert len(points[sc.GEN_AI_CLIENT_OPERATION_DURATION][None]) == 1 and len(points[sc.GEN_AI_SERVER_REQUEST_DURATION][None]) == 1
    assert sc.HTTP_CLIENT_REQUEST_DURATION in points and sc.HTTP_SERVER_REQUEST_DURATION in points  # still HTTP too
    for name in (sc.GEN_AI_CLIENT_OPERATION_DURATION, sc.GEN_AI_SERVER_REQUEST_DURATION):
        [attributes] = metric_attributes(metrics, name)
        assert attributes[sc.GEN_AI_REQUEST_MODEL] == "gpt-mock" and attributes[sc.GEN_AI_PROVIDER_NAME] == "openai_compatible"


def test_a_streamed_response_over_256_kib_still_yields_its_usage() -> None:
    request = post("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 400})
    response, _ = streamed_chat([f"t{i}" for i in range(400)], token_bytes=1000)
    assert sum(len(b) for _, b in response) > 256 * 1024
    client, server, _, _ = both_sides(request, response)
    for span in (client, server):
        assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 400
        assert span.attributes[sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS] == 400
        assert span.attributes[sc.HTTP_RESPONSE_BODY_SIZE] > 256 * 1024


def test_embeddings_on_both_sides() -> None:
    request = post("/v1/embeddings", {"input": ["a b", "c"], "model": "text-embedding-mock", "encoding_format": "float"})
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": [0.123456789] * 4096} for i in range(2)],
        "model": "text-embedding-mock",
        "usage": {"prompt_tokens": 3, "total_tokens": 3},
    }
    raw = json_response(body)
    assert len(raw) > 64 * 1024  # longer than the parse limit: usage comes from the kept tail
    client, server, metrics, _ = both_sides(request, [(50, raw[:30000]), (51, raw[30000:])])
    for span in (client, server):
        assert span.name == "embeddings text-embedding-mock"
        assert span.attributes[sc.GEN_AI_OPERATION_NAME] == "embeddings"
        assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3
        assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in span.attributes
        assert sc.GEN_AI_REQUEST_STREAM not in span.attributes
    assert metric_points(metrics)[sc.GEN_AI_CLIENT_TOKEN_USAGE] == {"input": [3.0]}


def test_content_is_captured_only_when_asked_and_never_the_credentials() -> None:
    request = post("/v1/chat/completions", {**CHAT, "stream": True})
    response, _ = streamed_chat(["Hel", "lo"], usage=False)
    client, server, _, _ = both_sides(request, response, capture=True)
    for span in (client, server):
        assert json.loads(span.attributes[sc.GEN_AI_INPUT_MESSAGES]) == [{"role": "user", "parts": [{"type": "text", "content": "hello mock world"}]}]
        assert json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES]) == [
            {"role": "assistant", "parts": [{"type": "text", "content": "Hello"}], "finish_reason": "stop"}
        ]
        assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in span.attributes  # no usage chunk: not reported
    no_secret_anywhere(client, server)


def test_without_the_genai_layer_an_llm_call_is_a_plain_http_span() -> None:
    request = post("/v1/chat/completions", {**CHAT, "stream": True})
    response, _ = streamed_chat(["a"])
    client, server, metrics, _ = both_sides(request, response, attach=False)
    assert (client.name, server.name) == ("POST", "POST /v1/chat/completions")
    assert not any(key.startswith("gen_ai.") for span in (client, server) for key in span.attributes)
    assert not any(name.startswith("gen_ai.") for name in metric_points(metrics))


def test_other_http_exchanges_are_untouched_and_keep_no_state() -> None:
    pipeline, out, _ = make_pipeline()
    layer = genai.attach(pipeline)
    body = b'{"prompt": "not an llm path"}'
    request = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    pipeline.handle([accepted(1, 200), data(10, 1, 200, IN, request), data(20, 1, 200, OUT, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")])
    [span] = out.spans
    assert span.name == "POST /predict" and not any(key.startswith("gen_ai.") for key in span.attributes)
    assert len(layer) == 0


def test_an_llm_call_cut_short_still_becomes_one_span_and_drops_its_state() -> None:
    pipeline, out, _ = make_pipeline()
    layer = genai.attach(pipeline)
    from otelbpf.core.events import ConnClose

    request = post("/v1/chat/completions", {**CHAT, "stream": True})
    pipeline.handle([accepted(1, 200), data(10, 1, 200, IN, request), data(20, 1, 200, OUT, SSE_HEAD + sse_chunk(delta("x"))), ConnClose(30, 200, 200, 5, 1)])
    [span] = out.spans
    assert span.attributes[sc.GEN_AI_OPERATION_NAME] == "chat" and span.attributes[sc.OTELBPF_EXCHANGE_END_REASON] == "connection_closed"
    assert span.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == 10 / 1e9
    assert len(layer) == 0


def test_the_layer_bounds_the_calls_it_tracks() -> None:
    pipeline, out, counters = make_pipeline()
    layer = genai.attach(pipeline)
    layer.max_calls = 2
    request = post("/v1/chat/completions", CHAT)
    events = [accepted(i, 200, fd=i, peer_port=40000 + i) for i in range(1, 5)]
    events += [data(10 + i, i, 200, IN, request, fd=i) for i in range(1, 5)]
    pipeline.handle(events)
    assert len(layer) == 2 and counters.get("otelbpf.genai.calls.evicted") == 2


def test_the_cli_has_the_opt_in_flag_and_replay_pipelines_get_genai() -> None:
    args = build_parser().parse_args(["run", "--all", "--capture-genai-content"])
    assert args.capture_genai_content is True
    assert build_parser().parse_args(["run", "--all"]).capture_genai_content is False
    assert SpanOptions().capture_genai_content is False


def test_provider_names() -> None:
    from protocols.genai.apis import ollama, openai

    assert genai.provider_name("api.openai.com", openai.API) == "openai"
    assert genai.provider_name("myres.openai.azure.com", openai.API) == "azure.ai.openai"
    assert genai.provider_name("localhost", ollama.API) == "ollama"
    assert genai.provider_name("vllm.internal", openai.API) == "openai_compatible"


# -- metric helpers ----------------------------------------------------------------------


def metric_points(metrics: SpanMetrics) -> dict[str, dict]:
    """name -> {gen_ai.token.type (or None): [sum per series...]}."""
    out: dict[str, dict] = {}
    for process in metrics.collect().processes:
        for instrument, points in process.histograms:
            for point in points:
                key = point.attributes.get(sc.GEN_AI_TOKEN_TYPE)
                out.setdefault(instrument.name, {}).setdefault(key, []).append(point.sum)
    return out


def metric_attributes(metrics: SpanMetrics, name: str) -> list[dict]:
    return [
        point.attributes
        for process in metrics.collect().processes
        for instrument, points in process.histograms
        if instrument.name == name
        for point in points
    ]


def test_a_request_body_cut_by_the_capture_size_is_still_an_llm_call() -> None:
    from otelbpf.core.events import DataEvent

    pipeline, out, _ = make_pipeline()
    genai.attach(pipeline)
    request = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "w " * 5000}], "model": "gpt-mock"})
    captured = request[:4096]  # the rest of the write was not copied (counted as missing)
    body = {"id": "chatcmpl-2", "model": "gpt-mock-0613", "choices": [], "usage": {"prompt_tokens": 5000, "completion_tokens": 1}}
    pipeline.handle([
        accepted(1, 200),
        DataEvent(10, 200, 200, 5, 1, IN, len(request), captured),
        data(20, 1, 200, OUT, json_response(body)),
    ])  # fmt: skip
    [span] = out.spans
    assert span.attributes[sc.OTELBPF_PAYLOAD_TRUNCATED] is True
    assert span.name == "chat gpt-mock-0613"  # the request's model was not seen: the response's names it
    assert span.attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == 5000 and sc.GEN_AI_REQUEST_MODEL not in span.attributes


def test_attach_is_idempotent_and_per_pipeline() -> None:
    first, _, _ = make_pipeline()
    second, _, _ = make_pipeline()
    layer = genai.attach(first)
    assert genai.attach(first) is layer and len(first.progress_observers["http1"]) == 1
    assert genai.attach(second) is not layer  # each pipeline's registry has its own HTTP/1 semantics


def progress_seen(path: str, extra_observer=False) -> list[tuple[str, str]]:
    """Feed one streamed exchange to ``path`` through a pipeline with GenAI attached
    (plus, optionally, an unfiltered observer); return (observer, phase) per progress event."""
    pipeline, _out, _counters = make_pipeline()
    genai.attach(pipeline)
    seen: list[tuple[str, str]] = []
    layer_observe = pipeline.progress_observers["http1"][0]
    pipeline.progress_observers["http1"][0] = lambda start, item: (seen.append(("genai", item.phase.name)), layer_observe(start, item))
    if extra_observer:
        pipeline.observe_progress("http1", lambda start, item: seen.append(("all", item.phase.name)))
    events = [accepted(2, SERVER_PID, local_port=8000, peer_port=40000), data(11, 2, SERVER_PID, IN, post(path, {**CHAT, "stream": True}))]
    events += [data(20, 2, SERVER_PID, OUT, SSE_HEAD), data(21, 2, SERVER_PID, OUT, sse_chunk(delta("hi"))), data(22, 2, SERVER_PID, OUT, b"0\r\n\r\n")]
    pipeline.handle(events)
    return seen


def test_only_llm_exchanges_report_progress():
    """The GenAI layer's filter is asked once, at the request head: an ordinary
    POST reports no progress events at all (no per-chunk cost), an LLM call does."""
    assert progress_seen("/v1/predict") == []
    llm = progress_seen("/v1/chat/completions")
    assert ("genai", "RESPONSE_START") in llm and ("genai", "RESPONSE_BODY") in llm and ("genai", "REQUEST_BODY") in llm


def test_an_unfiltered_observer_gets_every_exchange_progress():
    seen = progress_seen("/v1/predict", extra_observer=True)
    assert ("all", "RESPONSE_START") in seen and ("all", "RESPONSE_BODY") in seen
    assert ("genai", "RESPONSE_BODY") in seen  # observers share the events; GenAI ignores non-LLM ones


def h2_both_sides(path: str, request_body: dict, events_out: list[tuple[int, bytes]], content_type="text/event-stream"):
    """One HTTP/2 stream (prior knowledge) between client pid 100 and server pid 200:
    the request at 10 (headers + body), then the response head at 20 and each
    (ts, payload) of ``events_out`` as a DATA frame, the last one ending the stream."""
    from protocols.http2.tests.traffic import Conversation

    pipeline, out, counters = make_pipeline()
    layer = genai.attach(pipeline)
    metrics = SpanMetrics(pipeline.resources, pipeline.registry.instruments())
    conv = Conversation()
    conv.request(1, [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1:8000"),
                     ("content-type", "application/json"), ("authorization", f"Bearer {SECRET}")])
    conv.data(True, 1, json.dumps(request_body).encode(), end_stream=True)
    request_bytes = bytes(conv.client)
    conv.response(1, [(":status", "200"), ("content-type", content_type)])
    head = bytes(conv.server)
    frames = []
    for i, (ts, payload) in enumerate(events_out):
        conv.server.clear()
        conv.data(False, 1, payload, end_stream=i == len(events_out) - 1)
        frames.append((ts, bytes(conv.server)))
    events = [connected(1, CLIENT_PID, local_port=40000, peer_port=8000), accepted(2, SERVER_PID, local_port=8000, peer_port=40000)]
    events += [data(10, 1, CLIENT_PID, OUT, request_bytes, fd=6), data(11, 2, SERVER_PID, IN, request_bytes)]
    for ts, payload in [(20, head), *frames]:
        events += [data(ts, 2, SERVER_PID, OUT, payload), data(ts + 1, 1, CLIENT_PID, IN, payload, fd=6)]
    pipeline.handle(events)
    for span in out.spans:
        metrics.record(span)
    spans = {span.kind: span for span in out.spans}
    assert set(spans) == {SpanKind.CLIENT, SpanKind.SERVER}
    assert len(layer) == 0
    return spans[SpanKind.CLIENT], spans[SpanKind.SERVER], metrics


def sse_event(payload) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def test_a_streamed_chat_over_http2_gets_genai_spans_on_both_sides():
    usage = {**delta(finish="stop"), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    stream = [(30, sse_event(delta(role="assistant"))), (1_000_030, sse_event(delta("hi "))),
              (1_500_030, sse_event(delta("there", finish="stop"))), (1_600_030, sse_event(usage)), (1_600_040, sse_event("[DONE]"))]
    client, server, metrics = h2_both_sides("/v1/chat/completions", {**CHAT, "stream": True}, stream)
    for span in (client, server):
        assert span.name == "chat gpt-mock"
        assert span.scope == "otelbpf.http2"
        attrs = span.attributes
        assert attrs[sc.NETWORK_PROTOCOL_VERSION] == "2"
        assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert attrs[sc.GEN_AI_REQUEST_MODEL] == "gpt-mock" and attrs[sc.GEN_AI_RESPONSE_MODEL] == "gpt-mock-0613"
        assert attrs[sc.GEN_AI_REQUEST_STREAM] is True
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 3 and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
        assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
        assert attrs[sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS] == 2
        assert SECRET not in json.dumps({k: str(v) for k, v in attrs.items()})
    # first content chunk: written at 1_000_030 (server), read at 1_000_031 (client); request at 10 / 11
    assert client.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == (1_000_031 - 10) / 1e9
    assert server.attributes[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == (1_000_030 - 11) / 1e9
    collected = metrics.collect()
    for name in (sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK, sc.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN):
        points = [point for process in collected.processes for point in process.points(name)]
        assert len(points) == 1, name  # the GenAI instruments are HTTP/2's too


def test_an_ordinary_http2_post_is_an_http_span():
    client, server, _ = h2_both_sides("/v1/predict", {"x": 1}, [(30, b'{"ok": true}')], content_type="application/json")
    assert client.name == "POST" and server.name == "POST /v1/predict"
    assert sc.GEN_AI_OPERATION_NAME not in server.attributes
