"""What a recognised LLM call is (:class:`Endpoint`) and what its bytes showed (:class:`LlmFacts`).

Both are plain data shared by every API module (protocols/genai/apis/), the per-call
state (protocols/genai/llm.py's :class:`~protocols.genai.llm.LlmCall`) and the span
semantics (otelbpf/semantics/genai.py), which reads only these: it never asks which API
a call was.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A request path an API claimed (protocols/genai/routes.py): which API reads the
    call, and what the path alone says of it."""

    #: The API family (its module's ``API`` object, an :class:`~protocols.genai.api.LlmApi`).
    api: object
    #: ``gen_ai.operation.name`` (a conventions' value, or a custom one: otelbpf/semconv.py).
    operation: str
    #: The model (and its version) the path names (v2 inference, Gemini, Bedrock), percent-decoded.
    model: str | None = None
    version: str | None = None
    #: The call streams by its route (gRPC's ModelStreamInfer, Gemini's streamGenerateContent,
    #: Bedrock's converse-stream): its responses are output chunks.
    streaming: bool = False
    #: The API's own name of the call, when one family has several kinds (``"converse"``, ...).
    route: str = ""
    #: The HTTP/1 parser may read the response with an SSE tap made before it comes
    #: (protocols/genai/tap.py: the OpenAI-style chunk streams).
    tap: bool = False


@dataclass(slots=True)
class LlmFacts:
    """What one LLM call showed on the wire (None: not seen)."""

    endpoint: Endpoint
    #: ``gen_ai.operation.name``: the endpoint's, unless the body said otherwise (a Bedrock
    #: ``invoke`` of a model's text-completion body).
    operation: str = ""
    request_model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    response_id: str | None = None
    response_model: str | None = None
    finish_reasons: tuple[str, ...] = ()
    #: Input tokens, cached ones included (Anthropic: input + cache read + cache creation).
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: Prompt-cache input tokens read and written (Anthropic's usage; OpenAI's cached_tokens).
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    #: Rerank / score: documents in the request, its top_n, results in the response.
    documents: int | None = None
    top_n: int | None = None
    results: int | None = None
    #: v2 inference: the model version (the path's, else the response's), input tensors
    #: sent, output tensors returned.
    model_version: str | None = None
    inputs: int | None = None
    outputs: int | None = None
    #: The response was streamed (SSE, NDJSON or an API's own framing), whatever the request asked.
    streamed: bool = False
    #: Times (the syscall's) of the first and last output chunks, and their count.
    first_chunk_ns: int = 0
    last_chunk_ns: int = 0
    chunks: int = 0
    #: With content capture only: (role, text) per input message, and the output text.
    input_messages: list[tuple[str, str]] | None = None
    output_text: str | None = None
    #: Some content was cut to the capture limit.
    content_truncated: bool = False
    #: Holes in the response body (bytes the capture lost); the stream resumed after each.
    gaps: int = 0
    #: Where the usage came from: "" (this side's bytes), "peer" (the other end's span).
    usage_source: str = ""

    def __post_init__(self) -> None:
        if not self.operation:
            self.operation = self.endpoint.operation
