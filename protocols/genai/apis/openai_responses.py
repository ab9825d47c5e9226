"""OpenAI's Responses API: ``/v1/responses`` (operation ``chat``, provider ``openai_compatible``).

Request: ``model``, ``max_output_tokens``, ``temperature``, ``top_p``, ``stream``, and for
content capture ``instructions`` and ``input`` (a string or input items). Response: ``id``,
``model``, ``usage`` (``input_tokens``, ``output_tokens``,
``input_tokens_details.cached_tokens``), the finish reason from
``incomplete_details.reason``, else ``status``. Stream: named events; each ``*.delta`` is an
output chunk (counted from its name, never decoded: chunks.responses_event); the others
carry a ``response`` object (``response.created``, ``response.completed`` with the usage).
``response.completed`` repeats the whole output, so it may exceed the SSE bounds: it is
read from its head (after ``"response"``) and tail.
"""

from __future__ import annotations

from protocols.genai import chunks
from protocols.genai.api import Endpoint, LlmApi, ids, openai_usage, request_model, sampling, suffix_claim
from protocols.genai.jsonutil import count, scan_object

_ENDED = ("completed", "incomplete", "failed", "cancelled")


class ResponsesApi(LlmApi):
    name = "openai_responses"
    provider = "openai_compatible"
    operations = ("chat",)
    plain_event = staticmethod(chunks.responses_event)

    def routes(self):
        yield "responses", suffix_claim("/responses", Endpoint(self, "chat"))

    def request_facts(self, call, request, facts):
        request_model(request, facts)
        sampling(request, facts)
        facts.max_tokens = count(request.get("max_output_tokens"))

    def event(self, call, ts_ns, name, obj):
        kind = obj.get("type")
        if not isinstance(kind, str):
            return
        if kind.endswith(".delta"):
            call.chunk(ts_ns)
            delta = obj.get("delta")
            if kind == "response.output_text.delta" and isinstance(delta, str):
                call.capture_output(delta)
            return
        response = obj.get("response")
        if isinstance(response, dict):
            response_object(call, response, streamed=True)

    def truncated_event(self, call, ts_ns, name, head, tail):
        if name.endswith(".delta") or head.find(b'.delta"', 0, 200) >= 0:
            call.chunk(ts_ns)
            return
        response_object(call, scan_object(head, tail, b'"response"'), streamed=True)

    def response(self, call, obj):
        response_object(call, obj, streamed=False)

    def scanned_response(self, call, obj):
        response_object(call, obj, streamed=True)


def response_object(call, obj: dict, streamed: bool) -> None:
    """A Responses API ``response`` object (the answer, or a stream event's)."""
    ids(call, obj)
    openai_usage(call, obj.get("usage"))
    status = obj.get("status")
    details = obj.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if isinstance(reason, str) and reason:
        call.finish_reason(0, reason)
    elif isinstance(status, str) and status in _ENDED:
        call.finish_reason(0, status)
    if not streamed and call.capture_content:
        for item in obj.get("output") or ():
            if isinstance(item, dict):
                for part in item.get("content") or ():
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        call.capture_output(part["text"])


API = ResponsesApi()
