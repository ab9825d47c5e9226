"""Real eBPF, real processes: v2 inference protocol calls (Triton / KServe over HTTP) from
the real ``tritonclient.http`` client against the bundled stdlib server
(examples/triton_mock_server.py), traced from the wire on both sides: binary tensor
data (the Inference-Header-Content-Length extension, only the JSON head parsed), JSON
tensors, a versioned model path, and a failed call."""

from __future__ import annotations

import textwrap

import pytest
from conftest import EXAMPLES
from test_ebpf_genai import CLIENT, SERVER, metric_names, run_openai_client
from test_ebpf_http import spans_in_file

pytestmark = pytest.mark.ebpf

CLIENT_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    port = int(sys.argv[1])
    print("ready", flush=True)
    sys.stdin.readline()
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    out = {}

    def received(r):
        resp = r.get_response()
        return {"model": resp["model_name"], "version": resp["model_version"], "id": resp.get("id"),
                "outputs": len(resp["outputs"])}

    a = np.arange(64, dtype=np.int32).reshape(1, 64)
    b = np.ones((1, 64), dtype=np.float32)
    i0 = httpclient.InferInput("INPUT0", [1, 64], "INT32"); i0.set_data_from_numpy(a)  # binary
    i1 = httpclient.InferInput("INPUT1", [1, 64], "FP32"); i1.set_data_from_numpy(b)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    r = client.infer("simple", [i0, i1], outputs=outputs, request_id="binary-1")
    assert (r.as_numpy("OUTPUT0") == a).all()
    out["binary"] = dict(received(r), inputs=2)
    j0 = httpclient.InferInput("INPUT0", [1, 64], "INT32"); j0.set_data_from_numpy(a, binary_data=False)
    r = client.infer("densenet onnx", [j0], model_version="3", request_id="json-1",
                     outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    assert r.as_numpy("OUTPUT0").tolist() == a.tolist()
    out["json"] = dict(received(r), inputs=1)
    try:
        client.infer("missing", [j0], request_id="err-1")
        out["error"] = None
    except InferenceServerException as e:
        out["error"] = str(e)
    print(json.dumps(out), flush=True)
    """
)


def test_tritonclient_http_infer_gives_genai_spans_on_both_sides(services, agent, tmp_path):
    server = services([str(EXAMPLES / "triton_mock_server.py"), "--port", "0"])
    out, metrics_out, sent, run, client_pid = run_openai_client(agent, tmp_path, server, CLIENT_SCRIPT)
    spans = [s for s in spans_in_file(out) if "gen_ai.operation.name" in s.attributes]
    assert len(spans) == 6, [(s.name, s.span.kind) for s in spans_in_file(out)]
    by_side = {(s.span.kind, s.attributes["gen_ai.request.model"]): s for s in spans}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == SERVER} == {server.pid}
    assert {s.resource["process.pid"] for s in spans if s.span.kind == CLIENT} == {client_pid}

    for call, model, version in (("binary", "simple", None), ("json", "densenet onnx", "3")):
        expected = sent[call]
        client_span, server_span = by_side[(CLIENT, model)], by_side[(SERVER, model)]
        assert server_span.span.parent_span_id == client_span.span.span_id
        for s in (client_span, server_span):
            attrs = s.attributes
            assert s.name == f"infer {model}"
            assert attrs["gen_ai.operation.name"] == "infer"
            assert attrs["gen_ai.provider.name"] == "open_inference"
            assert attrs["gen_ai.response.model"] == expected["model"]
            assert attrs["gen_ai.response.id"] == expected["id"]
            assert attrs["otelbpf.gen_ai.request.model_version"] == expected["version"]
            assert version is None or expected["version"] == version
            assert attrs["otelbpf.gen_ai.request.inputs"] == expected["inputs"]
            assert attrs["otelbpf.gen_ai.response.outputs"] == expected["outputs"]
            assert "gen_ai.request.stream" not in attrs and "gen_ai.usage.input_tokens" not in attrs
            assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 200

    assert sent["error"] and "unknown model" in sent["error"]
    for kind in (CLIENT, SERVER):
        attrs = by_side[(kind, "missing")].attributes
        assert attrs["http.response.status_code"] == 400 and attrs["otelbpf.gen_ai.request.inputs"] == 1
        assert "otelbpf.gen_ai.response.outputs" not in attrs and "gen_ai.response.model" not in attrs
    names = metric_names(metrics_out)
    assert {p.get("gen_ai.operation.name") for p in names["gen_ai.client.operation.duration"]} >= {"infer"}
    assert {p.get("gen_ai.provider.name") for p in names["gen_ai.server.request.duration"]} >= {"open_inference"}
    stats = run.stats()
    assert stats.get("otelbpf.events.lost", 0) == 0
    assert not any(key.startswith("otelbpf.spans.failed") for key in stats), stats
