"""LLM API calls carried on HTTP/1 and HTTP/2, streamed or not, one module per API family.

Pure and sans-IO like every package under ``protocols/``: no eBPF, no OpenTelemetry, no
I/O. It is not a wire protocol of its own (the exchange is HTTP's); it reads the bodies
of exchanges that HTTP already parsed:

* :mod:`protocols.genai.api`: :class:`~protocols.genai.api.LlmApi`, the interface an API
  family implements (the paths it claims, request facts, response facts, stream events,
  its stream framing), with the OpenAI format's defaults;
* :mod:`protocols.genai.apis`: the families, one module each (OpenAI chat/completions/
  embeddings, OpenAI Responses, Anthropic Messages, Ollama, rerank/score, Hugging Face TGI,
  the v2 inference protocol over HTTP and gRPC, Google Gemini, AWS Bedrock Runtime), and
  :func:`~protocols.genai.apis.default_routes`: one registration line each;
* :mod:`protocols.genai.routes`: :class:`~protocols.genai.routes.Routes`, which request
  paths are LLM calls (a dict lookup per request, whatever the number of APIs);
* :mod:`protocols.genai.llm`: :class:`~protocols.genai.llm.LlmCall`, the small
  per-exchange state fed with body chunks as they cross the socket, which keeps within
  bounds what the API needs and frames the response (SSE, NDJSON, an API's framing, JSON),
  never a whole body; :mod:`protocols.genai.facts`: what it keeps (:class:`LlmFacts`);
* :mod:`protocols.genai.chunks`: what runs per stream chunk (compiled): the HTTP/1 parser's
  SSE tap and the byte classifiers that count output chunks without decoding them;
  :mod:`protocols.genai.jsonutil`: JSON decoding and the scan of oversized bodies;
* framings: :mod:`protocols.genai.sse` (Server-Sent Events, and the line splitter it and
  NDJSON streams share), :mod:`protocols.genai.jsonarray` (a JSON array streamed element
  by element: Gemini without ``alt=sse``), :mod:`protocols.genai.eventstream` (AWS's binary
  event stream, CRC-checked: Bedrock's streams); each bounded, never raising, the same
  events whatever the chunk boundaries;
* :mod:`protocols.genai.v2grpc`: the v2 inference protocol over gRPC (Triton, KServe:
  ``ModelInfer``, ``ModelStreamInfer``), :class:`V2GrpcCall` (``LlmCall``'s feeding
  interface) over a bounded reader of gRPC messages and of the protobuf wire format.
"""

from protocols.genai.api import LlmApi
from protocols.genai.apis import ROUTES, default_routes, match_endpoint
from protocols.genai.facts import Endpoint, LlmFacts
from protocols.genai.llm import REQUEST_BODY_LIMIT, RESPONSE_BODY_LIMIT, LlmCall
from protocols.genai.routes import Routes
from protocols.genai.sse import LineSplitter, SseEvent, SseParser
from protocols.genai.v2grpc import V2GrpcCall

__all__ = [
    "REQUEST_BODY_LIMIT",
    "RESPONSE_BODY_LIMIT",
    "ROUTES",
    "Endpoint",
    "LineSplitter",
    "LlmApi",
    "LlmCall",
    "LlmFacts",
    "Routes",
    "SseEvent",
    "SseParser",
    "V2GrpcCall",
    "default_routes",
    "match_endpoint",
]
