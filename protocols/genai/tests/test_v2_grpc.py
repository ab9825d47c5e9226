"""The v2 inference protocol over gRPC (Triton, KServe): ModelInfer and ModelStreamInfer
read from their gRPC messages (protocols/genai/v2grpc.py)."""

from __future__ import annotations

import gzip
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import match_endpoint
from protocols.genai.tests.test_fuzz import FUZZ, split
from protocols.genai.v2grpc import (
    GrpcMessages,
    InferHead,
    ProtobufError,
    V2GrpcCall,
    decode_infer_request,
    decode_infer_response,
    decode_stream_response,
    iter_fields,
    read_varint,
)

UNARY = match_endpoint("POST", "/inference.GRPCInferenceService/ModelInfer")
STREAM = match_endpoint("POST", "/inference.GRPCInferenceService/ModelStreamInfer")


# -- a tiny protobuf encoder (the tests' own, independent of the reader) --------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, value: bytes | str | int) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def tensor(name: str, datatype: str = "INT32", shape=(1, 4)) -> bytes:
    return field(1, name) + field(2, datatype) + field(3, b"".join(varint(d) for d in shape))


def request(model="simple", version="", rid="", inputs=("INPUT0",), outputs=(), raw=(), params=b"") -> bytes:
    out = field(1, model) + (field(2, version) if version else b"") + (field(3, rid) if rid else b"")
    out += params
    out += b"".join(field(5, tensor(name)) for name in inputs)
    out += b"".join(field(6, field(1, name)) for name in outputs)
    out += b"".join(field(7, data) for data in raw)
    return out


def response(model="simple", version="1", rid="", outputs=("OUTPUT0",), raw=()) -> bytes:
    out = field(1, model) + field(2, version) + (field(3, rid) if rid else b"")
    out += b"".join(field(5, tensor(name)) for name in outputs)
    out += b"".join(field(6, data) for data in raw)
    return out


def stream_response(infer: bytes | None = None, error: str = "") -> bytes:
    return (field(1, error) if error else b"") + (field(2, infer) if infer is not None else b"")


def grpc(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", 1 if compressed else 0, len(message)) + message


def run(endpoint, request_bytes: bytes, response_bytes: bytes, cuts=(), times=None):
    call = V2GrpcCall(endpoint)
    for piece in split(request_bytes, list(cuts)):
        call.request_body(piece)
    call.response_start("application/grpc")
    for i, piece in enumerate(split(response_bytes, list(cuts))):
        call.response_body(times(i) if times else 1000 + i, piece)
    facts = call.finish()
    assert call.errors == 0
    return call, facts


# -- recognition ------------------------------------------------------------------------


def test_paths():
    assert match_endpoint("POST", "/inference.GRPCInferenceService/ModelInfer") == UNARY
    assert match_endpoint("POST", "/inference.GRPCInferenceService/ModelStreamInfer") == STREAM
    assert match_endpoint("POST", "/inference.GRPCInferenceService/ModelMetadata") is None
    assert match_endpoint("POST", "/inference.GRPCInferenceService/ModelInferX") is None
    assert match_endpoint("GET", "/inference.GRPCInferenceService/ModelInfer") is None
    assert match_endpoint("POST", "/demo.Inference/Predict") is None
    assert match_endpoint("POST", "/v2/models/simple/infer").route == "http"  # HTTP unchanged


# -- the protobuf reader ----------------------------------------------------------------


def test_varints():
    for n in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        assert read_varint(varint(n), 0, len(varint(n))) == (n, len(varint(n)))
    with pytest.raises(ProtobufError):
        read_varint(b"\x80\x80", 0, 2)  # cut
    with pytest.raises(ProtobufError):
        read_varint(b"\xff" * 11, 0, 11)  # too long


def test_fields_of_every_wire_type():
    data = field(1, "m") + field(4, 150) + varint(5 << 3 | 1) + b"\x01" * 8 + varint(6 << 3 | 5) + b"\x02" * 4
    assert list(iter_fields(data, 0, len(data), False)) == [
        (1, 2, (2, 3)), (4, 0, 150), (5, 1, 0x0101010101010101), (6, 5, 0x02020202)
    ]  # fmt: skip
    for bad in (b"\x00\x01", varint(1 << 3 | 3) + b"\x00", varint(1 << 3 | 7)):
        with pytest.raises(ProtobufError):
            list(iter_fields(bad, 0, len(bad), False))


def test_a_cut_head_is_read_as_far_as_it_goes():
    data = request("simple", "3", "r1", inputs=("A", "B"), raw=(b"x" * 100,))
    head = data[:-50]  # cut inside raw_input_contents
    with pytest.raises(ProtobufError):
        decode_infer_request(head)
    assert decode_infer_request(head, cut=True) == InferHead("simple", "3", "r1", 2, whole=False)
    name_cut = data[:4]  # inside model_name: nothing kept of it
    assert decode_infer_request(name_cut, cut=True) == InferHead(whole=False)


def test_the_real_stubs_messages():
    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    req = service_pb2.ModelInferRequest(model_name="densenet onnx", model_version="3", id="json-1")
    req.parameters["sequence_id"].int64_param = 7
    for name in ("INPUT0", "INPUT1"):
        tensor_ = req.inputs.add(name=name, datatype="FP32", shape=[1, 3, 224, 224])
        tensor_.parameters["x"].bool_param = True
    req.outputs.add(name="OUTPUT0")
    req.raw_input_contents.extend([b"\x00" * 4096, b"\x01" * 4096])
    assert decode_infer_request(req.SerializeToString()) == InferHead("densenet onnx", "3", "json-1", 2)
    resp = service_pb2.ModelInferResponse(model_name="densenet onnx", model_version="3", id="json-1")
    resp.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 1000])
    resp.outputs[0].contents.fp32_contents.extend([0.5] * 1000)
    assert decode_infer_response(resp.SerializeToString()) == InferHead("densenet onnx", "3", "json-1", 1)
    streamed = service_pb2.ModelStreamInferResponse(infer_response=resp).SerializeToString()
    assert decode_stream_response(streamed) == ("", InferHead("densenet onnx", "3", "json-1", 1))
    failed = service_pb2.ModelStreamInferResponse(error_message="unknown model").SerializeToString()
    assert decode_stream_response(failed) == ("unknown model", None)
    empty = service_pb2.ModelStreamInferResponse(infer_response=service_pb2.ModelInferResponse(model_name="m"))
    assert decode_stream_response(empty.SerializeToString())[1].tensors == 0


def test_wrong_shapes_are_errors():
    for bad in (field(1, 5), field(5, 3), field(1, b"\xff\xfe")):  # a number for a string, for a tensor; not UTF-8
        with pytest.raises(ProtobufError):
            decode_infer_request(bad)
    with pytest.raises(ProtobufError):
        decode_stream_response(field(2, 9))


# -- gRPC framing ---------------------------------------------------------------------


def test_messages_in_any_chunks_and_the_head_limit():
    reader = GrpcMessages(limit=8)
    data = grpc(b"a" * 5) + grpc(b"") + grpc(b"b" * 20) + grpc(b"c" * 8)
    out = []
    for i in range(len(data)):
        out += reader.feed(data[i : i + 1])
        assert reader.buffered <= 8 + 5
    assert out == [(b"a" * 5, False, False), (b"", False, False), (b"b" * 8, False, True), (b"c" * 8, False, False)]


def test_a_bad_flag_loses_the_framing():
    reader = GrpcMessages()
    assert reader.feed(b"\x07\x00\x00\x00\x01x" + grpc(b"ok")) == []
    assert reader.lost and reader.malformed == 1 and reader.feed(grpc(b"ok")) == []


# -- calls ------------------------------------------------------------------------------


def test_model_infer():
    raw = (b"\0" * 64,) * 2
    req = grpc(request("simple", "", "binary-1", inputs=("INPUT0", "INPUT1"), outputs=("OUTPUT0",), raw=raw))
    resp = grpc(response("simple", "1", "binary-1", outputs=("OUTPUT0",), raw=(b"\0" * 64,)))
    call, facts = run(UNARY, req, resp)
    assert (facts.request_model, facts.response_model, facts.response_id) == ("simple", "simple", "binary-1")
    assert (facts.model_version, facts.inputs, facts.outputs) == ("1", 2, 1)  # the version: the response's
    assert facts.stream is None and not facts.streamed and facts.chunks == 0 and call.parse_errors == 0
    _, facts = run(UNARY, grpc(request("m", "3")), grpc(response("m", "1")))
    assert facts.model_version == "3"  # the request's first


def test_a_failed_call_has_the_requests_facts_only():
    call, facts = run(UNARY, grpc(request("missing", inputs=("INPUT0",))), b"")
    assert facts.request_model == "missing" and facts.inputs == 1
    assert facts.response_model is None and facts.outputs is None and facts.response_id is None


def test_model_stream_infer_counts_responses_with_outputs_as_chunks():
    reqs = grpc(request("llm", "2", "s1")) + grpc(request("other", "9", "s2"))
    resps = [
        stream_response(response("llm", "2", "s1")),
        stream_response(response("llm", "2", "s1")),
        stream_response(response("llm", "2", "s1", outputs=())),  # the empty final response
        stream_response(error="Request for unknown model"),
        stream_response(response("llm", "2", "s1")),
    ]
    call = V2GrpcCall(STREAM)
    call.request_body(reqs)
    for i, message in enumerate(resps):
        call.response_body(1000 + 10 * i, grpc(message))
    facts = call.finish()
    assert (facts.request_model, facts.model_version, facts.response_id, facts.inputs, facts.outputs) == (
        "llm", "2", "s1", 1, 1
    )  # fmt: skip
    assert facts.stream is True and facts.streamed
    assert (facts.chunks, facts.first_chunk_ns, facts.last_chunk_ns) == (3, 1000, 1040)
    assert call.parse_errors == 0 and call.errors == 0


def test_compressed_messages_are_inflated():
    req = request("simple", "1", "gz", inputs=("A", "B", "C"))
    for compress in (gzip.compress, zlib.compress):
        _, facts = run(UNARY, grpc(compress(req), compressed=True), grpc(compress(response("simple")), compressed=True))
        assert (facts.request_model, facts.inputs, facts.response_model, facts.outputs) == ("simple", 3, "simple", 1)
    call, facts = run(UNARY, grpc(b"not deflate", compressed=True), b"")
    assert facts is None and call.parse_errors == 1


def test_big_tensors_are_never_kept():
    big = b"\x01" * (1 << 20)
    req = grpc(request("simple", "1", "big", inputs=("INPUT0",), raw=(big,)))
    call = V2GrpcCall(UNARY)
    peak = 0
    for i in range(0, len(req), 1000):
        call.request_body(req[i : i + 1000])
        peak = max(peak, call.buffered)
    call.response_body(1, grpc(response("simple", raw=(big,))))
    facts = call.finish()
    assert peak <= 64 * 1024 + 5 and facts.request_model == "simple" and facts.inputs == 1 and facts.outputs == 1


def test_a_hole_reads_the_head_then_stops():
    req = grpc(request("simple", "1", "h", inputs=("A", "B"), raw=(b"x" * 5000,)))
    call = V2GrpcCall(STREAM)
    call.request_body(req[:200])
    call.request_body(None)  # the rest of the tensor was not captured
    call.request_body(req[200:])  # ignored: the framing is lost
    call.response_body(5, grpc(stream_response(response("simple", "1", "h"))))
    call.response_body(6, None)
    call.response_body(7, grpc(stream_response(response("simple", "1", "h"))))  # after the hole: not read
    facts = call.finish()
    assert (facts.request_model, facts.inputs, facts.chunks, facts.gaps) == ("simple", 2, 1, 1)
    assert call.parse_errors == 0 and call.errors == 0


def test_a_stream_cut_by_the_end_is_read_from_what_came():
    call = V2GrpcCall(UNARY)
    call.request_body(grpc(request("simple", raw=(b"x" * 100,)))[:60])
    facts = call.finish()
    assert facts.request_model == "simple" and call.finish() is facts


def test_not_the_protocol():
    call, facts = run(UNARY, grpc(b"\x08\x01garbage"), grpc(b"\xff\xff"))
    assert facts is None and call.parse_errors == 2
    call, facts = run(UNARY, b"\x05\x00\x00\x00\x01x", b"")
    assert facts is None and call.parse_errors == 1


# -- properties ---------------------------------------------------------------------------

_PIECES = [
    grpc(request("simple", "1", "r", inputs=("A",))), grpc(stream_response(response("simple"))), grpc(b""),
    grpc(b"\x0a\x05"), b"\x00\x00\x00\x00", b"\x01", field(1, "m"), field(5, b""), b"\x80" * 11, b"\x1f\x8b",
]  # fmt: skip
noise = st.lists(st.one_of(st.sampled_from(_PIECES), st.binary(max_size=40)), max_size=20).map(b"".join)


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_any_bytes_decode_or_raise_protobuf_error(data, cut):
    for decode in (decode_infer_request, decode_infer_response, decode_stream_response):
        try:
            decode(data, cut)
        except ProtobufError:
            pass


@FUZZ
@given(noise, noise, st.lists(st.integers(min_value=0), max_size=6), st.booleans(), st.booleans())
def test_any_bytes_in_any_chunks_never_raise(req, resp, cuts, streaming, holes):
    call = V2GrpcCall(STREAM if streaming else UNARY, limit=64)
    for piece in split(req, cuts):
        call.request_body(piece)
        if holes:
            call.request_body(None)
    for i, piece in enumerate(split(resp, cuts)):
        call.response_body(i, piece)
        assert call.buffered <= 2 * (64 + 5)
    call.finish()
    assert call.errors == 0


@FUZZ
@given(
    st.text(min_size=1, max_size=30), st.text(max_size=10), st.text(max_size=20),
    st.integers(0, 5), st.integers(1, 6), st.lists(st.integers(min_value=0), max_size=8),
    st.sampled_from([16, 64, 64 * 1024]),
)  # fmt: skip
def test_chunking_never_changes_the_facts(model, version, rid, inputs, responses, cuts, limit):
    req = grpc(request(model, version, rid, inputs=[f"I{i}" for i in range(inputs)], raw=(b"z" * 300,)))
    resp = b"".join(grpc(stream_response(response(model, "1", rid))) for _ in range(responses))
    whole = V2GrpcCall(STREAM, limit=limit)
    whole.request_body(req)
    whole.response_body(7, resp)
    expected = whole.finish()
    chunked = V2GrpcCall(STREAM, limit=limit)
    for piece in split(req, cuts):
        chunked.request_body(piece)
    for piece in split(resp, cuts):
        chunked.response_body(7, piece)
    assert chunked.finish() == expected and chunked.errors == whole.errors == 0
    if limit == 64 * 1024:
        assert (expected.request_model, expected.inputs, expected.chunks) == (model, inputs, responses)
        assert expected.model_version == (version or "1") and (expected.response_id or "") == rid
