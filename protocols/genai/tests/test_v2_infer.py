"""The v2 inference protocol over HTTP (Triton, KServe): /v2/models/M[/versions/V]/infer,
JSON bodies and the binary tensor data extension (a JSON head, then raw tensor bytes)."""

from __future__ import annotations

import json
import struct

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import match_endpoint
from protocols.genai.llm import LlmCall
from protocols.genai.tests.test_fuzz import FUZZ, split

SIMPLE = match_endpoint("POST", "/v2/models/simple/infer")


def test_paths():
    assert (SIMPLE.api.name, SIMPLE.operation, SIMPLE.model, SIMPLE.version) == ("v2_infer", "infer", "simple", None)
    versioned = match_endpoint("POST", "/v2/models/simple/versions/3/infer")
    assert (versioned.api, versioned.operation, versioned.model, versioned.version) == (SIMPLE.api, "infer", "simple", "3")
    assert match_endpoint("POST", "/v2/models/my%20model/infer?x=1").model == "my model"
    assert match_endpoint("POST", "http://triton:8000/v2/models/m/infer").model == "m"
    assert match_endpoint("GET", "/v2/models/simple/infer") is None
    assert match_endpoint("POST", "/v2/models/simple/ready") is None
    assert match_endpoint("POST", "/v2/models//infer") is None
    assert match_endpoint("POST", "/v2/models/a/b/infer") is None
    assert match_endpoint("POST", "/v2/rerank").api.name == "rerank"


def facts_of(endpoint, request: bytes, response: bytes, req_len=None, resp_len=None, content_type="application/json", cuts=()):
    call = LlmCall(endpoint)
    if req_len is not None:
        call.header(False, "inference-header-content-length", str(req_len))
    for piece in split(request, list(cuts)):
        call.request_body(piece)
    call.response_start(content_type)
    if resp_len is not None:
        call.header(True, "inference-header-content-length", str(resp_len))
    for i, piece in enumerate(split(response, list(cuts))):
        call.response_body(1000 + i, piece)
    facts = call.finish()
    assert call.errors == 0
    return facts


def tensor(name, data, binary: int | None = None):
    out = {"name": name, "shape": [1, len(data) if data else 4], "datatype": "INT32"}
    if binary is None:
        out["data"] = data
    else:
        out["parameters"] = {"binary_data_size": binary}
    return out


def test_json_request_and_response():
    request = json.dumps({"id": "r1", "inputs": [tensor("INPUT0", [1, 2]), tensor("INPUT1", [3, 4])],
                          "outputs": [{"name": "OUTPUT0"}]}).encode()  # fmt: skip
    response = json.dumps({"model_name": "simple", "model_version": "1", "id": "r1",
                           "outputs": [tensor("OUTPUT0", [1, 2])]}).encode()  # fmt: skip
    facts = facts_of(SIMPLE, request, response)
    assert (facts.request_model, facts.response_model, facts.model_version, facts.response_id) == ("simple", "simple", "1", "r1")
    assert (facts.inputs, facts.outputs, facts.stream, facts.streamed) == (2, 1, None, False)
    assert facts.input_tokens is None and facts.output_tokens is None


def test_binary_extension_parses_the_json_head_only():
    raw = struct.pack("<4i", 1, 2, 3, 4) + b"{\"x\":1}\xff\x00"
    head = json.dumps({"inputs": [tensor("INPUT0", None, binary=len(raw))]}).encode()
    out_head = json.dumps({"model_name": "simple", "model_version": "7",
                           "outputs": [tensor("OUTPUT0", None, 16), tensor("OUTPUT1", None, 8)]}).encode()  # fmt: skip
    versioned = match_endpoint("POST", "/v2/models/simple/versions/7/infer")
    for req_len, resp_len in ((len(head), len(out_head)), (None, None)):  # told by the header, or not
        facts = facts_of(versioned, head + raw, out_head + raw, req_len, resp_len, "application/octet-stream", cuts=(5, 40))
        assert (facts.request_model, facts.model_version, facts.inputs, facts.outputs, facts.response_model) == (
            "simple", "7", 1, 2, "simple")


def test_response_version_when_the_path_has_none():
    facts = facts_of(SIMPLE, b'{"inputs":[]}', b'{"model_name":"simple","model_version":"4","outputs":[]}')
    assert (facts.model_version, facts.inputs, facts.outputs) == ("4", 0, 0)


def test_error_and_unparsable_bodies_still_name_the_model():
    facts = facts_of(match_endpoint("POST", "/v2/models/missing/infer"), b'{"inputs":[]}',
                     b'{"error":"Request for unknown model"}')  # fmt: skip
    assert facts.request_model == "missing" and facts.outputs is None
    facts = facts_of(SIMPLE, b'{"inputs": [' + b"1," * 50_000, b"{}")  # a head cut by the request limit
    assert facts.request_model == "simple" and facts.inputs is None
    assert facts_of(SIMPLE, b"not json", b"{}") is None


def test_a_head_length_beyond_the_body_is_not_trusted():
    facts = facts_of(SIMPLE, b'{"inputs":[]}', b'{"model_name":"x","outputs":[]}', req_len=10_000, resp_len=10_000)
    assert facts.request_model == "simple" and facts.inputs is None and facts.outputs is None


@FUZZ
@given(request=st.binary(max_size=300), response=st.binary(max_size=300),
       req_len=st.one_of(st.none(), st.integers(min_value=0, max_value=400)),
       resp_len=st.one_of(st.none(), st.integers(min_value=0, max_value=400)),
       cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=6))  # fmt: skip
def test_survives_anything_and_chunking_never_changes_the_facts(request, response, req_len, resp_len, cuts):
    whole = facts_of(SIMPLE, b'{"inputs":[]}' + request, response, req_len, resp_len)
    chunked = facts_of(SIMPLE, b'{"inputs":[]}' + request, response, req_len, resp_len, cuts=cuts)
    assert (whole.inputs, whole.outputs, whole.response_model, whole.model_version) == (
        chunked.inputs, chunked.outputs, chunked.response_model, chunked.model_version)
