"""LLM API calls on HTTP/1 and HTTP/2: the GenAI facts of an exchange, and how they show on its span.

The HTTP exchange is still the span (its HTTP attributes stay); when the
exchange is an LLM call (recognised by path and body by one of the API modules
of :mod:`protocols.genai.apis`: OpenAI-compatible, Anthropic, Ollama, Gemini,
Bedrock, ...), the span is also a GenAI span by the
GenAI semantic conventions: named ``{gen_ai.operation.name}
{gen_ai.request.model}``, with ``gen_ai.*`` attributes, on both sides (the
client's CLIENT span and the server's SERVER span).

How it plugs in (:func:`attach`, called where pipelines are built:
``otelbpf.assembly.build_pipeline``, which ``otelbpf run``, ``demo`` and ``replay`` use):

* :class:`GenAiLayer` observes HTTP/1 progress (``Pipeline.observe_progress``:
  request body chunks, the response head, response body chunks, each with
  its time). An exchange whose request path is an LLM endpoint gets an
  :class:`~protocols.genai.LlmCall` (bounded state: see protocols/genai/llm.py);
  every other exchange costs one string test per progress event and nothing
  is kept for it.
* When the exchange ends, the HTTP/1 span semantics asks the layer
  (:meth:`GenAiLayer.annotate`), which takes the call's facts (dropping its
  state) and adds the GenAI name and attributes. The GenAI metric
  instruments (otelbpf/metrics/genai.py, registered under ``http1``) select
  spans that carry ``gen_ai.operation.name``.

State is per exchange, keyed by the exchange object (held, so its id cannot
be reused), dropped when its span is built; at most ``max_calls`` calls are
tracked at once (the oldest is dropped beyond, counted in
``otelbpf.genai.calls.evicted``).

``gen_ai.provider.name``: the well-known value for a known API host (the
``Host`` header, else the peer), e.g. ``openai`` for ``api.openai.com``;
otherwise the API's own (``LlmApi.provider``: ``openai_compatible`` for the
OpenAI wire format served by anything else, ``ollama``, ``anthropic``,
``gcp.gemini``, ``aws.bedrock``, ...; see otelbpf/semconv.py). The operation is
the facts' (the API's, refined by the body where it says so). Nothing here names
an API: what differs between them is in their modules (protocols/genai/apis/).

Private by default: prompt and completion text only with
``SpanOptions.capture_genai_content`` (``--capture-genai-content``),
truncated; no header but ``Host``/``User-Agent`` and those an API asks for
(``LlmApi.request_headers``/``response_headers``: the v2 protocol's
``Inference-Header-Content-Length``, Bedrock's ``x-amzn-RequestId``) is ever read,
so ``Authorization`` and API keys are never exported.
"""

from __future__ import annotations

import json

from otelbpf import semconv as sc
from otelbpf.core.identity import SpanStart
from otelbpf.core.model import AttributeValue
from protocols.base import ExchangeProgress, Phase
from protocols.genai.apis import ROUTES
from protocols.genai.chunks import SseTap
from protocols.genai.facts import LlmFacts
from protocols.genai.llm import LlmCall
from protocols.genai.routes import Routes  # genai.pxd types the table: its match() is a C call
from protocols.http1.types import HttpExchange

#: The LLM APIs' routes (protocols/genai/apis/): which request paths are LLM calls.
_ROUTES: Routes = ROUTES
#: LLM calls tracked at once (their state is bounded each: protocols/genai/llm.py).
MAX_CALLS = 1024
#: Usage remembered per call for the other end's span (peer fill), forgotten all at once when full.
MAX_PEER_USAGE = 4096

#: API hosts (exact, or a suffix when it starts with a dot) -> well-known provider.
_PROVIDER_HOSTS: tuple[tuple[str, str], ...] = (
    ("api.openai.com", sc.GEN_AI_PROVIDER_OPENAI),
    (".openai.azure.com", sc.GEN_AI_PROVIDER_AZURE_OPENAI),
    ("api.anthropic.com", sc.GEN_AI_PROVIDER_ANTHROPIC),
    ("api.deepseek.com", sc.GEN_AI_PROVIDER_DEEPSEEK),
    ("api.groq.com", sc.GEN_AI_PROVIDER_GROQ),
    ("api.mistral.ai", sc.GEN_AI_PROVIDER_MISTRAL_AI),
    ("api.moonshot.ai", sc.GEN_AI_PROVIDER_MOONSHOT_AI),
    ("api.moonshot.cn", sc.GEN_AI_PROVIDER_MOONSHOT_AI),
    ("api.perplexity.ai", sc.GEN_AI_PROVIDER_PERPLEXITY),
    ("api.x.ai", sc.GEN_AI_PROVIDER_X_AI),
    ("generativelanguage.googleapis.com", sc.GEN_AI_PROVIDER_GCP_GEMINI),
    ("aiplatform.googleapis.com", sc.GEN_AI_PROVIDER_GCP_VERTEX_AI),
)


def provider_name(host: str, api) -> str:
    """``gen_ai.provider.name`` for a call to ``host`` in ``api``'s format (an
    :class:`~protocols.genai.api.LlmApi`): a known API host's well-known value, else the API's."""
    host = host.lower().rstrip(".")
    for known, provider in _PROVIDER_HOSTS:
        if host == known or (known[0] == "." and host.endswith(known)) or host.endswith("." + known):
            return provider
    return api.provider


class GenAiLayer:
    """Per-pipeline GenAI state: a progress observer for HTTP/1 and the span annotator."""

    def __init__(self, capture_content: bool = False, counters=None, max_calls: int = MAX_CALLS) -> None:
        self.capture_content = capture_content
        self.counters = counters
        self.max_calls = max_calls
        #: id(exchange) -> (exchange, its call): LLM exchanges in flight.
        self._calls: dict[int, tuple[object, LlmCall]] = {}
        self.evicted = 0
        #: (response id, model) -> (input tokens, output tokens, finish reasons) of calls whose
        #: span had usage: the other end of the same call (both traced) takes them when its
        #: own bytes lost them (peer fill, ``otelbpf.genai.usage.source = peer``).
        self._peer_usage: dict[tuple[str, str], tuple] = {}
        self.peer_filled = 0
        #: Let the HTTP/1 parser hand an SSE response's chunks to its call directly
        #: (LlmCall.stream_tap: no progress event per chunk). Off: every chunk comes as a
        #: progress event (the same facts; tests/test_genai_tap.py compares the two).
        self.body_taps = True
        #: The pipeline's observers of HTTP/1 progress (attach): a tap hides chunks from
        #: them all, so there is none unless this layer's is the only one.
        self.http1_observers: list | None = None

    def __len__(self) -> int:
        return len(self._calls)

    # -- progress (the pipeline's thread, per body chunk) -----------------------

    def wants(self, exchange) -> bool | SseTap:
        """HTTP/1's progress filter: :func:`is_llm_call`, and for a call whose response may
        be an SSE stream the HTTP/1 parser reads in place (OpenAI-style chat and text
        completions), a tap for that response (an SseTap, true), which the parser hands
        the response's body to from its first byte (protocols/http1/stitch.py)."""
        line = request_line(exchange)
        if line is None:
            return False
        routes = _ROUTES
        endpoint = routes.match(line[0], line[1])
        if endpoint is None:
            return False
        if not self.body_taps or not endpoint.tap or type(exchange) is not HttpExchange or not self._sole_observer():
            return True
        return SseTap(None, True, False, self, exchange)

    def _sole_observer(self) -> bool:
        """Is this layer the pipeline's only observer of HTTP/1 progress? A tap hides the
        body pieces it reads from every observer, so taps are used only then."""
        observers = self.http1_observers
        return observers is None or (len(observers) == 1 and observers[0] == self.observe)

    def call_for(self, exchange):
        """The call of ``exchange`` (made now if it has none yet), or None if it is not an LLM call."""
        entry = self._calls.get(id(exchange))
        if entry is None or entry[0] is not exchange:
            entry = self._new_call(exchange)
            if entry is None:
                return None
        return entry[1]

    def observe(self, start: SpanStart, progress: ExchangeProgress) -> None:
        exchange = progress.exchange
        entry = self._calls.get(id(exchange))
        if entry is None or entry[0] is not exchange:
            entry = self._new_call(exchange)
            if entry is None:
                return  # not an LLM call: nothing kept
        call = entry[1]
        phase = progress.phase
        if phase == Phase.RESPONSE_BODY:
            call.response_body(progress.ts_ns, progress.data)
            if self.body_taps and type(exchange) is HttpExchange and type(call) is LlmCall:
                self._tap(exchange, call)
        elif phase == Phase.REQUEST_BODY:
            call.request_body(progress.data)
        elif phase == Phase.RESPONSE_START:
            response = getattr(exchange, "response", None)
            call.response_start(response.header("content-type") if response is not None else None)
            for name in call.endpoint.api.response_headers:
                call.header(True, name, _header(response, name))
            if self.body_taps and type(exchange) is HttpExchange and type(call) is LlmCall:
                self._tap(exchange, call)

    def _new_call(self, exchange) -> tuple | None:
        """A new call's entry for ``exchange``, or None if it is not an LLM call."""
        line = request_line(exchange)
        if line is None:
            return None
        routes = _ROUTES
        endpoint = routes.match(line[0], line[1])
        if endpoint is None:
            return None  # not an LLM call: nothing kept
        api = endpoint.api
        call = api.new_call(endpoint, self.capture_content)
        entry = (exchange, call)
        for name in api.request_headers:  # what the API reads of the request's head
            call.header(False, name, _header(getattr(exchange, "request", None), name))
        if len(self._calls) >= self.max_calls:
            evicted = self._calls.pop(next(iter(self._calls)))[1]
            if type(evicted) is LlmCall:
                evicted.drop_tap()  # its response's parser stops handing it chunks
            self.evicted += 1
            if self.counters is not None:
                self.counters.add("otelbpf.genai.calls.evicted")
        self._calls[id(exchange)] = entry
        return entry

    def _tap(self, exchange: HttpExchange, call: LlmCall) -> None:
        """An HTTP/1 SSE response: the parser hands its chunks to the call directly from
        now on (LlmCall.stream_tap, protocols/http1/parse.py's BodyTap), instead of a
        progress event per chunk. Tried at the response's head and again after a piece
        the tap could not read."""
        http1 = exchange
        response = http1.response
        if response is None or response.body_tap is not None or not self._sole_observer():
            return
        response.body_tap = call.stream_tap()

    # -- span (when the exchange ends) -------------------------------------------

    def take(self, exchange) -> LlmFacts | None:
        """The exchange's LLM facts (its state is dropped), or None if it is not an LLM call."""
        entry = self._calls.pop(id(exchange), None)
        if entry is None or entry[0] is not exchange:
            return None
        call = entry[1]
        facts = call.finish()
        if call.parse_errors and self.counters is not None:
            self.counters.add("otelbpf.parse.errors", call.parse_errors, label="genai")  # not the API's framing
        return facts

    def annotate(self, exchange, attrs: dict[str, AttributeValue]) -> str | None:
        """Add the GenAI attributes of ``exchange`` to its span's ``attrs`` (HTTP
        attributes already there) and return the span name, or None when the
        exchange is not an LLM call."""
        if not self._calls:
            return None
        facts = self.take(exchange)
        if facts is None:
            return None
        if facts.response_id is not None:
            self._peer_fill(facts)
        return genai_attributes(facts, exchange.start_ns, attrs)

    def _peer_fill(self, facts: LlmFacts) -> None:
        """Share usage between the two ends of one call, matched by response id and model:
        a side whose bytes held it remembers it; a side whose bytes lost it (a capture
        gap) takes it. The side that lost it usually ends last (the client reads what the
        server wrote), so the one with it has been seen by then."""
        key = (facts.response_id, facts.request_model or facts.response_model or "")
        table = self._peer_usage
        if facts.input_tokens is not None or facts.output_tokens is not None:
            if len(table) >= MAX_PEER_USAGE:
                table.clear()
            table[key] = (facts.input_tokens, facts.output_tokens, facts.finish_reasons,
                          facts.cache_read_input_tokens, facts.cache_creation_input_tokens)
            return
        known = table.pop(key, None)
        if known is None:
            return
        facts.input_tokens, facts.output_tokens = known[0], known[1]
        facts.cache_read_input_tokens, facts.cache_creation_input_tokens = known[3], known[4]
        if not facts.finish_reasons:
            facts.finish_reasons = known[2]
        facts.usage_source = "peer"
        self.peer_filled += 1
        if self.counters is not None:
            self.counters.add("otelbpf.genai.usage.peer_filled")


def genai_attributes(facts: LlmFacts, start_ns: int, attrs: dict[str, AttributeValue]) -> str:
    """Write ``facts`` as GenAI attributes into ``attrs``; return the span name."""
    operation = facts.operation
    attrs[sc.GEN_AI_OPERATION_NAME] = operation
    host = attrs.get(sc.SERVER_ADDRESS) or ""
    attrs[sc.GEN_AI_PROVIDER_NAME] = provider_name(str(host), facts.endpoint.api)
    if facts.request_model is not None:
        attrs[sc.GEN_AI_REQUEST_MODEL] = facts.request_model
    if facts.max_tokens is not None:
        attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = facts.max_tokens
    if facts.temperature is not None:
        attrs[sc.GEN_AI_REQUEST_TEMPERATURE] = facts.temperature
    if facts.top_p is not None:
        attrs[sc.GEN_AI_REQUEST_TOP_P] = facts.top_p
    if facts.stream is not None:
        attrs[sc.GEN_AI_REQUEST_STREAM] = facts.stream
    if facts.response_id is not None:
        attrs[sc.GEN_AI_RESPONSE_ID] = facts.response_id
    if facts.response_model is not None:
        attrs[sc.GEN_AI_RESPONSE_MODEL] = facts.response_model
    if facts.finish_reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = list(facts.finish_reasons)
    if facts.input_tokens is not None:
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = facts.input_tokens
    if facts.output_tokens is not None:
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = facts.output_tokens
    if facts.cache_read_input_tokens is not None:
        attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = facts.cache_read_input_tokens
    if facts.cache_creation_input_tokens is not None:
        attrs[sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] = facts.cache_creation_input_tokens
    if facts.documents is not None:
        attrs[sc.OTELBPF_GEN_AI_REQUEST_DOCUMENTS] = facts.documents
    if facts.top_n is not None:
        attrs[sc.OTELBPF_GEN_AI_REQUEST_TOP_N] = facts.top_n
    if facts.results is not None:
        attrs[sc.OTELBPF_GEN_AI_RESPONSE_RESULTS] = facts.results
    if facts.model_version is not None:
        attrs[sc.OTELBPF_GEN_AI_REQUEST_MODEL_VERSION] = facts.model_version
    if facts.inputs is not None:
        attrs[sc.OTELBPF_GEN_AI_REQUEST_INPUTS] = facts.inputs
    if facts.outputs is not None:
        attrs[sc.OTELBPF_GEN_AI_RESPONSE_OUTPUTS] = facts.outputs
    if facts.streamed and facts.chunks:
        attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = max(facts.first_chunk_ns - start_ns, 0) / 1e9
        attrs[sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS] = facts.chunks
        if facts.chunks > 1:
            per_chunk = (facts.last_chunk_ns - facts.first_chunk_ns) / (facts.chunks - 1) / 1e9
            attrs[sc.OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK] = max(per_chunk, 0.0)
    if facts.input_messages is not None:
        attrs[sc.GEN_AI_INPUT_MESSAGES] = json.dumps(
            [{"role": role, "parts": [{"type": "text", "content": text}]} for role, text in facts.input_messages],
            ensure_ascii=False,
        )
    if facts.output_text is not None:
        message: dict = {"role": "assistant", "parts": [{"type": "text", "content": facts.output_text}]}
        if facts.finish_reasons:
            message["finish_reason"] = facts.finish_reasons[0]
        attrs[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps([message], ensure_ascii=False)
    if facts.content_truncated:
        attrs[sc.OTELBPF_GEN_AI_CONTENT_TRUNCATED] = True
    if facts.gaps:
        attrs[sc.OTELBPF_GEN_AI_RESPONSE_GAPS] = facts.gaps
    if facts.usage_source:
        attrs[sc.OTELBPF_GENAI_USAGE_SOURCE] = facts.usage_source
    model = facts.request_model or facts.response_model
    return f"{operation} {model}" if model else operation


def _header(message, name: str) -> str | None:
    """A header of an HTTP/1 or HTTP/2 message (None: no message, or no such header)."""
    header = getattr(message, "header", None)
    return header(name) if header is not None else None


def request_line(exchange) -> tuple[str, str] | None:
    """(method, request-target) of an HTTP/1 or HTTP/2 exchange, None for other protocols.

    HTTP/2 carries them as the ``:method`` and ``:path`` pseudo-headers ("" where
    HPACK could not decode them: such a stream is not recognised as an LLM call)."""
    if type(exchange) is HttpExchange:  # HTTP/1, most exchanges: typed reads when compiled (genai.pxd)
        http1 = exchange
        request1 = http1.request
        return None if request1 is None else (request1.method, request1.target)
    request = getattr(exchange, "request", None)
    if request is None:
        return None
    if exchange.protocol == "http2":  # first: a getattr that fails raises, per stream
        return request.header(":method") or "", request.header(":path") or ""
    method = getattr(request, "method", None)
    if method is not None:
        return method, request.target
    header = getattr(request, "header", None)
    if header is None:
        return None
    return header(":method") or "", header(":path") or ""


def is_llm_call(exchange) -> bool:
    """Is ``exchange`` (its request head just parsed) a call to an LLM endpoint?
    Asked once per exchange, so other HTTP traffic reports no progress at all."""
    line = request_line(exchange)
    if line is None:
        return False
    routes = _ROUTES
    return routes.match(line[0], line[1]) is not None


#: The protocols LLM API calls travel on: their semantics take a GenAI layer.
CARRIERS = ("http1", "http2")


def attach(pipeline) -> GenAiLayer | None:
    """Give ``pipeline`` GenAI spans: observe the progress of HTTP/1 and HTTP/2
    exchanges that call an LLM endpoint and annotate their spans.

    Returns the layer, or None when the pipeline's registry has no carrier
    semantics that accepts one (a ``genai`` attribute). Each registry's
    semantics must be its own instances (``default_registry()`` makes them
    per registry), since the layer is per pipeline.
    """
    carriers = []
    for protocol in CARRIERS:
        semantics = pipeline.registry.semantics(protocol)
        if semantics is not None and hasattr(semantics, "genai"):
            carriers.append((protocol, semantics))
    if not carriers:
        return None
    existing = carriers[0][1].genai
    if existing is not None and existing.observe in pipeline.progress_observers.get(carriers[0][0], ()):
        return existing  # attached already
    layer = GenAiLayer(pipeline.options.capture_genai_content, pipeline.counters)
    for protocol, semantics in carriers:
        semantics.genai = layer
        # HTTP/1: the layer's filter, which also gives an SSE response's parser its tap
        pipeline.observe_progress(protocol, layer.observe, wants=layer.wants if protocol == "http1" else is_llm_call)
    layer.http1_observers = pipeline.progress_observers.get("http1")
    return layer
