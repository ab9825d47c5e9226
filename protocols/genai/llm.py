"""Which HTTP exchanges are LLM API calls, and what to keep of their bodies.

Recognition is by request path first (cheap, :func:`match_endpoint`), then
by body: a call whose request body is not a JSON object, or that names no
model in its request or its response, yields no facts (it is some other
application's ``/api/chat`` or ``/v1/responses``).

Endpoints (POST only):

=====================================  ===================  =================
path                                   API                  operation
=====================================  ===================  =================
``.../v1/chat/completions``            OpenAI-compatible    chat
``.../v1/completions``                 OpenAI-compatible    text_completion
``.../v1/embeddings``                  OpenAI-compatible    embeddings
``.../v1/responses``                   OpenAI Responses     chat
``/api/chat``                          Ollama               chat
``/api/generate``                      Ollama               text_completion
``/api/embed``, ``/api/embeddings``    Ollama               embeddings
``.../v1/messages``                    Anthropic Messages   chat
``.../rerank`` (v1, v2, bare)          rerank (vLLM,        rerank (custom)
                                       Cohere, Jina, TEI)
``.../score`` (v1, bare)               vLLM score           score (custom)
``/``, ``/generate``,                  TGI native           text_completion
``/generate_stream``
``/v2/models/M[/versions/V]/infer``    v2 inference         infer (custom)
                                       (Triton, KServe)
gRPC ``ModelInfer``,                   the same over gRPC   infer (custom)
``ModelStreamInfer``                   (v2grpc.py)
=====================================  ===================  =================

The v2 inference protocol (KServe's Open Inference Protocol, Triton's HTTP API) names
the model and its version in the path (:class:`Endpoint` carries them); the bodies are
tensors: the facts keep the number of input tensors sent and output tensors returned,
the response's ``model_name``/``model_version`` and ``id``. With the binary tensor data
extension a body is a JSON head followed by raw tensor bytes: its length is the
``Inference-Header-Content-Length`` header (:meth:`LlmCall.json_head_length`), and only
the head is parsed (without the header, the first JSON value of the body).

Hugging Face TGI's native API names no model anywhere (one server serves one model):
a TGI call is recognised by its shape instead, a request object with ``inputs`` and
a response with ``generated_text``, a ``token`` event or an ``error_type``. ``POST /``
is TGI's compatibility route (huggingface_hub's ``InferenceClient.text_generation``
posts there; ``"stream": true`` makes it ``/generate_stream``); its non-streamed answer
is a one-element JSON list. Output tokens come from ``details.generated_tokens``,
input tokens from ``details.input_length`` (stream details) or the ``prefill`` list
(``decoder_input_details``), the finish reason from ``details.finish_reason``; a
stream's output chunks are its token events whose token is not ``special`` (the
middle events are counted from their bytes, never decoded).

Anthropic's Messages API streams named SSE events (``message_start`` with the
id, model and input usage; ``content_block_delta`` per output chunk;
``message_delta`` with ``stop_reason`` and the cumulative output usage;
``message_stop``); its ``input_tokens`` excludes the prompt-cache tokens, so
the facts' ``input_tokens`` is their sum (the GenAI conventions' input
tokens include cached ones) and the two cache counts are kept apart. Rerank
and score calls are plain JSON: the facts keep the number of documents, the
request's ``top_n``, the number of results and the usage when present.

The OpenAI-style suffixes are recognised under any prefix containing
``/v1/`` or starting with ``/openai/`` (Azure's ``/openai/deployments/X/...``).

:class:`LlmCall` is the per-exchange state, fed by the HTTP exchange's body
chunks as they cross the socket (``request_body``, ``response_start``,
``response_body``) and read once at the end (``finish`` -> :class:`LlmFacts`).
What it keeps is bounded by content, never a whole long body:

* the request body: its first :data:`REQUEST_BODY_LIMIT` bytes (64 KiB) for
  the JSON parse, plus its last :data:`TAIL_LIMIT` bytes; a longer body, or
  one that does not parse (bytes past the agent's capture size are never
  seen), is read best-effort by scanning the kept head and tail for top-level
  keys (``model``, ``max_tokens``, ...), first occurrence in the head, last in
  the tail;
* a streamed response (SSE for OpenAI, NDJSON for Ollama) is parsed event by
  event as it arrives: each event (at most 64 KiB) is decoded and dropped,
  keeping only ids, models, finish reasons, the latest usage, the first and
  last output-chunk times and the chunk count, so the final usage chunk of a
  response of any length is always seen; an event over 64 KiB (the Responses
  API's ``response.completed`` repeats the whole output) is read from its
  first 64 KiB and last 16 KiB like an oversized body;
* a non-streamed JSON response: its first :data:`RESPONSE_BODY_LIMIT` bytes
  (64 KiB) plus its last :data:`TAIL_LIMIT` bytes; when it fits it is parsed
  whole, otherwise the head and tail are scanned like an oversized request
  (an embeddings response's ``usage`` and ``model`` come last: the tail
  keeps them).

An *output chunk* is a streamed event that carries output: a non-empty
content, text, reasoning or tool-call delta (OpenAI), a ``*.delta`` event
(Responses API), a non-empty ``message.content``/``response``/``thinking``
(Ollama). Role-only first chunks, usage-only last chunks and ``[DONE]`` are
not output: a server that sends its role chunk at once does not fake a
short time to first token.

Prompt and completion text are kept only when ``capture_content`` is set,
at most ``content_limit`` characters each (prompt, completion). Nothing here ever raises: a
malformed body yields fewer facts (``errors`` counts internal failures).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from protocols.genai.sse import LineSplitter, SseEvent, SseParser
from protocols.http1.parse import BodyTap

try:
    import cython
except ImportError:  # Cython not installed: run as plain Python

    class cython:  # type: ignore[no-redef]  # noqa: N801 - stands in for the module
        compiled = False

#: Request-body bytes kept for the JSON parse.
REQUEST_BODY_LIMIT = 64 * 1024
#: Non-streamed response-body bytes kept for the JSON parse.
RESPONSE_BODY_LIMIT = 64 * 1024
#: Bytes kept of the end of a body too long for its limit (for trailing keys such as ``usage``).
TAIL_LIMIT = 16 * 1024
#: Characters of prompt text, and of completion text, kept when content capture is on.
CONTENT_LIMIT = 16 * 1024
#: Choices (``n``) whose finish reasons are tracked.
MAX_CHOICES = 16
#: Attempts per key when scanning an oversized body.
_MAX_SCAN_ATTEMPTS = 8
_DECODER = json.JSONDecoder()


class Operation(enum.Enum):
    """What the call does; values are the GenAI conventions' operation names."""

    CHAT = "chat"
    TEXT_COMPLETION = "text_completion"
    EMBEDDINGS = "embeddings"
    #: No well-known value applies (custom values, otelbpf/semconv.py): ranking
    #: documents against a query, and scoring text pairs.
    RERANK = "rerank"
    SCORE = "score"
    #: Tensor inference by the v2 inference protocol (Triton, KServe): no well-known value.
    INFER = "infer"


class Api(enum.Enum):
    """The wire format family (decides which JSON fields mean what)."""

    OPENAI = "openai"  # chat/completions, completions, embeddings
    OPENAI_RESPONSES = "openai_responses"  # /v1/responses
    OLLAMA = "ollama"  # /api/chat, /api/generate, /api/embed
    ANTHROPIC = "anthropic"  # /v1/messages
    RERANK = "rerank"  # /v1/rerank, /v1/score (vLLM, Cohere, Jina, TEI shapes)
    TGI = "tgi"  # Hugging Face TGI's native /generate, /generate_stream, / (no model named)
    V2_INFER = "v2_infer"  # the v2 inference protocol: /v2/models/M[/versions/V]/infer
    V2_GRPC = "v2_grpc"  # the same over gRPC: inference.GRPCInferenceService/ModelInfer, ModelStreamInfer


@dataclass(frozen=True, slots=True)
class Endpoint:
    api: Api
    operation: Operation
    #: The model (and its version) the path names (the v2 inference protocol's).
    model: str | None = None
    version: str | None = None
    #: The call streams by its method (gRPC's ModelStreamInfer): its responses are output chunks.
    streaming: bool = False


_OPENAI_SUFFIXES: tuple[tuple[str, Endpoint], ...] = (
    ("/chat/completions", Endpoint(Api.OPENAI, Operation.CHAT)),
    ("/completions", Endpoint(Api.OPENAI, Operation.TEXT_COMPLETION)),
    ("/embeddings", Endpoint(Api.OPENAI, Operation.EMBEDDINGS)),
    ("/responses", Endpoint(Api.OPENAI_RESPONSES, Operation.CHAT)),
    ("/v1/messages", Endpoint(Api.ANTHROPIC, Operation.CHAT)),  # not .../threads/X/messages
    ("/rerank", Endpoint(Api.RERANK, Operation.RERANK)),
    ("/score", Endpoint(Api.RERANK, Operation.SCORE)),
)
#: Paths outside /v1/ that serving engines answer too (vLLM's bare routes, Cohere's v2).
_OTHER_PATHS: dict[str, Endpoint] = {
    "/rerank": Endpoint(Api.RERANK, Operation.RERANK),
    "/v2/rerank": Endpoint(Api.RERANK, Operation.RERANK),
    "/score": Endpoint(Api.RERANK, Operation.SCORE),
}
#: Hugging Face TGI's native routes ("/" is its compatibility route: stream or not by the body).
_TGI = Endpoint(Api.TGI, Operation.TEXT_COMPLETION)
_TGI_PATHS: dict[str, Endpoint] = {"/": _TGI, "/generate": _TGI, "/generate_stream": _TGI}
#: The v2 inference protocol over gRPC (protocols/genai/v2grpc.py reads its messages):
#: the ``:path`` of its two inference methods.
V2_GRPC_SERVICE = "/inference.GRPCInferenceService/"
_V2_GRPC_PATHS: dict[str, Endpoint] = {
    V2_GRPC_SERVICE + "ModelInfer": Endpoint(Api.V2_GRPC, Operation.INFER),
    V2_GRPC_SERVICE + "ModelStreamInfer": Endpoint(Api.V2_GRPC, Operation.INFER, streaming=True),
}
_OLLAMA_PATHS: dict[str, Endpoint] = {
    "/api/chat": Endpoint(Api.OLLAMA, Operation.CHAT),
    "/api/generate": Endpoint(Api.OLLAMA, Operation.TEXT_COMPLETION),
    "/api/embed": Endpoint(Api.OLLAMA, Operation.EMBEDDINGS),
    "/api/embeddings": Endpoint(Api.OLLAMA, Operation.EMBEDDINGS),
}


def match_endpoint(method: str, target: str) -> Endpoint | None:
    """The LLM endpoint a request-target names, or None. Cheap: string tests only."""
    if method != "POST" or not target:
        return None
    if target == "/":
        return _TGI  # TGI's compatibility route (the body tells: LlmCall.finish)
    if (
        "/v1/" not in target and "/api/" not in target and "/openai/" not in target
        and "/rerank" not in target and "/score" not in target and "/generate" not in target
        and target[:2] != "/?" and "/v2/models/" not in target
    ):
        if target.startswith(V2_GRPC_SERVICE):
            return _V2_GRPC_PATHS.get(target)  # Triton's / KServe's gRPC inference calls
        return None  # every endpoint's path has one of these: most POSTs (gRPC's) end here
    if target[0] != "/":
        if not target.startswith(("http://", "https://")):
            return None
        rest = target.partition("://")[2]
        slash = rest.find("/")
        target = rest[slash:] if slash >= 0 else "/"
    path = target.partition("?")[0].partition("#")[0]
    if len(path) > 1 and path[-1] == "/":
        path = path[:-1]
    endpoint = _OLLAMA_PATHS.get(path)
    if endpoint is not None:
        return endpoint
    endpoint = _OTHER_PATHS.get(path)
    if endpoint is not None:
        return endpoint
    endpoint = _TGI_PATHS.get(path or "/")
    if endpoint is not None:
        return endpoint
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        return _v2_endpoint(path)
    if "/v1/" not in path and not path.startswith("/openai/"):
        return None
    for suffix, endpoint in _OPENAI_SUFFIXES:
        if path.endswith(suffix):
            return endpoint
    return None


def _v2_endpoint(path: str) -> Endpoint | None:
    """``/v2/models/{name}[/versions/{version}]/infer`` -> its endpoint (name percent-decoded)."""
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        name, version = parts[0], None
    elif len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        name, version = parts[0], parts[2]
    else:
        return None
    if "%" in name:
        from urllib.parse import unquote

        name = unquote(name)
    return Endpoint(Api.V2_INFER, Operation.INFER, name, version)


@dataclass(slots=True)
class LlmFacts:
    """What one LLM call showed on the wire (None: not seen)."""

    endpoint: Endpoint
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
    #: The response was streamed (SSE or NDJSON), whatever the request asked.
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


_SSE, _NDJSON, _JSON = 1, 2, 3


class LlmCall:
    """One LLM call's state, fed with its exchange's body chunks in order."""

    __slots__ = (
        "endpoint", "capture_content", "request_limit", "response_limit", "content_limit", "errors",
        "_req_head", "_req_tail", "_req_size", "_request", "_mode", "_sse", "_lines",
        "_resp_head", "_resp_tail", "_resp_size", "_facts", "_finish", "_output", "_budget", "_ended",
        "_req_gap", "_resp_gap", "_parsed_first", "_uncached_input", "_shaped",
        "_req_json_len", "_resp_json_len", "_tap",
    )  # fmt: skip

    def __init__(
        self,
        endpoint: Endpoint,
        capture_content: bool = False,
        request_limit: int = REQUEST_BODY_LIMIT,
        response_limit: int = RESPONSE_BODY_LIMIT,
        content_limit: int = CONTENT_LIMIT,
    ) -> None:
        self.endpoint = endpoint
        self.capture_content = capture_content
        self.request_limit = request_limit
        self.response_limit = response_limit
        self.content_limit = content_limit
        #: Internal failures swallowed (a bug, not bad input: bad input is just ignored).
        self.errors = 0
        self._req_head = bytearray()
        self._req_tail = b""
        self._req_size = 0
        self._request: dict | None = None  # parsed lazily
        self._mode = 0
        self._sse: SseParser | None = None
        self._lines: LineSplitter | None = None
        self._resp_head = bytearray()
        self._resp_tail = b""
        self._resp_size = 0
        self._facts = LlmFacts(endpoint)
        self._finish: dict[int, str] = {}
        self._output: list[str] = []
        self._budget = content_limit
        self._ended = False
        self._req_gap = False  # request body bytes were lost: parse it best effort
        self._resp_gap = False  # response body bytes were lost (the facts say so: gaps)
        self._parsed_first = False  # the first streamed chunk was decoded (ids, model)
        self._uncached_input: int | None = None  # Anthropic's input_tokens (cache tokens apart)
        self._shaped = False  # the response had the API's shape (TGI: it names no model)
        self._tap: SseTap | None = None  # the reader of its SSE bytes in the HTTP/1 parser, if one was made
        self._req_json_len = -1  # v2 binary extension: the JSON head's length (-1: not told)
        self._resp_json_len = -1

    # -- feeding ---------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes held (bounded by the limits, whatever was fed)."""
        held = len(self._req_head) + len(self._req_tail) + len(self._resp_head) + len(self._resp_tail)
        if self._sse is not None:
            held += self._sse.buffered
        if self._lines is not None:
            held += self._lines.buffered
        if self._tap is not None:
            held += self._tap.held
        return held

    def request_body(self, data: bytes | None) -> None:
        try:
            if data is None:  # a hole: bytes the capture lost
                self._req_gap = True
                return
            self._req_size += len(data)
            self._req_head, self._req_tail = _keep(self._req_head, self._req_tail, data, self.request_limit)
        except Exception:  # noqa: BLE001 - never raise on what a traced program sends
            self.errors += 1

    def response_start(self, content_type: str | None) -> None:
        """The response head arrived; its Content-Type picks the body's format."""
        try:
            kind = (content_type or "").partition(";")[0].strip().lower()
            if kind == "text/event-stream":
                self._start_mode(_SSE)
            elif kind in ("application/x-ndjson", "application/jsonl", "application/jsonlines"):
                self._start_mode(_NDJSON)
            elif kind:
                self._start_mode(_JSON)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def response_body(self, ts_ns: int, data: bytes | None) -> None:
        try:
            tap = self._tap
            if tap is not None and tap.active:
                # The tap reads the stream (the HTTP/1 parser hands it what comes next): the
                # pieces reported before it was set come to it here, in order, until one it
                # cannot read, from which the call reads as usual.
                if type(data) is bytes:
                    taken = tap.take(data, 0, len(data), ts_ns)
                    if taken >= len(data):
                        return
                    data = data[taken:]
                held = tap.release()
                if held is not None:
                    self._response_piece(held[1], held[0])
            self._response_piece(ts_ns, data)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _response_piece(self, ts_ns: int, data: bytes | None) -> None:
        try:
            if data is None:
                self._response_gap()
                return
            if not self._mode:
                self._sniff(data)
            mode = self._mode
            if mode == _SSE:
                assert self._sse is not None
                for event in self._sse.feed(data):
                    self._on_sse(ts_ns, event)
            elif mode == _NDJSON:
                assert self._lines is not None
                for line, tail in self._lines.feed(data):
                    self._on_ndjson(ts_ns, line, tail)
            elif mode == _JSON:
                self._resp_size += len(data)
                self._resp_head, self._resp_tail = _keep(self._resp_head, self._resp_tail, data, self.response_limit)
        except Exception:  # noqa: BLE001
            self.errors += 1

    def _response_gap(self) -> None:
        """Response bytes were lost here (a truncated or lost capture): streams resume at
        their next trustworthy boundary (SseParser.gap, LineSplitter.gap); a JSON body is
        then read from its kept head and tail only."""
        self._resp_gap = True
        self._facts.gaps += 1
        if self._sse is not None:
            self._sse.gap()
        elif self._lines is not None:
            self._lines.gap()

    def json_head_length(self, response: bool, value: str | None) -> None:
        """The v2 binary extension's ``Inference-Header-Content-Length`` of the request or
        the response: only that many bytes of its body are JSON."""
        if value is not None and value.strip().isdigit():
            if response:
                self._resp_json_len = int(value.strip())
            else:
                self._req_json_len = int(value.strip())

    def finish(self) -> LlmFacts | None:
        """The facts, once the exchange is over; None if the request was not a JSON object."""
        try:
            if self._tap is not None:
                self._tap.release()  # what it counted (it takes nothing more)
            return self._finish_facts()
        except Exception:  # noqa: BLE001
            self.errors += 1
            return None

    # -- request ---------------------------------------------------------------

    def request(self) -> dict | None:
        """The request's top-level fields (parsed once; best effort when over the limit)."""
        if self._request is None:
            self._request = self._parse_request()
        return self._request if self._request else None

    def _parse_request(self) -> dict:
        head = self._req_head
        first = head.lstrip()[:1]
        if first != b"{":
            return {}  # not a JSON object: not an LLM call
        if self.endpoint.api is Api.V2_INFER:  # the JSON head only (tensors may follow)
            return _json_head(head, self._req_json_len) or {"\0truncated": True}  # the model is the path's
        if self._req_size <= self.request_limit and not self._req_gap:
            parsed = _loads(bytes(head))
            if parsed is not None:
                return parsed
        # Over the limit, or not parsable as a whole (bytes the capture did not copy): best effort.
        text_head = head.decode("utf-8", "replace")
        text_tail = self._req_tail.decode("utf-8", "replace")
        out: dict = {}
        for key in ("model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "temperature", "top_p", "options", "top_n", "parameters"):
            value = _scan(text_head, key, last=False)
            if value is None:
                value = _scan(text_tail, key, last=True)
            if value is not None:
                out[key] = value
        out["\0truncated"] = True
        return out

    # -- response --------------------------------------------------------------

    def _start_mode(self, mode: int) -> None:
        if self._mode:
            return
        self._mode = mode
        if mode == _SSE:
            self._sse = SseParser()
            self._facts.streamed = True
        elif mode == _NDJSON:
            self._lines = LineSplitter()
            self._facts.streamed = True

    def _sniff(self, data: bytes) -> None:
        first = data.lstrip()[:1]
        if not first:
            return
        if first in (b"d", b"e", b":", b"i", b"r"):  # data:, event:, comment, id:, retry:
            self._start_mode(_SSE)
        elif first == b"{" and self.endpoint.api is Api.OLLAMA and self._request_stream() is not False:
            self._start_mode(_NDJSON)
        else:
            self._start_mode(_JSON)

    def _request_stream(self) -> bool | None:
        request = self.request()
        if request is None:
            return None
        stream = request.get("stream")
        if isinstance(stream, bool):
            return stream
        if self.endpoint.api is Api.OLLAMA and self.endpoint.operation is not Operation.EMBEDDINGS:
            return True  # Ollama streams unless told not to
        if self.endpoint.operation is Operation.EMBEDDINGS or self.endpoint.api in (Api.RERANK, Api.V2_INFER):
            return None
        if self.endpoint.api is Api.TGI:
            return self._mode == _SSE  # /generate_stream: the route asks for the stream
        return False

    def _chunk(self, ts_ns: int) -> None:
        facts = self._facts
        if facts.chunks == 0:
            facts.first_chunk_ns = ts_ns
        facts.chunks += 1
        facts.last_chunk_ns = ts_ns

    # -- the stream read in the HTTP/1 parser (SseTap) ----------------------------

    def stream_tap(self) -> SseTap | None:
        """A reader of the rest of this call's SSE response for the HTTP/1 parser to hand
        its body pieces to (``HttpResponse.body_tap``): an SSE response of an API whose
        events are unnamed JSON chunks (OpenAI-compatible; not the Anthropic, Responses
        and TGI streams, read by their own rules); None otherwise, or while one is at
        work. The facts are the same as :meth:`response_body` would make of the pieces
        (tests/test_genai_tap.py)."""
        if self._mode != _SSE or self._sse is None or self.endpoint.api in _TAPLESS:
            return None
        tap = self._tap
        if tap is not None and tap.active:
            return None
        tap = SseTap(self, not self.capture_content, self._parsed_first)
        self._tap = tap
        return tap

    def adopt_tap(self, tap: SseTap, content_type: str | None) -> bool:
        """``tap``, made for this call's exchange before its response came (GenAiLayer.wants),
        reads that response from its first byte when it is an SSE stream: the call reads
        the response's head (its content type) now if it has not yet (the progress event of
        the head, handled later, then changes nothing)."""
        current = self._tap
        if current is not None and current.active:
            return False
        if not self._mode:
            self.response_start(content_type)
        if self._mode != _SSE or self._sse is None or self.endpoint.api in _TAPLESS:
            return False
        tap.plain = not self.capture_content
        tap.parsed_first = self._parsed_first
        self._tap = tap
        return True

    def drop_tap(self) -> None:
        """The call is forgotten (evicted): its tap takes nothing more, and drops what it held."""
        tap = self._tap
        if tap is not None:
            tap.active = False
            tap.carry = None
            tap.call = None

    def tap_ready(self, tap: SseTap) -> bool:
        """May ``tap`` take the stream's next bytes? It is this call's, and the SSE parser
        has nothing in progress (what was fed to it before the tap's first piece is read)
        but maybe the start of an event, which the tap takes over (its ``carry``)."""
        if tap is not self._tap or self._sse is None:
            return False
        held = self._sse.hand_over()
        if held is None:
            return False
        if held:
            tap.carry = held
        return True

    def tapped_event(self, ts_ns: int, data: bytes) -> bool:
        """One whole event a tap read but did not settle (the first chunk, one with usage or a
        finish reason, anything unusual; every one with content capture): read here, as
        :meth:`response_body` would. Returns whether the first chunk was decoded by now."""
        try:
            self._on_sse(ts_ns, SseEvent(data))
        except Exception:  # noqa: BLE001
            self.errors += 1
        return self._parsed_first

    def tapped(self, chunks: int, first_ns: int, last_ns: int, events: int) -> None:
        """What a tap counted, in the order of the stream (before what comes next)."""
        if chunks:
            facts = self._facts
            if facts.chunks == 0:
                facts.first_chunk_ns = first_ns
            facts.chunks += chunks
            facts.last_chunk_ns = last_ns
        if events and self._sse is not None:
            self._sse.events += events

    def _on_sse(self, ts_ns: int, event: SseEvent) -> None:
        if event.truncated:  # too big to keep: output, and its ends may still hold ids and usage
            if self.endpoint.api is Api.ANTHROPIC:
                if event.event == "content_block_delta" or event.data.find(b'content_block_delta"', 0, 200) >= 0:
                    self._chunk(ts_ns)
                    return
                self._anthropic_event(ts_ns, self._scan_object(event.data, event.tail))
                return
            if self.endpoint.api is Api.TGI:
                self._chunk(ts_ns)  # a huge token event: output; its end holds the details
                self._tgi_object(self._scan_object(event.data, event.tail), streamed=True)
                return
            if self.endpoint.api is Api.OPENAI_RESPONSES:
                if event.event.endswith(".delta") or event.data.find(b'.delta"', 0, 200) >= 0:
                    self._chunk(ts_ns)
                    return
                self._responses_object(self._scan_object(event.data, event.tail, b'"response"'), streamed=True)
                return
            self._chunk(ts_ns)
            self._openai_fields(self._scan_object(event.data, event.tail))
            return
        data = event.data
        if self._parsed_first and not self.capture_content:
            # Cheap per chunk: a chunk that carries no usage and no finish reason is
            # only counted (is it output?) from its bytes, never decoded.
            api = self.endpoint.api
            if api is Api.ANTHROPIC:
                kind = _anthropic_plain_event(event.event, data)
                if kind > 0:  # content_block_delta: output
                    self._chunk(ts_ns)
                    return
                if kind == 0:  # ping, content_block_start/stop, message_stop: nothing to read
                    return
            elif api is Api.OPENAI_RESPONSES:
                if _responses_delta(event.event, data):
                    self._chunk(ts_ns)
                    return
            elif api is Api.TGI:
                output = _tgi_plain_event(data)
                if output >= 0:
                    if output:
                        self._chunk(ts_ns)
                    return
            else:
                output = _plain_chunk_at(data, 0, len(data))
                if output >= 0:
                    if output:
                        self._chunk(ts_ns)
                    return
        data = data.strip()
        if not data or data == b"[DONE]":
            return
        obj = _loads(data)
        if obj is None:
            return
        self._parsed_first = True
        if self.endpoint.api is Api.ANTHROPIC:
            self._anthropic_event(ts_ns, obj)
        elif self.endpoint.api is Api.OPENAI_RESPONSES:
            self._responses_event(ts_ns, obj)
        elif self.endpoint.api is Api.TGI:
            if self._tgi_object(obj, streamed=True):
                self._chunk(ts_ns)
        else:
            if self._openai_object(obj, streamed=True):
                self._chunk(ts_ns)

    def _on_ndjson(self, ts_ns: int, line: bytes, tail: bytes | None) -> None:
        if tail is not None:  # a line too long to keep: output; its end may hold the counts
            self._chunk(ts_ns)
            self._ollama_object(self._scan_object(line, tail))
            return
        if self._parsed_first and not self.capture_content:
            output = _ollama_plain_line(line)
            if output >= 0:
                if output:
                    self._chunk(ts_ns)
                return
        line = line.strip()
        if not line:
            return
        obj = _loads(line)
        if obj is not None:
            self._parsed_first = True
            if self._ollama_object(obj):
                self._chunk(ts_ns)

    def _ids(self, obj: dict) -> None:
        facts = self._facts
        if facts.response_id is None:
            value = obj.get("id")
            if isinstance(value, str) and value:
                facts.response_id = value
        value = obj.get("model")
        if isinstance(value, str) and value:
            facts.response_model = value

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        facts = self._facts
        tokens = _int(usage.get("prompt_tokens"))
        if tokens is None:
            tokens = _int(usage.get("input_tokens"))
        if tokens is not None:
            facts.input_tokens = tokens
        tokens = _int(usage.get("completion_tokens"))
        if tokens is None:
            tokens = _int(usage.get("output_tokens"))
        if tokens is not None:
            facts.output_tokens = tokens
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        if isinstance(details, dict):
            tokens = _int(details.get("cached_tokens"))
            if tokens is not None:
                facts.cache_read_input_tokens = tokens

    def _openai_object(self, obj: dict, streamed: bool) -> bool:
        """A chat/completions/embeddings response or stream chunk; True if it carries output."""
        self._ids(obj)
        self._usage(obj.get("usage"))
        choices = obj.get("choices")
        output = False
        if isinstance(choices, list):
            for position, choice in enumerate(choices[:MAX_CHOICES]):
                if not isinstance(choice, dict):
                    continue
                index = choice.get("index")
                index = index if isinstance(index, int) and not isinstance(index, bool) else position
                reason = choice.get("finish_reason")
                if isinstance(reason, str) and reason and (index in self._finish or len(self._finish) < MAX_CHOICES):
                    self._finish[index] = reason
                message = choice.get("delta" if streamed else "message")
                if isinstance(message, dict):
                    content = message.get("content")
                    if isinstance(content, str) and content:
                        output = True
                        self._capture_output(content)
                    if message.get("tool_calls") or message.get("reasoning_content") or message.get("reasoning"):
                        output = True
                text = choice.get("text")
                if isinstance(text, str) and text:
                    output = True
                    self._capture_output(text)
        return output

    def _responses_event(self, ts_ns: int, obj: dict) -> None:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return
        if kind.endswith(".delta"):
            self._chunk(ts_ns)
            delta = obj.get("delta")
            if kind == "response.output_text.delta" and isinstance(delta, str):
                self._capture_output(delta)
            return
        response = obj.get("response")
        if isinstance(response, dict):
            self._responses_object(response, streamed=True)

    def _responses_object(self, obj: dict, streamed: bool) -> None:
        self._ids(obj)
        self._usage(obj.get("usage"))
        status = obj.get("status")
        details = obj.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        if isinstance(reason, str) and reason:
            self._finish[0] = reason
        elif isinstance(status, str) and status in ("completed", "incomplete", "failed", "cancelled"):
            self._finish[0] = status
        if not streamed and self.capture_content:
            for item in obj.get("output") or ():
                if isinstance(item, dict):
                    for part in item.get("content") or ():
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            self._capture_output(part["text"])

    # -- Anthropic Messages ------------------------------------------------------

    def _anthropic_usage(self, usage: Any) -> None:
        """Anthropic usage (message_start's, message_delta's cumulative one, a message's):
        input_tokens excludes the cache tokens; the sum is made at the end."""
        if not isinstance(usage, dict):
            return
        facts = self._facts
        tokens = _int(usage.get("input_tokens"))
        if tokens is not None:
            self._uncached_input = tokens
        tokens = _int(usage.get("output_tokens"))
        if tokens is not None:
            facts.output_tokens = tokens
        tokens = _int(usage.get("cache_read_input_tokens"))
        if tokens is not None:
            facts.cache_read_input_tokens = tokens
        tokens = _int(usage.get("cache_creation_input_tokens"))
        if tokens is not None:
            facts.cache_creation_input_tokens = tokens

    def _anthropic_message(self, obj: dict, streamed: bool) -> None:
        """A Messages response (or message_start's ``message``)."""
        self._ids(obj)
        self._anthropic_usage(obj.get("usage"))
        reason = obj.get("stop_reason")
        if isinstance(reason, str) and reason:
            self._finish[0] = reason
        if not streamed and self.capture_content:
            for block in obj.get("content") or ():
                if isinstance(block, dict) and isinstance(block.get("text"), str):
                    self._capture_output(block["text"])

    def _anthropic_event(self, ts_ns: int, obj: dict) -> None:
        kind = obj.get("type")
        if kind == "content_block_delta":
            self._chunk(ts_ns)
            delta = obj.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("text"), str):
                self._capture_output(delta["text"])
        elif kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._anthropic_message(message, streamed=True)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                reason = delta.get("stop_reason")
                if isinstance(reason, str) and reason:
                    self._finish[0] = reason
            self._anthropic_usage(obj.get("usage"))
        elif kind is None and ("usage" in obj or "stop_reason" in obj or "id" in obj):
            self._anthropic_message(obj, streamed=True)  # an oversized event read from its ends

    # -- the v2 inference protocol --------------------------------------------------

    def _v2_response(self, obj: dict) -> None:
        facts = self._facts
        name = obj.get("model_name")
        if isinstance(name, str) and name:
            facts.response_model = name
        version = obj.get("model_version")
        if isinstance(version, str) and version and self.endpoint.version is None:
            facts.model_version = version
        value = obj.get("id")
        if isinstance(value, str) and value:
            facts.response_id = value
        outputs = obj.get("outputs")
        if isinstance(outputs, list):
            facts.outputs = len(outputs)

    # -- Hugging Face TGI ----------------------------------------------------------

    def _tgi_object(self, obj: dict, streamed: bool) -> bool:
        """A TGI response (``/generate``'s object, ``/``'s list item) or stream event;
        True if it carries output (a token event whose token is not special)."""
        output = False
        token = obj.get("token")
        if isinstance(token, dict):
            self._shaped = True
            if not token.get("special"):
                output = True
                if isinstance(token.get("text"), str):
                    self._capture_output(token["text"])
        text = obj.get("generated_text")
        if isinstance(text, str):
            self._shaped = True
            if not streamed:
                self._capture_output(text)
        if isinstance(obj.get("error_type"), str) or (isinstance(obj.get("error"), str) and self._shaped):
            self._shaped = True
        details = obj.get("details")
        if isinstance(details, dict):
            facts = self._facts
            reason = details.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish[0] = reason
            tokens = _int(details.get("generated_tokens"))
            if tokens is not None:
                facts.output_tokens = tokens
            tokens = _int(details.get("input_length"))  # stream details (TGI 2)
            prefill = details.get("prefill")
            if tokens is None and isinstance(prefill, list) and prefill:  # decoder_input_details
                tokens = len(prefill)
            if tokens is not None:
                facts.input_tokens = tokens
        return output

    # -- rerank / score ------------------------------------------------------------

    def _rerank_object(self, obj: dict) -> None:
        """A rerank (``results``) or score (``data``) response: vLLM, Cohere, Jina, TEI shapes."""
        facts = self._facts
        self._ids(obj)
        for key in ("results", "data"):
            value = obj.get(key)
            if isinstance(value, list):
                facts.results = len(value)
                break
        usage = obj.get("usage")
        if not isinstance(usage, dict):
            meta = obj.get("meta")  # Cohere: meta.tokens, or meta.billed_units
            if isinstance(meta, dict):
                usage = meta.get("tokens") if isinstance(meta.get("tokens"), dict) else meta.get("billed_units")
        if isinstance(usage, dict):
            tokens = _int(usage.get("prompt_tokens"))
            if tokens is None:
                tokens = _int(usage.get("input_tokens"))
            if tokens is None:
                tokens = _int(usage.get("total_tokens"))  # a ranker's tokens are all input
            if tokens is not None:
                facts.input_tokens = tokens

    def _ollama_object(self, obj: dict) -> bool:
        """An Ollama response or stream line; True if it carries output."""
        facts = self._facts
        value = obj.get("model")
        if isinstance(value, str) and value:
            facts.response_model = value
        tokens = _int(obj.get("prompt_eval_count"))
        if tokens is not None:
            facts.input_tokens = tokens
        tokens = _int(obj.get("eval_count"))
        if tokens is not None:
            facts.output_tokens = tokens
        reason = obj.get("done_reason")
        if isinstance(reason, str) and reason:
            self._finish[0] = reason
        output = False
        message = obj.get("message")
        if isinstance(message, dict):
            content = message.get("content")
            if isinstance(content, str) and content:
                output = True
                self._capture_output(content)
            if message.get("thinking") or message.get("tool_calls"):
                output = True
        text = obj.get("response")
        if isinstance(text, str) and text:
            output = True
            self._capture_output(text)
        if obj.get("thinking"):
            output = True
        return output

    def _json_response(self) -> None:
        head = self._resp_head
        first = head.lstrip()[:1]
        if first != b"{" and (first != b"[" or self.endpoint.api is not Api.TGI):
            return  # TGI's compatibility route answers a one-element list
        if self.endpoint.api is Api.V2_INFER:  # the JSON head only (tensors may follow)
            obj = _json_head(head, self._resp_json_len)
            if obj is not None:
                self._v2_response(obj)
            return
        if self._resp_size <= self.response_limit and not self._resp_gap:
            obj = _loads(bytes(head)) if first == b"{" else _first_object(bytes(head))
            if obj is None:
                return
            api = self.endpoint.api
            if api is Api.TGI:
                self._tgi_object(obj, streamed=False)
            elif api is Api.OLLAMA:
                self._ollama_object(obj)
            elif api is Api.OPENAI_RESPONSES:
                self._responses_object(obj, streamed=False)
            elif api is Api.ANTHROPIC:
                self._anthropic_message(obj, streamed=False)
            elif api is Api.RERANK:
                self._rerank_object(obj)
            else:
                self._openai_object(obj, streamed=False)
            return
        # Too long to parse whole (embeddings vectors): the head and tail hold the rest.
        obj = self._scan_object(head, self._resp_tail)
        if self.endpoint.api is Api.OLLAMA:
            self._ollama_object(obj)
        elif self.endpoint.api is Api.OPENAI_RESPONSES:
            self._responses_object(obj, streamed=True)
        elif self.endpoint.api is Api.ANTHROPIC:
            self._anthropic_message(obj, streamed=True)
        elif self.endpoint.api is Api.RERANK:
            self._rerank_object(obj)
        elif self.endpoint.api is Api.TGI:
            self._tgi_object(obj, streamed=True)  # generated_text is not kept whole
        else:
            self._openai_fields(obj)

    def _openai_fields(self, obj: dict) -> None:
        self._ids(obj)
        self._usage(obj.get("usage"))

    @staticmethod
    def _scan_object(head: bytes | bytearray, tail: bytes, skip_to: bytes = b"") -> dict:
        """Top-level-looking fields of a JSON object known only by its head and tail (best effort):
        ids and models from the head (after ``skip_to`` when given), the rest from the tail."""
        if skip_to:
            found = head.find(skip_to)
            head = head[found:] if found >= 0 else head
        text_head = head.decode("utf-8", "replace")
        text_tail = tail.decode("utf-8", "replace")
        obj: dict = {}
        for key in ("id", "model"):  # leading fields (an embeddings list puts its model last: the tail)
            value = _scan(text_head, key, last=False)
            if value is None:
                value = _scan(text_tail, key, last=True)
            if value is not None:
                obj[key] = value
        for key in ("usage", "prompt_eval_count", "eval_count", "done_reason", "status", "incomplete_details", "stop_reason", "meta", "details"):
            value = _scan(text_tail, key, last=True)
            if value is None:
                value = _scan(text_head, key, last=False)
            if value is not None:
                obj[key] = value
        return obj

    # -- content ---------------------------------------------------------------

    def _capture_output(self, text: str) -> None:
        if not self.capture_content:
            return
        if self._budget <= 0:
            self._facts.content_truncated = True
            return
        if len(text) > self._budget:
            text = text[: self._budget]
            self._facts.content_truncated = True
        self._budget -= len(text)
        self._output.append(text)

    def _capture_input(self, request: dict) -> list[tuple[str, str]]:
        messages: list[tuple[str, str]] = []
        raw = request.get("messages")
        if isinstance(raw, list):
            for message in raw:
                if isinstance(message, dict):
                    role = message.get("role")
                    messages.append((role if isinstance(role, str) else "user", _text_of(message.get("content"))))
        for key in ("instructions", "system"):
            if isinstance(request.get(key), str):
                messages.insert(0, ("system", request[key]))
            elif key == "system" and isinstance(request.get(key), list):  # Anthropic's system blocks
                messages.insert(0, ("system", _text_of(request[key])))
        for key in ("prompt", "input", "inputs"):
            if key == "inputs" and self.endpoint.api is not Api.TGI:
                continue
            value = request.get(key)
            if value is not None and not isinstance(value, dict):
                if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                    for item in value:  # Responses API input items
                        role = item.get("role")
                        messages.append((role if isinstance(role, str) else "user", _text_of(item.get("content"))))
                else:
                    messages.append(("user", _text_of(value)))
        kept: list[tuple[str, str]] = []
        budget = self.content_limit  # the input's own budget: the output has another
        for role, text in messages:
            if budget <= 0:
                self._facts.content_truncated = True
                break
            if len(text) > budget:
                text = text[:budget]
                self._facts.content_truncated = True
            budget -= len(text)
            kept.append((role, text))
        return kept

    # -- the end -----------------------------------------------------------------

    def _finish_facts(self) -> LlmFacts | None:
        facts = self._facts
        if self._ended:  # finish() once; a second call gets the same answer
            if self.endpoint.api is Api.TGI:
                return facts if self._shaped else None
            return facts if facts.request_model is not None or facts.response_model is not None else None
        request = self.request()
        if request is None:
            return None
        self._ended = True
        api = self.endpoint.api
        model = request.get("model")
        if isinstance(model, str) and model:
            facts.request_model = model
        options = request.get("options") if api is Api.OLLAMA else request.get("parameters") if api is Api.TGI else None
        params = options if isinstance(options, dict) else request
        facts.temperature = _float(params.get("temperature"))
        facts.top_p = _float(params.get("top_p"))
        if api is Api.RERANK:
            self._rerank_request(request)
        elif api is Api.V2_INFER:
            endpoint = self.endpoint
            if endpoint.model:
                facts.request_model = endpoint.model
            if endpoint.version:
                facts.model_version = endpoint.version
            inputs = request.get("inputs")
            facts.inputs = len(inputs) if isinstance(inputs, list) else None
        elif api is Api.TGI:
            facts.max_tokens = _int(params.get("max_new_tokens"))
        elif api is Api.OLLAMA:
            facts.max_tokens = _int(params.get("num_predict"))
        elif api is Api.OPENAI_RESPONSES:
            facts.max_tokens = _int(request.get("max_output_tokens"))
        else:
            facts.max_tokens = _int(request.get("max_completion_tokens"))
            if facts.max_tokens is None:
                facts.max_tokens = _int(request.get("max_tokens"))
        facts.stream = self._request_stream()
        if self.capture_content and "\0truncated" not in request:
            facts.input_messages = self._capture_input(request)
        elif self.capture_content:
            facts.content_truncated = True
        if self._mode == _JSON:
            self._json_response()
        elif self._mode == _NDJSON and self._lines is not None:
            last = self._lines.pending()  # a last line without its newline
            if last is not None and last[1] is None:
                obj = _loads(last[0].strip())
                if obj is not None and self._ollama_object(obj):
                    self._chunk(facts.last_chunk_ns)
        if self._uncached_input is not None:  # Anthropic: the conventions' input tokens include cached ones
            facts.input_tokens = (
                self._uncached_input + (facts.cache_read_input_tokens or 0) + (facts.cache_creation_input_tokens or 0)
            )
        if api is Api.TGI:
            if not self._shaped or not isinstance(request.get("inputs"), (str, list)):
                return None  # some other application's POST / or /generate
        elif facts.request_model is None and facts.response_model is None:
            # Every API here but TGI names a model in the request or the response (Azure's
            # deployments in the response): without one this is some other
            # application's /api/chat or /v1/responses, not an LLM call.
            return None
        if self._finish:
            facts.finish_reasons = tuple(self._finish[index] for index in sorted(self._finish))
        if self.capture_content and self._output:
            facts.output_text = "".join(self._output)
        return facts

    def _rerank_request(self, request: dict) -> None:
        """Documents and top_n of a rerank or score request (vLLM, Cohere, Jina, TEI)."""
        facts = self._facts
        facts.top_n = _int(request.get("top_n"))
        if facts.top_n is None:
            facts.top_n = _int(request.get("top_k"))
        for key in ("documents", "texts", "text_2", "data_2", "items"):
            value = request.get(key)
            if isinstance(value, list):
                facts.documents = len(value)
                return
            if isinstance(value, (str, dict)):
                facts.documents = 1
                return


#: APIs whose streams are read by rules of their own (named events, LlmCall._on_sse): no SseTap.
_TAPLESS = (Api.ANTHROPIC, Api.OPENAI_RESPONSES, Api.TGI)
def tap_endpoint(endpoint: Endpoint) -> bool:
    """May a call to ``endpoint`` get an SseTap before its response comes (GenAiLayer.wants)?
    The OpenAI-style chat and text completions: the calls that stream unnamed JSON chunks."""
    return endpoint.api is Api.OPENAI and (endpoint.operation is Operation.CHAT or endpoint.operation is Operation.TEXT_COMPLETION)


#: The longest ``data:`` value an SseTap reads (a longer line, or event, is cut by SseParser's bounds).
_TAP_MAX_DATA = 64 * 1024 - 6


class SseTap(BodyTap):
    """An LLM call's SSE response, read where the HTTP/1 parser frames it
    (``HttpResponse.body_tap``, see protocols/http1/parse.py's BodyTap), with no BodyData,
    progress event, SseParser pass or SseEvent per chunk: each whole event the tap frames
    (``data: `` and one line, then a blank line) that :func:`_openai_plain_chunk`
    settles from its bytes is counted in place (as output or not); any other such event
    (the first chunk, a finish reason, usage, anything unusual; every one with content
    capture) goes to the call at once (``LlmCall.tapped_event``), as the call would read
    it. The tap is the call's only reader while it works, so the call sees the stream in
    order. It stops at bytes it cannot frame (comments, named or multi-line events, CR
    line ends, an event over the SSE bounds): from there the parser hands them on as
    BodyData and the call reads them as usual, after what the tap read. The start of an
    event is held until a later piece completes it (a client reads a stream in pieces of
    any size). Counts go to the call (``LlmCall.tapped``) before it reads anything else:
    when the tap passes it an event, or is released (by the parser, or ``LlmCall.finish``).
    Made by ``LlmCall.stream_tap``, set by otelbpf/semantics/genai.py."""

    def __init__(
        self, call: LlmCall | None, plain: bool = True, parsed_first: bool = False, layer=None, exchange=None
    ) -> None:
        #: Its call; None for a tap made by the progress filter (GenAiLayer.wants) for an
        #: exchange whose response has not come: it takes its call (``layer.call_for``)
        #: at the response's first piece, when that call adopts it (LlmCall.adopt_tap).
        self.call = call
        self.layer = layer
        self.exchange = exchange
        self.message = None  # the response, from the parser (begin), until the tap takes its call
        #: Takes bytes (False once released, or when its call is dropped).
        self.active = True
        self.plain = plain  # chunks may be settled from their bytes (no content capture)
        self.parsed_first = parsed_first  # the call decoded the first chunk (ids, model)
        self._checked = False  # the call's SSE parser was found idle (at the first piece)
        self.chunks = 0  # output chunks counted, not told to the call yet
        self.first_ns = 0
        self.last_ns = 0
        self.events = 0  # events read, not told to the call yet
        #: The start of an event whose end has not come yet (taken, not read), or None.
        self.carry: bytes | None = None
        self.carry_ts = 0
        # The last chunk classified from a full scan, as a template (compiled build: _classify).
        self._template: bytes | None = None
        self._head = 0  # its bytes up to the opening quote of an output string, that quote included
        self._tail = 0  # its bytes from that string's closing quote on
        self._kind = 0  # what the scan found

    def _classify(self, buf: bytes, start: int, end: int) -> int:
        """:func:`_plain_chunk_at` of ``buf[start:end]``. Compiled, the chunks of a stream
        mostly differ in one string (the token): a chunk equal to the last one scanned
        but for the bytes of the string it kept as a template (the value of an output key
        such as ``content``) is answered as that one was, without a scan, when those bytes
        hold no quote, are not empty and are not one of the names looked for. That is
        exact: the scan reads a chunk's quoted names (each runs from a quote to the next)
        and the bytes after them up to a value's first bytes; the names are then those of
        the template (its head and tail are the same bytes, and the string between them is
        no name), in the same order, and no value read crosses into the string but the
        output key's own, which reads a non-empty string either way."""
        if not cython.compiled:
            return _plain_chunk_at(buf, start, end)
        text = buf  # unsigned char*, llm.pxd
        template = self._template
        if template is not None:
            head, tail = self._head, self._tail
            size = end - start
            if (
                size > head + tail
                and memcmp(text + start, cython.cast(cython.p_uchar, template), head) == 0  # noqa: F821
                and memcmp(text + end - tail, cython.cast(cython.p_uchar, template) + len(template) - tail, tail) == 0  # noqa: F821
                and memchr(text + start + head, 0x22, size - head - tail) == cython.NULL  # noqa: F821
                and not _is_key_name(text, start + head, size - head - tail)
            ):
                return self._kind
        string_at = -1
        kind = _classify_at(text, start, end, cython.address(string_at))
        if kind >= 0 and string_at >= 0:
            hit = memchr(text + string_at + 1, 0x22, end - string_at - 1)  # noqa: F821 - the string's closing quote
            if hit != cython.NULL:
                close = cython.cast(cython.p_uchar, hit) - text
                if close > string_at + 1 and not _is_key_name(text, string_at + 1, close - string_at - 1):
                    self._template = buf[start:end]
                    self._head = string_at + 1 - start
                    self._tail = end - close
                    self._kind = kind
        return kind

    @property
    def held(self) -> int:
        """Bytes it holds: the start of an unfinished event and its template chunk (each
        bounded by the SSE parser's limits)."""
        return (0 if self.carry is None else len(self.carry)) + (0 if self._template is None else len(self._template))

    def begin(self, message) -> None:
        self.message = message

    def _bind(self) -> bool:
        """A tap made for an exchange by the progress filter takes the exchange's call."""
        layer, exchange, message = self.layer, self.exchange, self.message
        self.layer = self.exchange = self.message = None  # no reference cycle through the messages
        if layer is None:
            return False
        call = layer.call_for(exchange)
        if type(call) is not LlmCall:
            return False
        if not call.adopt_tap(self, None if message is None else message.header("content-type")):
            return False
        self.call = call
        return True

    def take(self, data: bytes, start: int, stop: int, ts_ns: int) -> int:
        if not self.active:
            return start
        if not self._checked:
            if self.call is None and not self._bind():
                self.active = False
                return start
            if not self.call.tap_ready(self):
                self.active = False
                return start
            self._checked = True
            self.carry_ts = ts_ns  # of a line begun that the call's SSE parser handed over, if any
        carry = self.carry
        carried = 0
        if carry is None:
            buf, pos, end = data, start, stop
        else:
            buf = carry + data[start:stop]
            pos, end = 0, len(buf)
            carried = len(carry)
            self.carry = None
        while pos < end:
            eol = _event_end(buf, pos, end)
            if eol == -1:  # an event begun: held for the next piece
                self.carry = buf[pos:end] if pos or end != len(buf) else buf
                self.carry_ts = ts_ns
                return stop
            if eol < 0:
                break
            kind = -1
            if self.plain and self.parsed_first:
                kind = 0 if eol - pos == 12 and buf[pos + 6 : eol] == b"[DONE]" else self._classify(buf, pos + 6, eol)
            self.events += 1
            if kind < 0:
                self._flush()  # what was counted first
                self.parsed_first = self.call.tapped_event(ts_ns, buf[pos + 6 : eol])
            elif kind:
                if self.chunks == 0:
                    self.first_ns = ts_ns
                self.chunks += 1
                self.last_ns = ts_ns
            pos = eol + 2
        # Every event up to pos was read; the rest (from bytes it cannot frame, if any) is not taken.
        if carry is None:
            return pos
        if pos == 0:
            self.carry = carry  # the held event is one it cannot frame: released first, then this piece
            return start
        return start + pos - carried

    def _flush(self) -> None:
        if self.chunks or self.events:
            chunks, events = self.chunks, self.events
            self.chunks = self.events = 0
            self.call.tapped(chunks, self.first_ns, self.last_ns, events)

    def release(self) -> tuple[bytes, int] | None:
        self.active = False
        if self.call is not None:
            self._flush()
            self.call = None  # no reference cycle with its call (LlmCall._tap)
        self.layer = self.exchange = self.message = None
        carry = self.carry
        if carry is None:
            return None
        self.carry = None
        return carry, self.carry_ts


def _event_end(buf: bytes, pos: int, end: int) -> int:
    """Where the ``data:`` line of the event at ``buf[pos:end]`` ends (its LF, followed
    by the blank line's LF), when that is a whole event an SseTap reads: ``data: `` and a
    value of at most _TAP_MAX_DATA bytes with no CR or LF. -1: it may still become one
    (its end is not in ``buf`` yet); -2: it cannot."""
    avail = end - pos
    if avail < 6:
        return -1 if buf[pos:end] == b"data: "[:avail] else -2
    if cython.compiled:
        text = buf  # unsigned char*, llm.pxd
        if memcmp(text + pos, b"data: ", 6) != 0:  # noqa: F821 - libc, llm.pxd
            return -2
        hit = memchr(text + pos + 6, 0x0A, avail - 6)  # noqa: F821
        stop = end if hit == cython.NULL else cython.cast(cython.p_uchar, hit) - text
        if memchr(text + pos + 6, 0x0D, stop - pos - 6) != cython.NULL:  # noqa: F821
            return -2
        eol = -1 if hit == cython.NULL else stop
    else:
        if not buf.startswith(b"data: ", pos):
            return -2
        eol = buf.find(b"\n", pos + 6, end)
        if buf.find(b"\r", pos + 6, end if eol < 0 else eol) >= 0:
            return -2
    if eol < 0:
        return -1 if avail - 6 <= _TAP_MAX_DATA else -2
    if eol - pos - 6 > _TAP_MAX_DATA:
        return -2
    if eol + 1 == end:
        return -1
    return eol if buf[eol + 1] == 0x0A else -2


# -- reading a stream chunk's bytes without decoding it (LlmCall._on_sse, cheap per chunk) --


def _value_at(data: bytes, key: bytes) -> int:
    """Where the value of the first ``key`` (a quoted JSON key, ``b'"usage"'``) starts in
    ``data``: the index of its first byte; -1 when the key is not there (as a key: a
    quoted name followed by a colon); -2 when it is there but not followed as a key
    should be (the caller then decodes the chunk). In a JSON text a quoted name can only
    be a key or a string value (quotes inside strings are escaped), so the first match
    followed by a colon is the key."""
    index = data.find(key)
    if index < 0:
        return -1
    pos = index + len(key)
    size = len(data)
    while pos < size and data[pos] == 0x20:
        pos += 1
    if pos >= size or data[pos] != 0x3A:  # ":"
        return -2
    pos += 1
    while pos < size and data[pos] == 0x20:
        pos += 1
    return pos if pos < size else -2


def _absent_or_null(data: bytes, key: bytes) -> bool:
    """Is ``key`` absent from the chunk, or null?"""
    pos = _value_at(data, key)
    if pos == -1:
        return True
    return pos >= 0 and data.startswith(b"null", pos)


def _nonempty_string(data: bytes, key: bytes) -> int:
    """1: ``key``'s value is a non-empty string; 0: absent, null or ""; -1: anything else."""
    pos = _value_at(data, key)
    if pos == -1:
        return 0
    if pos < 0:
        return -1
    first = data[pos]
    if first == 0x22:  # '"'
        return 0 if data[pos + 1 : pos + 2] == b'"' else 1
    if data.startswith(b"null", pos):
        return 0
    return -1


def _openai_plain_chunk(data: bytes) -> int:
    """An OpenAI-style stream chunk read from its bytes alone: 1 if it is output, 0 if not,
    -1 when it must be decoded (it may carry usage, a finish reason, an error, several
    choices, tool calls: anything this quick look does not settle)."""
    if data[:1] != b"{" or data.find(b'"choices"') < 0:
        return -1
    if not _absent_or_null(data, b'"finish_reason"') or not _absent_or_null(data, b'"usage"'):
        return -1
    if data.find(b'"tool_calls"') >= 0 or data.find(b'"error"') >= 0 or data.find(b'"index"', data.find(b'"index"') + 7) >= 0:
        return -1  # tool calls, errors and n > 1 are decoded
    output = 0
    for key in (b'"content"', b'"text"', b'"reasoning_content"', b'"reasoning"'):
        found = _nonempty_string(data, key)
        if found < 0:
            return -1
        if found:
            output = 1
    return output


def _plain_chunk_at(buf: bytes, start: int, end: int) -> int:
    """:func:`_openai_plain_chunk` of ``buf[start:end]``, read in place. Compiled: one
    pass over the chunk's quotes, each looked at as the start of one of the keys that
    function looks for, whose first occurrences (the ``find`` results it works from)
    are then read as it reads them; no object made. tests/test_genai_tap.py holds the
    two to the same answers."""
    if not cython.compiled:
        return _openai_plain_chunk(buf[start:end])
    if start < 0 or end > len(buf):
        return -1
    return _classify_at(buf, start, end, cython.NULL)


def _classify_at(text, start: int, end: int, string_at) -> int:
    """Compiled only: :func:`_plain_chunk_at`'s scan of ``text[start:end]``. Where
    ``string_at`` is not NULL, it gets the position of the opening quote of the first
    non-empty string value read of an output key (``content``, ``text``, ...), or -1."""
    if end - start < 1 or text[start] != 0x7B:  # "{"
        return -1
    seen = 0  # keys whose first occurrence was read (bits)
    output = 0
    first_index = -1
    q = start
    while q < end:
        if text[q] != 0x22:  # a byte loop: quotes are a few bytes apart (no call per quote)
            q += 1
            continue
        name = q + 1
        q += 1
        if name >= end:
            break
        c = text[name]
        key = 0  # the bit of the key whose name starts here (0: none), its closing quote just before ``after``
        after = 0
        if c == 0x63:  # c
            if _key_at(text, name, end, b"choices", 7):
                seen |= 1
                continue
            if _key_at(text, name, end, b"content", 7):
                key, after = 2, name + 8
        elif c == 0x66:  # f
            if _key_at(text, name, end, b"finish_reason", 13):
                key, after = 4, name + 14
        elif c == 0x75:  # u
            if _key_at(text, name, end, b"usage", 5):
                key, after = 8, name + 6
        elif c == 0x74:  # t
            if _key_at(text, name, end, b"tool_calls", 10):
                return -1  # tool calls are decoded
            if _key_at(text, name, end, b"text", 4):
                key, after = 16, name + 5
        elif c == 0x65:  # e
            if _key_at(text, name, end, b"error", 5):
                return -1
        elif c == 0x69:  # i
            if _key_at(text, name, end, b"index", 5):
                if first_index < 0:
                    first_index = q - 1
                elif q - 1 >= first_index + 7:
                    return -1  # n > 1: decoded
                continue
        elif c == 0x72:  # r
            if _key_at(text, name, end, b"reasoning_content", 17):
                key, after = 32, name + 18
            elif _key_at(text, name, end, b"reasoning", 9):
                key, after = 64, name + 10
        if key == 0 or seen & key:
            continue
        seen |= key
        value = _value_start(text, after, end)
        if value < 0:
            return -1
        if key == 4 or key == 8:  # finish_reason, usage: absent or null, else decoded
            if not (value + 4 <= end and memcmp(text + value, b"null", 4) == 0):  # noqa: F821
                return -1
        elif text[value] == 0x22:  # a string: output unless empty
            if not (value + 1 < end and text[value + 1] == 0x22):
                output = 1
                if string_at != cython.NULL and string_at[0] < 0:
                    string_at[0] = value
        elif not (value + 4 <= end and memcmp(text + value, b"null", 4) == 0):  # noqa: F821
            return -1
    if not seen & 1:
        return -1  # no "choices"
    return output


def _key_at(text, name: int, end: int, key: bytes, size: int) -> bool:
    """Compiled only: ``text[name:]`` is ``key`` and its closing quote."""
    # the closing quote first: most quotes here start a value, or a key of another length
    return name + size < end and text[name + size] == 0x22 and memcmp(text + name, key, size) == 0  # noqa: F821


def _is_key_name(text, start: int, size: int) -> bool:
    """Compiled only: are the ``size`` bytes at ``start`` one of the names
    :func:`_classify_at` looks for?"""
    if size == 7:
        return memcmp(text + start, b"choices", 7) == 0 or memcmp(text + start, b"content", 7) == 0  # noqa: F821
    if size == 5:
        return (
            memcmp(text + start, b"usage", 5) == 0 or memcmp(text + start, b"error", 5) == 0  # noqa: F821
            or memcmp(text + start, b"index", 5) == 0  # noqa: F821
        )
    if size == 4:
        return memcmp(text + start, b"text", 4) == 0  # noqa: F821
    if size == 9:
        return memcmp(text + start, b"reasoning", 9) == 0  # noqa: F821
    if size == 10:
        return memcmp(text + start, b"tool_calls", 10) == 0  # noqa: F821
    if size == 13:
        return memcmp(text + start, b"finish_reason", 13) == 0  # noqa: F821
    if size == 17:
        return memcmp(text + start, b"reasoning_content", 17) == 0  # noqa: F821
    return False


def _value_start(text, pos: int, end: int) -> int:
    """Compiled only: as :func:`_value_at` once its key ends at ``pos``: where the value
    starts after blanks, a colon and blanks, or -2."""
    while pos < end and text[pos] == 0x20:
        pos += 1
    if pos >= end or text[pos] != 0x3A:
        return -2
    pos += 1
    while pos < end and text[pos] == 0x20:
        pos += 1
    return pos if pos < end else -2


def _responses_delta(event: str, data: bytes) -> bool:
    """A Responses API ``*.delta`` event (output, nothing else to read), by name or type."""
    if event:
        return event.endswith(".delta")
    pos = _value_at(data, b'"type"')
    if pos < 0 or data[pos] != 0x22:
        return False
    end = data.find(b'"', pos + 1)
    return end > 0 and data[end - 6 : end] == b".delta"


#: Anthropic events with nothing the facts keep (their bytes are not decoded).
_ANTHROPIC_SKIP = frozenset({"ping", "content_block_start", "content_block_stop", "message_stop"})


def _anthropic_plain_event(event: str, data: bytes) -> int:
    """An Anthropic stream event read from its name (or its bytes when unnamed): 1 a
    ``content_block_delta`` (output), 0 nothing to read, -1 decode it (``message_start``,
    ``message_delta``, ``error``, anything else)."""
    if not event:
        pos = _value_at(data, b'"type"')
        if pos < 0 or data[pos] != 0x22:
            return -1
        end = data.find(b'"', pos + 1)
        if end < 0:
            return -1
        event = data[pos + 1 : end].decode("ascii", "replace")
    if event == "content_block_delta":
        return 1
    if event in _ANTHROPIC_SKIP:
        return 0
    return -1


def _tgi_plain_event(data: bytes) -> int:
    """A TGI stream event read from its bytes alone: 1 a token event (output), 0 a special
    token's event (not output), -1 decode it (the last event carries ``generated_text``
    and ``details``; an error event; anything else)."""
    if data[:1] != b"{" or data.find(b'"error') >= 0:
        return -1
    if not _absent_or_null(data, b'"generated_text"') or not _absent_or_null(data, b'"details"'):
        return -1
    if _value_at(data, b'"token"') < 0 or data.find(b'"token"', data.find(b'"token"') + 7) >= 0:
        return -1
    pos = _value_at(data, b'"special"')
    if pos == -2:
        return -1
    if pos >= 0 and data.startswith(b"true", pos):
        return 0
    return 1


def _json_head(data: bytes | bytearray, length: int) -> dict | None:
    """The JSON object that starts a v2 inference body: its first ``length`` bytes when
    the header told it, else its first JSON value (raw tensor bytes may follow)."""
    if 0 <= length <= len(data):
        return _loads(bytes(data[:length]))
    if length > len(data):
        return None  # the head is longer than what was kept: nothing trustworthy
    text = bytes(data).decode("utf-8", "replace")
    try:
        value = _DECODER.raw_decode(text)[0]
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _first_object(data: bytes) -> dict | None:
    """The first item of a JSON list, when it is an object (TGI's ``POST /`` answer)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return value[0]
    return None


def _ollama_plain_line(line: bytes) -> int:
    """An Ollama stream line read from its bytes alone: 1 output, 0 not, -1 decode it
    (the last line, ``done`` true, carries the counts and the reason)."""
    if line[:1] != b"{":
        return -1
    pos = _value_at(line, b'"done"')
    if pos < 0 or not line.startswith(b"false", pos):
        return -1
    if line.find(b'"eval_count"') >= 0 or line.find(b'"tool_calls"') >= 0 or line.find(b'"error"') >= 0:
        return -1
    output = 0
    for key in (b'"content"', b'"response"', b'"thinking"'):
        found = _nonempty_string(line, key)
        if found < 0:
            return -1
        if found:
            output = 1
    return output


def _keep(head: bytearray, tail: bytes, data: bytes, limit: int) -> tuple[bytearray, bytes]:
    """Append ``data`` to a body kept as its first ``limit`` bytes plus its last TAIL_LIMIT bytes."""
    room = limit - len(head)
    if room > 0:
        head += data[:room]
        data = data[room:]
    if data:
        tail = (tail + data)[-TAIL_LIMIT:] if len(data) < TAIL_LIMIT else data[-TAIL_LIMIT:]
    return head, tail


def _loads(data: bytes) -> dict | None:
    """A JSON object, or None (anything else, or not JSON). What ``json.loads`` does with
    bytes that start with ``{`` (then UTF-8, as its encoding detection finds), without
    its Python-level steps around the decoder (a third of the time for a stream chunk):
    the same decoder, the same errors, nothing but JSON whitespace after the value."""
    try:
        if data[:1] == b"{" and len(data) > 1 and data[1] != 0:
            text = data.decode("utf-8", "surrogatepass")
            obj, end = _DECODER.raw_decode(text)
            if end != len(text) and text[end:].strip(" \t\n\r"):
                return None  # json.loads: "Extra data"
        else:
            obj = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _scan(text: str, key: str, last: bool) -> Any:
    """The value after ``"key":`` in a JSON fragment (first or last occurrence not in a string)."""
    needle = f'"{key}"'
    index = text.rfind(needle) if last else text.find(needle)
    attempts = 0
    while index >= 0 and attempts < _MAX_SCAN_ATTEMPTS:
        attempts += 1
        if index == 0 or text[index - 1] != "\\":
            pos = index + len(needle)
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            if pos < len(text) and text[pos] == ":":
                pos += 1
                while pos < len(text) and text[pos] in " \t\r\n":
                    pos += 1
                try:
                    return _DECODER.raw_decode(text, pos)[0]
                except (ValueError, RecursionError):
                    pass
        index = text.rfind(needle, 0, index) if last else text.find(needle, index + 1)
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
        return number if number == number and abs(number) != float("inf") else None
    return None


def _text_of(content: Any) -> str:
    """Text of a message content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return "" if content is None else json.dumps(content, default=str)[:1024]
