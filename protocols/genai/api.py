"""The interface every LLM API family implements: :class:`LlmApi`.

An API family (OpenAI's chat/completions/embeddings, Anthropic's Messages, Gemini, Bedrock,
...) is one module in protocols/genai/apis/ holding one ``API`` object, a subclass of
:class:`LlmApi`, registered with one line in ``protocols/genai/apis/__init__.py``
(:func:`~protocols.genai.apis.default_routes`). The object says:

* **which requests it claims** (:meth:`LlmApi.routes`): exact paths, or a key on the
  path's last segment with a check of the whole path (routing stays a dict lookup per
  request: protocols/genai/routes.py);
* **request facts** (:meth:`LlmApi.request_facts`, :meth:`LlmApi.request_stream`,
  :meth:`LlmApi.input_messages`): model, parameters, stream flag, prompt text;
* **response facts** (:meth:`LlmApi.response`, :meth:`LlmApi.scanned_response`): ids,
  models, finish reasons, usage of a non-streamed answer;
* **stream events** (:attr:`LlmApi.plain_event`, :meth:`LlmApi.event`,
  :meth:`LlmApi.truncated_event`): what one event of its stream means (an output chunk,
  usage, a finish reason), and how its stream is framed when that is not SSE or NDJSON
  (:meth:`LlmApi.stream_framing`: a framing object, e.g. Gemini's JSON array or AWS's
  binary event stream);
* **acceptance** (:meth:`LlmApi.is_call`): whether what was seen is this API's call at all.

The per-call state (:class:`~protocols.genai.llm.LlmCall`, compiled: it runs per chunk)
holds the bytes, frames the stream and calls these hooks; the hooks write into the call's
:class:`~protocols.genai.facts.LlmFacts` (``call.facts``) through the call's few helpers
(``chunk``, ``finish_reason``, ``capture_output``). The hooks run once per call, or once
per decoded stream event: plain Python. A stream whose events are mostly output can name
a byte classifier from protocols/genai/chunks.py (compiled) as :attr:`LlmApi.plain_event`
so that those events are counted without being decoded.

The defaults here are the OpenAI wire format's (the most common shape): an API overrides
what differs. Nothing here raises on what a traced program sends: the call catches and
counts (``LlmCall.errors``) anything a hook raises, and a malformed body gives fewer facts.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

from protocols.genai.facts import Endpoint, LlmFacts
from protocols.genai.jsonutil import HEAD_KEYS, TAIL_KEYS, count, first_object, loads, number, scan_keys, scan_object, text_of
from protocols.genai.llm import JSON, MAX_CHOICES, SSE, LlmCall
from protocols.genai.sse import SseEvent

#: Keys read from a request body too long to parse (or cut by the capture): scanned.
REQUEST_KEYS: tuple[str, ...] = (
    "model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "temperature", "top_p", "options",
    "top_n", "parameters",
)  # fmt: skip

#: A route claim: a function of the request path (query stripped, no trailing slash)
#: that returns the call's Endpoint, or None when the path is not the API's.
Claim = Callable[[str], "Endpoint | None"]


class StreamFraming(Protocol):
    """A response body framing other than SSE and NDJSON (:meth:`LlmApi.stream_framing`):
    fed the body's bytes in order, it returns the events they complete, as
    :class:`~protocols.genai.sse.SseEvent` (``event``: the event's name, "" for none;
    ``data``: its payload; ``truncated``/``tail`` when a payload was cut by its bounds).
    Bounded, never raises; ``gap`` says bytes were lost here (it resumes where it can
    trust the bytes again); ``errors`` counts bytes it could not frame (a bad checksum,
    a malformed prelude), reported as ``otelbpf.parse.errors``."""

    errors: int

    @property
    def buffered(self) -> int: ...

    def feed(self, data: bytes) -> list[SseEvent]: ...

    def gap(self) -> None: ...


def openai_style(path: str) -> bool:
    """Is ``path`` under an OpenAI-style prefix (``/v1/`` anywhere, or Azure's ``/openai/...``)?
    The OpenAI wire format's suffixes are recognised only there (so some other
    application's ``/foo/completions`` is not a call)."""
    return "/v1/" in path or path.startswith("/openai/")


def suffix_claim(suffix: str, endpoint: Endpoint) -> Claim:
    """A claim of the paths that end with ``suffix`` under an OpenAI-style prefix."""

    def claim(path: str) -> Endpoint | None:
        return endpoint if path.endswith(suffix) and openai_style(path) else None

    claim.__name__ = f"claim{suffix.replace('/', '_')}"
    return claim


def last_segment(suffix: str) -> str:
    """The routing key of paths ending with ``suffix``: their last segment."""
    return suffix[suffix.rfind("/") + 1 :]


class LlmApi:
    """One LLM API family: how its calls are recognised and read (see the module's doc)."""

    #: Short id of the family (docs, tests; unique among registered APIs).
    name: str = ""
    #: ``gen_ai.provider.name`` when the request's host is no known API host
    #: (otelbpf/semantics/genai.py; a value of otelbpf/semconv.py, tests check).
    provider: str = ""
    #: The ``gen_ai.operation.name`` values its calls may get (otelbpf/semconv.py's, tests check).
    operations: tuple[str, ...] = ()
    #: The byte classifier of its stream events (protocols/genai/chunks.py, compiled), or
    #: None: every event is decoded. ``(event name, data) -> 1 output, 0 nothing, -1 decode``.
    plain_event: Callable[[str, bytes], int] | None = None
    #: Its SSE events are OpenAI-style unnamed JSON chunks that the HTTP/1 parser's tap
    #: (protocols/genai/chunks.py's SseTap) may read in place.
    sse_tap: bool = False
    #: Headers the call reads (lower-case names; given to :meth:`header`). None but these
    #: (and Host / User-Agent) is ever read: an API key never is.
    request_headers: tuple[str, ...] = ()
    response_headers: tuple[str, ...] = ()
    #: Keys scanned from a request body too long to parse.
    request_keys: tuple[str, ...] = REQUEST_KEYS
    #: Keys scanned from an oversized response's head (ids, models) and tail (usage).
    head_keys: tuple[str, ...] = HEAD_KEYS
    tail_keys: tuple[str, ...] = TAIL_KEYS
    #: A non-streamed answer may be a JSON list, read from its first item (TGI's ``POST /``).
    list_response: bool = False
    #: Request keys whose value is prompt text (content capture).
    prompt_keys: tuple[str, ...] = ("prompt", "input")

    def __repr__(self) -> str:
        return f"<LlmApi {self.name}>"

    # -- routing (once, at registration) ------------------------------------------------

    def routes(self) -> Iterable[tuple[str, Endpoint | Claim]]:
        """What it claims: ``(path, Endpoint)`` for an exact path (``"/api/chat"``), and
        ``(key, claim)`` for paths whose last segment is ``key`` (``"completions"``; or the
        segment's ``:method`` part, ``":generateContent"``), the claim checking the whole
        path. Routes of one key are tried in registration order."""
        return ()

    # -- a call ---------------------------------------------------------------------------

    def new_call(self, endpoint: Endpoint, capture_content: bool):
        """The per-call state for a call to ``endpoint`` (an :class:`LlmCall`, fed the
        exchange's bodies; an API whose bytes are not HTTP bodies of JSON has its own)."""
        return LlmCall(endpoint, capture_content)

    def header(self, call: LlmCall, response: bool, name: str, value: str | None) -> None:
        """A header of :attr:`request_headers` / :attr:`response_headers` (None: absent)."""

    # -- the request ----------------------------------------------------------------------

    def parse_request(self, call: LlmCall) -> dict:
        """The request's top-level fields: parsed whole when it fits and nothing was lost,
        else scanned from its kept head and tail (``"\\0truncated"`` set); {} when it is
        not a JSON object (then it is no call)."""
        head = call.req_head
        if head.lstrip()[:1] != b"{":
            return {}  # not a JSON object: not an LLM call
        if call.req_size <= call.request_limit and not call.req_gap:
            parsed = call.decode(bytes(head))
            if parsed is not None:
                return parsed
        # Over the limit, or not parsable as a whole (bytes the capture did not copy): best effort.
        out = scan_keys(head, call.req_tail, self.request_keys)
        out["\0truncated"] = True
        return out

    def request_facts(self, call: LlmCall, request: dict, facts: LlmFacts) -> None:
        """Model and parameters of the request (the OpenAI format's keys)."""
        request_model(request, facts)
        sampling(request, facts)
        facts.max_tokens = count(request.get("max_completion_tokens"))
        if facts.max_tokens is None:
            facts.max_tokens = count(request.get("max_tokens"))

    def request_stream(self, call: LlmCall, request: dict) -> bool | None:
        """``gen_ai.request.stream``: the body's ``stream``, else false (None for embeddings)."""
        stream = request.get("stream")
        if isinstance(stream, bool):
            return stream
        return None if call.endpoint.operation == "embeddings" else False

    def input_messages(self, call: LlmCall, request: dict) -> list[tuple[str, str]]:
        """(role, text) of the request's input (content capture; the call bounds them)."""
        messages: list[tuple[str, str]] = []
        raw = request.get("messages")
        if isinstance(raw, list):
            for message in raw:
                if isinstance(message, dict):
                    role = message.get("role")
                    messages.append((role if isinstance(role, str) else "user", text_of(message.get("content"))))
        for key in ("instructions", "system"):
            if isinstance(request.get(key), str):
                messages.insert(0, ("system", request[key]))
            elif key == "system" and isinstance(request.get(key), list):  # Anthropic's system blocks
                messages.insert(0, ("system", text_of(request[key])))
        for key in self.prompt_keys:
            value = request.get(key)
            if value is not None and not isinstance(value, dict):
                if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                    for item in value:  # Responses API input items
                        role = item.get("role")
                        messages.append((role if isinstance(role, str) else "user", text_of(item.get("content"))))
                else:
                    messages.append(("user", text_of(value)))
        return messages

    # -- the response ---------------------------------------------------------------------

    def stream_framing(self, call: LlmCall, content_type: str) -> StreamFraming | None:
        """A framing of its own for a response of ``content_type`` (lower case, no
        parameters), or None: ``text/event-stream`` is SSE, NDJSON types are lines,
        anything else one JSON body."""
        return None

    def sniff(self, call: LlmCall, first: bytes) -> int | StreamFraming:
        """How to read a response that said no content type, from its first byte (not an
        SSE field's): a mode of protocols/genai/llm.py (JSON, NDJSON) or a framing."""
        return JSON

    def read_response(self, call: LlmCall, head: bytearray, tail: bytes, whole: bool) -> None:
        """A non-streamed JSON answer, kept as its ``head`` and ``tail`` (``whole``: the head
        is all of it): parsed whole (:meth:`response`) or read from its ends
        (:meth:`scanned_response`)."""
        first = head.lstrip()[:1]
        if first != b"{" and (first != b"[" or not self.list_response):
            return
        if whole:
            obj = loads(bytes(head)) if first == b"{" else first_object(bytes(head))
            if obj is not None:
                self.response(call, obj)
            return
        self.scanned_response(call, scan_object(head, tail, b"", self.head_keys, self.tail_keys))

    def response(self, call: LlmCall, obj: dict) -> None:
        """A whole non-streamed answer (the OpenAI format: ids, usage, choices)."""
        openai_object(call, obj, streamed=False)

    def scanned_response(self, call: LlmCall, obj: dict) -> None:
        """The fields of :attr:`head_keys` and :attr:`tail_keys` scanned from an answer too
        long to parse (an embeddings response: its usage and model come last)."""
        ids(call, obj)
        openai_usage(call, obj.get("usage"))

    def event(self, call: LlmCall, ts_ns: int, name: str, obj: dict) -> None:
        """A decoded stream event (``name``: its SSE/event-stream name, "" for none): record
        what it carries (``call.chunk(ts_ns)`` when it is output)."""
        if openai_object(call, obj, streamed=True):
            call.chunk(ts_ns)

    def truncated_event(self, call: LlmCall, ts_ns: int, name: str, head: bytes, tail: bytes) -> None:
        """An event too big to keep, known by its first bytes and its ``tail``: output, and
        its ends may still hold ids and usage."""
        call.chunk(ts_ns)
        obj = scan_object(head, tail, b"", self.head_keys, self.tail_keys)
        ids(call, obj)
        openai_usage(call, obj.get("usage"))

    # -- the end --------------------------------------------------------------------------

    def finish(self, call: LlmCall, request: dict, facts: LlmFacts) -> None:
        """Last adjustments once everything was read (before :meth:`is_call`)."""

    def is_call(self, call: LlmCall, request: dict, facts: LlmFacts) -> bool:
        """Was this the API's call? By default: a model was named, in the request or the
        response (Azure's deployments name it in the response only); without one it is
        some other application's ``/api/chat`` or ``/v1/responses``."""
        return facts.request_model is not None or facts.response_model is not None


# -- helpers the API modules share ---------------------------------------------------------


def request_model(request: dict, facts: LlmFacts) -> None:
    """The request body's ``model``."""
    model = request.get("model")
    if isinstance(model, str) and model:
        facts.request_model = model


def sampling(params: Any, facts: LlmFacts) -> None:
    """``temperature`` and ``top_p`` of a parameters object."""
    if isinstance(params, dict):
        facts.temperature = number(params.get("temperature"))
        facts.top_p = number(params.get("top_p"))


def ids(call: LlmCall, obj: dict) -> None:
    """A response's ``id`` (the first one seen) and ``model`` (the last one)."""
    facts = call.facts
    if facts.response_id is None:
        value = obj.get("id")
        if isinstance(value, str) and value:
            facts.response_id = value
    value = obj.get("model")
    if isinstance(value, str) and value:
        facts.response_model = value


def openai_usage(call: LlmCall, usage: Any) -> None:
    """An OpenAI-style ``usage`` (prompt/completion or input/output tokens, cached tokens)."""
    if not isinstance(usage, dict):
        return
    facts = call.facts
    tokens = count(usage.get("prompt_tokens"))
    if tokens is None:
        tokens = count(usage.get("input_tokens"))
    if tokens is not None:
        facts.input_tokens = tokens
    tokens = count(usage.get("completion_tokens"))
    if tokens is None:
        tokens = count(usage.get("output_tokens"))
    if tokens is not None:
        facts.output_tokens = tokens
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    if isinstance(details, dict):
        tokens = count(details.get("cached_tokens"))
        if tokens is not None:
            facts.cache_read_input_tokens = tokens


def openai_object(call: LlmCall, obj: dict, streamed: bool) -> bool:
    """A chat/completions/embeddings response or stream chunk; True if it carries output."""
    ids(call, obj)
    openai_usage(call, obj.get("usage"))
    choices = obj.get("choices")
    output = False
    if isinstance(choices, list):
        for position, choice in enumerate(choices[:MAX_CHOICES]):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) and not isinstance(index, bool) else position
            call.finish_reason(index, choice.get("finish_reason"))
            message = choice.get("delta" if streamed else "message")
            if isinstance(message, dict):
                content = message.get("content")
                if isinstance(content, str) and content:
                    output = True
                    call.capture_output(content)
                if message.get("tool_calls") or message.get("reasoning_content") or message.get("reasoning"):
                    output = True
            text = choice.get("text")
            if isinstance(text, str) and text:
                output = True
                call.capture_output(text)
    return output


__all__ = [
    "REQUEST_KEYS", "SSE", "JSON", "Claim", "Endpoint", "LlmApi", "LlmCall", "LlmFacts", "StreamFraming",
    "ids", "last_segment", "openai_object", "openai_style", "openai_usage", "request_model", "sampling",
    "suffix_claim",
]  # fmt: skip
