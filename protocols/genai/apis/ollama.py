"""Ollama's own API: ``/api/chat`` (``chat``), ``/api/generate`` (``text_completion``),
``/api/embed`` and ``/api/embeddings`` (``embeddings``); provider ``ollama``.

Request: ``model``, ``options`` (``num_predict`` as max tokens, ``temperature``,
``top_p``; without ``options``, the body's own), ``stream`` (Ollama streams unless told
not to, embeddings aside); for content capture ``messages`` or ``prompt``. Response: one
JSON object, or a stream of NDJSON lines: ``model``, ``prompt_eval_count`` (input tokens),
``eval_count`` (output tokens), ``done_reason``; a line is an output chunk when its
``message.content``, ``response`` or ``thinking`` is not empty (or it carries tool calls).
Lines of ``"done":false`` are counted from their bytes (chunks.ollama_event): only the first
and the last (``done`` true, with the counts) are decoded.
"""

from __future__ import annotations

from protocols.genai import chunks
from protocols.genai.api import Endpoint, LlmApi, request_model, sampling
from protocols.genai.jsonutil import count, scan_object
from protocols.genai.llm import JSON, NDJSON


class OllamaApi(LlmApi):
    name = "ollama"
    provider = "ollama"
    operations = ("chat", "text_completion", "embeddings")
    plain_event = staticmethod(chunks.ollama_event)
    sse_tap = True

    def routes(self):
        chat = Endpoint(self, "chat")
        yield "/api/chat", chat
        yield "/api/generate", Endpoint(self, "text_completion")
        embed = Endpoint(self, "embeddings")
        yield "/api/embed", embed
        yield "/api/embeddings", embed

    def request_facts(self, call, request, facts):
        request_model(request, facts)
        options = request.get("options")
        params = options if isinstance(options, dict) else request
        sampling(params, facts)
        facts.max_tokens = count(params.get("num_predict"))

    def request_stream(self, call, request):
        stream = request.get("stream")
        if isinstance(stream, bool):
            return stream
        return None if call.endpoint.operation == "embeddings" else True  # Ollama streams unless told not to

    def sniff(self, call, first):
        """An object with no content type: NDJSON lines unless the request asked for one answer."""
        if first != b"{":
            return JSON
        request = call.request()
        return NDJSON if request is None or self.request_stream(call, request) is not False else JSON

    def event(self, call, ts_ns, name, obj):
        if ollama_object(call, obj):
            call.chunk(ts_ns)

    def truncated_event(self, call, ts_ns, name, head, tail):
        call.chunk(ts_ns)  # a line too long to keep: output; its end may hold the counts
        ollama_object(call, scan_object(head, tail))

    def response(self, call, obj):
        ollama_object(call, obj)

    def scanned_response(self, call, obj):
        ollama_object(call, obj)


def ollama_object(call, obj: dict) -> bool:
    """An Ollama response or stream line; True if it carries output."""
    facts = call.facts
    value = obj.get("model")
    if isinstance(value, str) and value:
        facts.response_model = value
    tokens = count(obj.get("prompt_eval_count"))
    if tokens is not None:
        facts.input_tokens = tokens
    tokens = count(obj.get("eval_count"))
    if tokens is not None:
        facts.output_tokens = tokens
    call.finish_reason(0, obj.get("done_reason"))
    output = False
    message = obj.get("message")
    if isinstance(message, dict):
        content = message.get("content")
        if isinstance(content, str) and content:
            output = True
            call.capture_output(content)
        if message.get("thinking") or message.get("tool_calls"):
            output = True
    text = obj.get("response")
    if isinstance(text, str) and text:
        output = True
        call.capture_output(text)
    if obj.get("thinking"):
        output = True
    return output


API = OllamaApi()
