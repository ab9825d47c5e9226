"""AWS Bedrock Runtime: ``POST /model/{modelId}/converse``, ``/converse-stream``, ``/invoke``
and ``/invoke-with-response-stream``; provider ``aws.bedrock``.

The model is the path's ``modelId``, percent-decoded (ids hold ``:`` and ``.``; an
inference profile's or a provisioned model's ARN holds ``/``, which the SDKs encode). The
responses name no model, and Converse's no id: the response id is then the request id AWS
returns in ``x-amzn-RequestId`` (the only response header read), which both ends of a call
see alike.

**Converse** (operation ``chat``): request ``inferenceConfig`` (``maxTokens``,
``temperature``, ``topP``), ``messages`` and ``system`` for content capture; response
``stopReason`` (the finish reason), ``usage`` (``inputTokens`` plus the prompt-cache
``cacheReadInputTokens`` and ``cacheWriteInputTokens``, which it excludes: the
conventions' input tokens include cached ones; ``outputTokens``). **ConverseStream**: AWS's
binary event stream (protocols/genai/eventstream.py, CRC-checked): ``messageStart``,
``contentBlockStart``, ``contentBlockDelta`` (an output chunk when its delta has text,
reasoning or tool input), ``contentBlockStop``, ``messageStop`` (``stopReason``),
``metadata`` (``usage``); an ``exception`` message carries no facts.

**InvokeModel** reads the model's own body: Anthropic's Messages format (``anthropic_version``
or ``messages``: operation ``chat``, read as apis/anthropic.py reads it) or a prompt body
(``prompt``: operation ``text_completion``; Meta Llama's ``max_gen_len``, ``temperature``,
``top_p``, answered by ``generation``, ``prompt_token_count``, ``generation_token_count``,
``stop_reason``). **InvokeModelWithResponseStream**: event-stream ``chunk`` events whose
``bytes`` (base64) hold the model's own stream events (Anthropic's ``message_start``,
``content_block_delta``, ...; Llama's ``generation`` chunks); the last one's
``amazon-bedrock-invocationMetrics`` (``inputTokenCount``, ``outputTokenCount``) give the
usage when the model's events did not. Every event is decoded (no byte classifier).
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote

from protocols.genai.api import Endpoint, LlmApi
from protocols.genai.apis import anthropic
from protocols.genai.eventstream import EventStream
from protocols.genai.jsonutil import count, loads, number, scan_object

#: The path's last segment -> (route, streams).
_ROUTES = {
    "converse": ("converse", False),
    "converse-stream": ("converse", True),
    "invoke": ("invoke", False),
    "invoke-with-response-stream": ("invoke", True),
}
_PREFIX = "/model/"
_EVENT_STREAM = "application/vnd.amazon.eventstream"
_REQUEST_ID = "x-amzn-requestid"
_METRICS = "amazon-bedrock-invocationMetrics"
#: Endpoints by path (a path names its model): bounded, forgotten all at once when full.
_MAX_ENDPOINTS = 1024
#: An invoke body's format: Anthropic's Messages, a prompt (Llama and the like), unknown.
_MESSAGES, _PROMPT, _OTHER = "messages", "prompt", "other"


class BedrockApi(LlmApi):
    name = "bedrock"
    provider = "aws.bedrock"
    operations = ("chat", "text_completion")
    response_headers = (_REQUEST_ID,)
    request_keys = ("inferenceConfig", "anthropic_version", "max_tokens", "max_gen_len", "temperature", "top_p")
    head_keys = ("id", "model")
    tail_keys = ("usage", "stopReason", "stop_reason", "prompt_token_count", "generation_token_count")

    def __init__(self) -> None:
        self._endpoints: dict[str, Endpoint] = {}

    def routes(self):
        for last in _ROUTES:
            yield last, self._claim

    def _claim(self, path: str) -> Endpoint | None:
        """``/model/{modelId}/{action}`` -> its endpoint (the id percent-decoded)."""
        endpoint = self._endpoints.get(path)
        if endpoint is not None:
            return endpoint
        if not path.startswith(_PREFIX):
            return None
        model, slash, action = path[len(_PREFIX) :].partition("/")
        if not model or not slash or action not in _ROUTES:
            return None
        route, streams = _ROUTES[action]
        if "%" in model:
            model = unquote(model)
        endpoint = Endpoint(self, "chat", model, streaming=streams, route=route)
        if len(self._endpoints) >= _MAX_ENDPOINTS:
            self._endpoints.clear()
        self._endpoints[path] = endpoint
        return endpoint

    def header(self, call, response, name, value):
        if value:
            _notes(call)["request_id"] = value.strip()[:256]

    # -- the request ----------------------------------------------------------------------

    def request_facts(self, call, request, facts):
        facts.request_model = call.endpoint.model
        if call.endpoint.route == "converse":
            config = request.get("inferenceConfig")
            if isinstance(config, dict):
                facts.max_tokens = count(config.get("maxTokens"))
                facts.temperature = number(config.get("temperature"))
                facts.top_p = number(config.get("topP"))
            return
        if _format(call, request) == _PROMPT:
            facts.operation = "text_completion"
        for key in ("max_tokens", "max_gen_len", "max_tokens_to_sample"):
            facts.max_tokens = count(request.get(key))
            if facts.max_tokens is not None:
                break
        facts.temperature = number(request.get("temperature"))
        facts.top_p = number(request.get("top_p"))

    def request_stream(self, call, request):
        return call.endpoint.streaming

    # -- the response ---------------------------------------------------------------------

    def stream_framing(self, call, content_type):
        return EventStream() if content_type == _EVENT_STREAM else None

    def response(self, call, obj):
        if call.endpoint.route == "converse":
            converse_response(call, obj)
        else:
            self._model_object(call, obj)

    def scanned_response(self, call, obj):
        if call.endpoint.route == "converse":
            converse_response(call, obj)
        else:
            self._model_object(call, obj, scanned=True)

    def event(self, call, ts_ns, name, obj):
        if name == "chunk":  # invoke-with-response-stream: the model's own event, base64
            inner = _chunk_bytes(obj)
            if inner is not None:
                self._model_object(call, inner, ts_ns)
        elif name == "contentBlockDelta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                text = delta.get("text")
                if isinstance(text, str) and text:
                    call.chunk(ts_ns)
                    call.capture_output(text)
                elif delta.get("toolUse") or delta.get("reasoningContent"):
                    call.chunk(ts_ns)
        elif name == "messageStop":
            call.finish_reason(0, obj.get("stopReason"))
        elif name == "metadata":
            converse_usage(call, obj.get("usage"))

    def truncated_event(self, call, ts_ns, name, head, tail):
        if name == "contentBlockDelta" or name == "chunk":
            call.chunk(ts_ns)  # too big to keep: output (a chunk's base64 cannot be read from its ends)
        elif name == "metadata":
            converse_usage(call, scan_object(head, tail, b"", (), ("usage",)).get("usage"))

    def _model_object(self, call, obj: dict, ts_ns: int | None = None, scanned: bool = False) -> None:
        """The model's own answer (invoke), or its stream event at ``ts_ns`` (a chunk's),
        in its format (``scanned``: an answer read from its ends)."""
        if _format(call, call.request()) == _MESSAGES:
            if ts_ns is not None:
                anthropic.stream_event(call, ts_ns, obj)
            else:
                anthropic.message(call, obj, streamed=scanned)
        elif prompt_object(call, obj) and ts_ns is not None:
            call.chunk(ts_ns)
        metrics = obj.get(_METRICS)
        if isinstance(metrics, dict):  # the stream's last chunk: usage when the model's events had none
            facts = call.facts
            if facts.input_tokens is None:
                facts.input_tokens = count(metrics.get("inputTokenCount"))
            if facts.output_tokens is None:
                facts.output_tokens = count(metrics.get("outputTokenCount"))

    # -- the end --------------------------------------------------------------------------

    def finish(self, call, request, facts):
        if call.endpoint.route == "invoke" and _format(call, request) == _MESSAGES:
            anthropic.total_input(facts)
        if facts.response_id is None and call.scratch is not None:
            facts.response_id = call.scratch.get("request_id")


def _notes(call) -> dict:
    if call.scratch is None:
        call.scratch = {}
    return call.scratch


def _format(call, request: dict | None) -> str:
    """The format of an invoke body (noted once per call)."""
    notes = _notes(call)
    known = notes.get("format")
    if known is None:
        known = _OTHER
        if isinstance(request, dict):
            if "anthropic_version" in request or isinstance(request.get("messages"), list):
                known = _MESSAGES
            elif isinstance(request.get("prompt"), str):
                known = _PROMPT
        notes["format"] = known
    return known


def _chunk_bytes(obj: dict) -> dict | None:
    """The model event a ``chunk`` carries (``{"bytes": base64}``), or None."""
    value = obj.get("bytes")
    if not isinstance(value, str):
        return None
    try:
        return loads(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return None


def converse_usage(call, usage) -> None:
    """Converse's ``usage``: input tokens with the cache tokens it leaves out, output tokens."""
    if not isinstance(usage, dict):
        return
    facts = call.facts
    read = count(usage.get("cacheReadInputTokens"))
    write = count(usage.get("cacheWriteInputTokens"))
    if read is not None:
        facts.cache_read_input_tokens = read
    if write is not None:
        facts.cache_creation_input_tokens = write
    tokens = count(usage.get("inputTokens"))
    if tokens is not None:
        facts.input_tokens = tokens + (read or 0) + (write or 0)
    tokens = count(usage.get("outputTokens"))
    if tokens is not None:
        facts.output_tokens = tokens


def converse_response(call, obj: dict) -> None:
    """A Converse answer: ``stopReason``, ``usage``, the output message's text."""
    call.finish_reason(0, obj.get("stopReason"))
    converse_usage(call, obj.get("usage"))
    if call.capture_content:
        output = obj.get("output")
        message = output.get("message") if isinstance(output, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                call.capture_output(block["text"])


def prompt_object(call, obj: dict) -> bool:
    """A prompt model's answer or stream chunk (Meta Llama's shape); True if it carries output."""
    facts = call.facts
    tokens = count(obj.get("prompt_token_count"))
    if tokens is not None:
        facts.input_tokens = tokens
    tokens = count(obj.get("generation_token_count"))
    if tokens is not None:
        facts.output_tokens = tokens
    call.finish_reason(0, obj.get("stop_reason"))
    text = obj.get("generation")
    if isinstance(text, str) and text:
        call.capture_output(text)
        return True
    return False


API = BedrockApi()
