"""Google's Gemini API: ``POST .../models/{model}:generateContent``, ``:streamGenerateContent``
(SSE with ``?alt=sse``; without it, one JSON array streamed element by element),
``:embedContent`` and ``:batchEmbedContents``, under ``/v1``, ``/v1beta`` (the Gemini API,
``tunedModels/`` too) and Vertex AI's ``/v1/projects/P/locations/L/publishers/google/models/``.

Operations: ``generate_content`` (the conventions' value for Gemini's multimodal content
generation) and ``embeddings``; provider ``gcp.gemini`` (Vertex AI's host gives
``gcp.vertex_ai``: otelbpf/semantics/genai.py's host table).

Request: the model is the path's (percent-decoded: the body names none);
``generationConfig`` (or ``generation_config``): ``maxOutputTokens`` (max tokens),
``temperature``, ``topP``; ``gen_ai.request.stream`` is the route's. For content capture,
``contents[].parts[].text`` by role and ``systemInstruction``. Response (each stream event
is one too): ``responseId``, ``modelVersion`` (the response model), each candidate's
``finishReason`` (by its ``index``), or the prompt's ``promptFeedback.blockReason`` when it
was refused; ``usageMetadata``: ``promptTokenCount`` (input, cached content included, as
the conventions count it), ``candidatesTokenCount`` plus ``thoughtsTokenCount`` (output:
thinking tokens are output tokens, as OpenAI's reasoning tokens are in its completion
tokens), ``cachedContentTokenCount`` (cache read). A stream event is an output chunk when a
candidate's part has text (thoughts included) or a function call. Every event is decoded
(no byte classifier: a Gemini chunk repeats its usage).
"""

from __future__ import annotations

from urllib.parse import unquote

from protocols.genai.api import Endpoint, LlmApi
from protocols.genai.jsonarray import JsonArrayStream
from protocols.genai.jsonutil import count, number, scan_object, text_of
from protocols.genai.llm import JSON

#: The path's ``:method`` -> (operation, streams).
_METHODS = {
    ":generateContent": ("generate_content", False),
    ":streamGenerateContent": ("generate_content", True),
    ":embedContent": ("embeddings", False),
    ":batchEmbedContents": ("embeddings", False),
}
#: Endpoints by path (a path names its model): bounded, forgotten all at once when full.
_MAX_ENDPOINTS = 1024
_TAIL_KEYS = ("usageMetadata", "modelVersion", "responseId", "finishReason")


class GeminiApi(LlmApi):
    name = "gemini"
    provider = "gcp.gemini"
    operations = ("generate_content", "embeddings")
    request_keys = ("generationConfig", "generation_config")
    head_keys = ()
    tail_keys = _TAIL_KEYS

    def __init__(self) -> None:
        self._endpoints: dict[str, Endpoint] = {}

    def routes(self):
        for method in _METHODS:
            yield method, self._claim

    def _claim(self, path: str) -> Endpoint | None:
        """``.../models/{model}:{method}`` (or ``tunedModels/``) -> its endpoint."""
        endpoint = self._endpoints.get(path)
        if endpoint is not None:
            return endpoint
        prefix, _, last = path.rpartition("/")
        colon = last.rfind(":")
        model = last[:colon]
        if not model or not (prefix.endswith("/models") or prefix.endswith("/tunedModels")):
            return None
        method = last[colon:]
        operation, streams = _METHODS[method]
        if "%" in model:
            model = unquote(model)
        endpoint = Endpoint(self, operation, model, streaming=streams, route=method[1:])
        if len(self._endpoints) >= _MAX_ENDPOINTS:
            self._endpoints.clear()
        self._endpoints[path] = endpoint
        return endpoint

    # -- the request ----------------------------------------------------------------------

    def request_facts(self, call, request, facts):
        facts.request_model = call.endpoint.model
        config = request.get("generationConfig")
        if not isinstance(config, dict):
            config = request.get("generation_config")
        if isinstance(config, dict):
            facts.max_tokens = count(_either(config, "maxOutputTokens", "max_output_tokens"))
            facts.temperature = number(config.get("temperature"))
            facts.top_p = number(_either(config, "topP", "top_p"))

    def request_stream(self, call, request):
        endpoint = call.endpoint
        return None if endpoint.operation == "embeddings" else endpoint.streaming

    def input_messages(self, call, request):
        messages: list[tuple[str, str]] = []
        system = _either(request, "systemInstruction", "system_instruction")
        if isinstance(system, dict):
            messages.append(("system", text_of(system.get("parts"))))
        contents = request.get("contents")
        if isinstance(contents, dict):
            contents = [contents]
        if isinstance(contents, list):
            for content in contents:
                if isinstance(content, dict):
                    role = content.get("role")
                    messages.append(("assistant" if role == "model" else "user", text_of(content.get("parts"))))
        embeds = request.get("requests")  # batchEmbedContents
        single = request.get("content")  # embedContent
        for item in ([{"content": single}] if isinstance(single, dict) else embeds if isinstance(embeds, list) else ()):
            if isinstance(item, dict) and isinstance(item.get("content"), dict):
                messages.append(("user", text_of(item["content"].get("parts"))))
        return messages

    # -- the response ---------------------------------------------------------------------

    def stream_framing(self, call, content_type):
        if call.endpoint.streaming and content_type == "application/json":
            return JsonArrayStream()  # streamGenerateContent without alt=sse
        return None

    def sniff(self, call, first):
        return JsonArrayStream() if first == b"[" and call.endpoint.streaming else JSON

    def response(self, call, obj):
        response_object(call, obj)

    def scanned_response(self, call, obj):
        scanned(call, obj)

    def event(self, call, ts_ns, name, obj):
        if response_object(call, obj):
            call.chunk(ts_ns)

    def truncated_event(self, call, ts_ns, name, head, tail):
        call.chunk(ts_ns)  # an event too big to keep is output; its end holds the usage
        scanned(call, scan_object(head, tail, b"", (), _TAIL_KEYS))


def _either(obj: dict, camel: str, snake: str):
    """A field by its JSON name, else its proto name (the API accepts both)."""
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def response_object(call, obj: dict) -> bool:
    """A GenerateContentResponse (the answer, or one stream event); True if it carries output."""
    facts = call.facts
    value = obj.get("responseId")
    if facts.response_id is None and isinstance(value, str) and value:
        facts.response_id = value
    value = obj.get("modelVersion")
    if isinstance(value, str) and value:
        facts.response_model = value
    usage(call, obj.get("usageMetadata"))
    output = False
    candidates = obj.get("candidates")
    if isinstance(candidates, list):
        for position, candidate in enumerate(candidates[:16]):
            if not isinstance(candidate, dict):
                continue
            index = candidate.get("index")
            index = index if isinstance(index, int) and not isinstance(index, bool) else position
            call.finish_reason(index, candidate.get("finishReason"))
            content = candidate.get("content")
            parts = content.get("parts") if isinstance(content, dict) else None
            for part in parts if isinstance(parts, list) else ():
                if not isinstance(part, dict):
                    continue
                text = part.get("text")
                if isinstance(text, str) and text:
                    output = True
                    if not part.get("thought"):
                        call.capture_output(text)
                if part.get("functionCall") or part.get("executableCode"):
                    output = True
    elif isinstance(obj.get("promptFeedback"), dict):
        call.finish_reason(0, obj["promptFeedback"].get("blockReason"))  # the prompt was refused
    return output


def usage(call, metadata) -> None:
    """``usageMetadata``: the latest one wins (a stream's are cumulative)."""
    if not isinstance(metadata, dict):
        return
    facts = call.facts
    tokens = count(metadata.get("promptTokenCount"))
    if tokens is not None:
        facts.input_tokens = tokens
    candidates = count(metadata.get("candidatesTokenCount"))
    thoughts = count(metadata.get("thoughtsTokenCount"))
    if candidates is not None or thoughts is not None:
        facts.output_tokens = (candidates or 0) + (thoughts or 0)
    tokens = count(metadata.get("cachedContentTokenCount"))
    if tokens is not None:
        facts.cache_read_input_tokens = tokens


def scanned(call, obj: dict) -> None:
    """The fields scanned from a response or event too long to keep whole."""
    response_object(call, {key: obj[key] for key in ("responseId", "modelVersion", "usageMetadata") if key in obj})
    call.finish_reason(0, obj.get("finishReason"))


API = GeminiApi()
