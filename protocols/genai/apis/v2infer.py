"""The v2 inference protocol (KServe's Open Inference Protocol; Triton, KServe, MLServer and
OpenVINO Model Server speak it alike): ``POST /v2/models/{name}[/versions/{version}]/infer``
over HTTP, and ``inference.GRPCInferenceService``'s ``ModelInfer`` / ``ModelStreamInfer``
over gRPC. Operation ``infer`` (custom: tensor inference has no well-known value); provider
``open_inference`` (the protocol's name: nothing on the wire tells the servers apart).

HTTP: the model name (from the path, percent-decoded) is the request model and the
response's ``model_name`` the response model; the version (the path's, else the
response's ``model_version``); the request's ``id``, echoed by the response, the response
id; the number of input tensors sent and of output tensors returned. With the binary
tensor data extension a body is a JSON head followed by raw tensor bytes: the
``Inference-Header-Content-Length`` header (the only header read besides Host and
User-Agent) gives the head's length and only the head is parsed (without the header, the
body's first JSON value); tensor data is never kept.

gRPC: protocols/genai/v2grpc.py's :class:`~protocols.genai.v2grpc.V2GrpcCall` reads the
protobuf messages of the stream's DATA (its own per-call state: the bodies are not JSON).
"""

from __future__ import annotations

from urllib.parse import unquote

from protocols.genai.api import Endpoint, LlmApi, request_model, sampling
from protocols.genai.chunks import openai_event
from protocols.genai.jsonutil import json_head
from protocols.genai.v2grpc import V2GrpcCall

#: The ``:path`` prefix of the gRPC service's methods.
GRPC_SERVICE = "/inference.GRPCInferenceService/"
_HEAD_LENGTH = "inference-header-content-length"
_PREFIX, _SUFFIX = "/v2/models/", "/infer"


class V2InferApi(LlmApi):
    name = "v2_infer"
    provider = "open_inference"
    operations = ("infer",)
    plain_event = staticmethod(openai_event)
    sse_tap = True
    request_headers = (_HEAD_LENGTH,)
    response_headers = (_HEAD_LENGTH,)

    def routes(self):
        yield "infer", self._claim
        yield GRPC_SERVICE + "ModelInfer", Endpoint(self, "infer", route="grpc")
        yield GRPC_SERVICE + "ModelStreamInfer", Endpoint(self, "infer", streaming=True, route="grpc")

    def _claim(self, path: str) -> Endpoint | None:
        """``/v2/models/{name}[/versions/{version}]/infer`` -> its endpoint (name percent-decoded)."""
        if not path.startswith(_PREFIX) or not path.endswith(_SUFFIX):
            return None
        parts = path[len(_PREFIX) : -len(_SUFFIX)].split("/")
        if len(parts) == 1 and parts[0]:
            name, version = parts[0], None
        elif len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
            name, version = parts[0], parts[2]
        else:
            return None
        if "%" in name:
            name = unquote(name)
        return Endpoint(self, "infer", name, version, route="http")

    def new_call(self, endpoint, capture_content):
        if endpoint.route == "grpc":
            return V2GrpcCall(endpoint, capture_content)
        return super().new_call(endpoint, capture_content)

    def header(self, call, response, name, value):
        """The binary extension's JSON head length of the request or the response."""
        if value is not None and value.strip().isdigit():
            if call.scratch is None:
                call.scratch = {}
            call.scratch["response" if response else "request"] = int(value.strip())

    def parse_request(self, call):
        head = call.req_head
        if head.lstrip()[:1] != b"{":
            return {}
        # the JSON head only (tensors may follow); the model is the path's even when it does not parse
        return json_head(head, _head_length(call, "request")) or {"\0truncated": True}

    def request_facts(self, call, request, facts):
        request_model(request, facts)
        sampling(request, facts)
        endpoint = call.endpoint
        if endpoint.model:
            facts.request_model = endpoint.model
        if endpoint.version:
            facts.model_version = endpoint.version
        inputs = request.get("inputs")
        facts.inputs = len(inputs) if isinstance(inputs, list) else None

    def request_stream(self, call, request):
        stream = request.get("stream")
        return stream if isinstance(stream, bool) else None

    def read_response(self, call, head, tail, whole):
        if head.lstrip()[:1] != b"{":
            return
        obj = json_head(head, _head_length(call, "response"))  # the JSON head only (tensors may follow)
        if obj is None:
            return
        facts = call.facts
        name = obj.get("model_name")
        if isinstance(name, str) and name:
            facts.response_model = name
        version = obj.get("model_version")
        if isinstance(version, str) and version and call.endpoint.version is None:
            facts.model_version = version
        value = obj.get("id")
        if isinstance(value, str) and value:
            facts.response_id = value
        outputs = obj.get("outputs")
        if isinstance(outputs, list):
            facts.outputs = len(outputs)


def _head_length(call, side: str) -> int:
    """The header's JSON head length for ``side`` (-1: not told)."""
    return -1 if call.scratch is None else call.scratch.get(side, -1)


API = V2InferApi()
