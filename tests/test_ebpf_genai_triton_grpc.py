"""Real eBPF, real processes: the v2 inference protocol over gRPC (Triton / KServe's
``inference.GRPCInferenceService``) from the real ``tritonclient.grpc`` client against the
bundled grpcio server (examples/triton_grpc_mock_server.py), traced from the wire on both
sides and exported over OTLP/HTTP to tests/otlp_receiver.py: ModelInfer (raw tensors, a
versioned model, an unknown model: NOT_FOUND) and ModelStreamInfer (a decoupled model's
responses timed as output chunks, its empty final response not one; an error_message in
the stream)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import EXAMPLES
from otlp_receiver import OtlpReceiver, attributes_dict

pytest.importorskip("tritonclient.grpc")

pytestmark = pytest.mark.ebpf

SERVER, CLIENT = 2, 3  # OTLP SpanKind
ERROR = 2  # OTLP Status.STATUS_CODE_ERROR
FIRST_RESPONSE_DELAY_MS, RESPONSE_DELAY_MS, RESPONSES = 150, 30, 4

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, queue, sys
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")  # its channel: after the agent attached
    out = {}

    def received(r):
        resp = r.get_response()
        return {"model": resp.model_name, "version": resp.model_version, "id": resp.id, "outputs": len(resp.outputs)}

    a = np.arange(64, dtype=np.int32).reshape(1, 64)
    b = np.ones((1, 64), dtype=np.float32)
    i0 = grpcclient.InferInput("INPUT0", [1, 64], "INT32"); i0.set_data_from_numpy(a)
    i1 = grpcclient.InferInput("INPUT1", [1, 64], "FP32"); i1.set_data_from_numpy(b)
    r = client.infer("simple", [i0, i1], request_id="unary-1", outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    assert (r.as_numpy("OUTPUT0") == a).all()
    out["unary"] = dict(received(r), inputs=2)
    r = client.infer("densenet onnx", [i0], model_version="3", request_id="versioned-1")
    out["versioned"] = dict(received(r), inputs=1)
    try:
        client.infer("missing", [i0], request_id="err-1")
        out["error"] = None
    except InferenceServerException as e:
        out["error"] = str(e)

    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("llm", [i0], model_version="2", request_id="stream-1", enable_empty_final_response=True,
                              parameters={"mock_responses": RESPONSES, "mock_delay_ms": FIRST,
                                          "mock_token_delay_ms": GAP})
    client.async_stream_infer("missing", [i0], request_id="stream-err")
    got = [answers.get(timeout=20) for _ in range(RESPONSES + 2)]
    client.stop_stream()
    client.close()
    out["stream"] = {
        "outputs": [len(r.get_response().outputs) for r, e in got if r is not None],
        "errors": [str(e) for r, e in got if e is not None],
    }
    print(json.dumps(out), flush=True)
    """
)
for _name, _value in (("RESPONSES", RESPONSES), ("FIRST", FIRST_RESPONSE_DELAY_MS), ("GAP", RESPONSE_DELAY_MS)):
    CLIENT_SCRIPT = CLIENT_SCRIPT.replace(_name, str(_value))


def metric_points(requests) -> dict[str, list[dict]]:
    """Data-point attributes by metric name, from the received OTLP metric requests."""
    names: dict[str, list[dict]] = {}
    for request in requests:
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    data = metric.histogram if metric.HasField("histogram") else metric.sum
                    for point in data.data_points:
                        names.setdefault(metric.name, []).append(attributes_dict(point.attributes))
    return names


def test_tritonclient_grpc_infer_and_stream_infer_give_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services([str(EXAMPLES / "triton_grpc_mock_server.py"), "--port", "0"])
    script = tmp_path / "triton_grpc_client.py"
    script.write_text(CLIENT_SCRIPT)
    client = subprocess.Popen(
        [sys.executable, str(script), str(server.port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdout.readline().strip() == "ready", client.stderr.read()
        with OtlpReceiver(grpc_port=None) as receiver:
            run = agent(["--pid", str(server.pid), "--pid", str(client.pid), "--otlp-endpoint",
                         receiver.http_endpoint, "--otlp-protocol", "http/protobuf"])  # fmt: skip
            client.stdin.write("go\n")
            client.stdin.flush()
            stdout, stderr = client.communicate(timeout=90)
            assert client.returncode == 0, stderr
            time.sleep(1.0)  # the agent drains its ring buffer every ~10 ms; let the last calls through
            assert run.stop() == 0, run.output  # stopping flushes what is queued, metrics too
            spans = receiver.wait_for_spans(8, timeout=30)
            metrics = metric_points(receiver.metric_requests)
    finally:
        if client.poll() is None:
            client.kill()
    sent = json.loads(stdout.strip().splitlines()[-1])

    spans = [s for s in spans if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 8, [(s.name, s.span.kind, s.attributes.get("rpc.method")) for s in spans]
    by_side = {(s.span.kind, s.attributes["gen_ai.request.model"]): s for s in spans}
    assert len(by_side) == 8, sorted(by_side)
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server.pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client.pid}
    for (kind, model), span in by_side.items():
        attrs = span.attributes
        assert span.name == f"infer {model}" and span.scope == "otelbpf.http2"
        assert attrs["gen_ai.operation.name"] == "infer" and attrs["gen_ai.provider.name"] == "open_inference"
        assert attrs["rpc.system.name"] == "grpc" and attrs["otelbpf.rpc.method.source"] == "header"
        assert attrs["otelbpf.gen_ai.request.inputs"] == (2 if model == "simple" else 1)
        if kind == SERVER:
            assert by_side[(CLIENT, model)].span.span_id == span.span.parent_span_id  # one trace, both ends

    for call, model, version in (("unary", "simple", "1"), ("versioned", "densenet onnx", "3")):
        expected = sent[call]
        assert (expected["model"], expected["version"]) == (model, version)
        for kind in (CLIENT, SERVER):
            attrs = by_side[(kind, model)].attributes
            assert attrs["rpc.method"] == "inference.GRPCInferenceService/ModelInfer"
            assert attrs["rpc.response.status_code"] == "OK"
            assert attrs["gen_ai.response.model"] == model and attrs["gen_ai.response.id"] == expected["id"]
            assert attrs["otelbpf.gen_ai.request.model_version"] == version
            assert attrs["otelbpf.gen_ai.response.outputs"] == expected["outputs"]
            assert "gen_ai.request.stream" not in attrs and "gen_ai.response.time_to_first_chunk" not in attrs

    assert sent["error"] and "NOT_FOUND" in sent["error"]
    client_attrs, server_attrs = by_side[(CLIENT, "missing")].attributes, by_side[(SERVER, "missing")].attributes
    for attrs in (client_attrs, server_attrs):
        assert attrs["rpc.response.status_code"] == "NOT_FOUND"
        assert "gen_ai.response.model" not in attrs and "otelbpf.gen_ai.response.outputs" not in attrs
    assert client_attrs["error.type"] == "NOT_FOUND" and by_side[(CLIENT, "missing")].span.status.code == ERROR
    assert "error.type" not in server_attrs  # NOT_FOUND is not a server error (RPC conventions)

    assert sent["stream"]["outputs"] == [1] * RESPONSES + [0] and len(sent["stream"]["errors"]) == 1
    for kind in (CLIENT, SERVER):
        attrs = by_side[(kind, "llm")].attributes
        assert attrs["rpc.method"] == "inference.GRPCInferenceService/ModelStreamInfer"
        assert attrs["otelbpf.gen_ai.request.model_version"] == "2" and attrs["gen_ai.response.id"] == "stream-1"
        assert attrs["gen_ai.request.stream"] is True and attrs["otelbpf.gen_ai.response.outputs"] == 1
        assert attrs["otelbpf.gen_ai.response.chunks"] == RESPONSES  # the empty final one and the error are not chunks
        assert attrs["otelbpf.rpc.request.messages"] == 2 and attrs["otelbpf.rpc.response.messages"] == RESPONSES + 2
        ttft = attrs["gen_ai.response.time_to_first_chunk"]
        assert FIRST_RESPONSE_DELAY_MS / 1000 <= ttft < FIRST_RESPONSE_DELAY_MS / 1000 + 2.0, ttft
        gap = attrs["otelbpf.gen_ai.response.time_per_output_chunk"]
        assert RESPONSE_DELAY_MS / 1000 * 0.8 <= gap < RESPONSE_DELAY_MS / 1000 + 1.0, gap

    ttft_points = metrics.get("gen_ai.client.operation.time_to_first_chunk", [])
    assert {p.get("gen_ai.request.model") for p in ttft_points} == {"llm"}, ttft_points
    assert {p.get("gen_ai.provider.name") for p in metrics["gen_ai.server.request.duration"]} == {"open_inference"}
    stats = run.stats()
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert not any(key.startswith(("otelbpf.spans.failed", "otelbpf.parse.errors")) for key in stats), stats
