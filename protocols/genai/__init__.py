"""LLM API calls carried on HTTP: OpenAI-compatible and Ollama, streamed or not.

Pure and sans-IO like every package under ``protocols/``: no eBPF, no
OpenTelemetry, no I/O. It is not a wire protocol of its own (the exchange is
HTTP/1's); it reads the bodies of exchanges that HTTP/1 already parsed:

* :mod:`protocols.genai.sse`: an incremental Server-Sent Events parser (and
  the line splitter it and Ollama's NDJSON streams share), bounded memory,
  never raises, same events whatever the chunk boundaries;
* :mod:`protocols.genai.llm`: which request paths are LLM calls
  (:func:`match_endpoint`), and :class:`LlmCall`, the small per-exchange
  state fed with body chunks as they cross the socket, which keeps only the
  fields spans need (model, parameters, ids, finish reasons, token usage,
  first/last output-chunk times and the chunk count), never a whole body;
* :mod:`protocols.genai.v2grpc`: the v2 inference protocol over gRPC (Triton,
  KServe: ``ModelInfer``, ``ModelStreamInfer``), :class:`V2GrpcCall` (``LlmCall``'s
  interface) over a bounded reader of gRPC messages and of the protobuf wire format.
"""

from protocols.genai.llm import (
    REQUEST_BODY_LIMIT,
    RESPONSE_BODY_LIMIT,
    Api,
    Endpoint,
    LlmCall,
    LlmFacts,
    Operation,
    match_endpoint,
)
from protocols.genai.sse import LineSplitter, SseEvent, SseParser
from protocols.genai.v2grpc import V2GrpcCall

__all__ = [
    "REQUEST_BODY_LIMIT",
    "RESPONSE_BODY_LIMIT",
    "Api",
    "Endpoint",
    "LineSplitter",
    "LlmCall",
    "LlmFacts",
    "Operation",
    "SseEvent",
    "SseParser",
    "V2GrpcCall",
    "match_endpoint",
]
