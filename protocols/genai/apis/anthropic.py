"""Anthropic's Messages API: ``.../v1/messages`` (operation ``chat``, provider ``anthropic``
wherever it is served: the Messages API is Anthropic's).

Request: ``model``, ``max_tokens``, ``temperature``, ``top_p``, ``stream``; for content
capture ``system`` (a string or text blocks) and ``messages``. Response: ``id``, ``model``,
``stop_reason`` (the finish reason), ``usage``: its ``input_tokens`` excludes the
prompt-cache tokens, so the facts' input tokens are ``input_tokens +
cache_read_input_tokens + cache_creation_input_tokens`` (the GenAI conventions' input
tokens include cached ones) and the two cache counts are kept apart.

Stream: named SSE events. ``message_start`` carries the id, model and input usage; each
``content_block_delta`` is an output chunk; ``message_delta`` carries the ``stop_reason``
and the cumulative usage (it overrides ``message_start``'s); ``ping``,
``content_block_start``/``_stop`` and ``message_stop`` carry nothing kept. Only
``message_start``, ``message_delta`` (and ``error``) are decoded: the others are read from
their ``event:`` name, or from the leading ``"type"`` of the data when a server leaves the
name out (chunks.anthropic_event).

Bedrock's ``invoke`` of an Anthropic model speaks this format inside AWS's framing
(apis/bedrock.py uses :func:`message`, :func:`stream_event` and :func:`total_input`).
"""

from __future__ import annotations

from typing import Any

from protocols.genai import chunks
from protocols.genai.api import Endpoint, LlmApi, ids, suffix_claim
from protocols.genai.jsonutil import count, scan_object


class AnthropicApi(LlmApi):
    name = "anthropic"
    provider = "anthropic"
    operations = ("chat",)
    plain_event = staticmethod(chunks.anthropic_event)

    def routes(self):
        yield "messages", suffix_claim("/v1/messages", Endpoint(self, "chat"))  # not .../threads/X/messages

    def event(self, call, ts_ns, name, obj):
        stream_event(call, ts_ns, obj)

    def truncated_event(self, call, ts_ns, name, head, tail):
        if name == "content_block_delta" or head.find(b'content_block_delta"', 0, 200) >= 0:
            call.chunk(ts_ns)
            return
        stream_event(call, ts_ns, scan_object(head, tail))

    def response(self, call, obj):
        message(call, obj, streamed=False)

    def scanned_response(self, call, obj):
        message(call, obj, streamed=True)

    def finish(self, call, request, facts):
        total_input(facts)


def usage(call, value: Any) -> None:
    """An Anthropic ``usage`` (message_start's, message_delta's cumulative one, a message's):
    ``input_tokens`` excludes the cache tokens, which :func:`total_input` adds at the end."""
    if not isinstance(value, dict):
        return
    facts = call.facts
    tokens = count(value.get("input_tokens"))
    if tokens is not None:
        facts.input_tokens = tokens
    tokens = count(value.get("output_tokens"))
    if tokens is not None:
        facts.output_tokens = tokens
    tokens = count(value.get("cache_read_input_tokens"))
    if tokens is not None:
        facts.cache_read_input_tokens = tokens
    tokens = count(value.get("cache_creation_input_tokens"))
    if tokens is not None:
        facts.cache_creation_input_tokens = tokens


def total_input(facts) -> None:
    """The conventions' input tokens include cached ones: add them (once, at the end)."""
    if facts.input_tokens is not None:
        facts.input_tokens += (facts.cache_read_input_tokens or 0) + (facts.cache_creation_input_tokens or 0)


def message(call, obj: dict, streamed: bool) -> None:
    """A Messages response (or message_start's ``message``)."""
    ids(call, obj)
    usage(call, obj.get("usage"))
    call.finish_reason(0, obj.get("stop_reason"))
    if not streamed and call.capture_content:
        for block in obj.get("content") or ():
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                call.capture_output(block["text"])


def stream_event(call, ts_ns: int, obj: dict) -> None:
    """A decoded stream event, by its ``type``."""
    kind = obj.get("type")
    if kind == "content_block_delta":
        call.chunk(ts_ns)
        delta = obj.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("text"), str):
            call.capture_output(delta["text"])
    elif kind == "message_start":
        start = obj.get("message")
        if isinstance(start, dict):
            message(call, start, streamed=True)
    elif kind == "message_delta":
        delta = obj.get("delta")
        if isinstance(delta, dict):
            call.finish_reason(0, delta.get("stop_reason"))
        usage(call, obj.get("usage"))
    elif kind is None and ("usage" in obj or "stop_reason" in obj or "id" in obj):
        message(call, obj, streamed=True)  # an oversized event read from its ends


API = AnthropicApi()
