"""Hugging Face TGI's native API: ``/generate``, ``/generate_stream`` and ``/`` (its
compatibility route: huggingface_hub's ``InferenceClient.text_generation`` posts there;
``"stream": true`` streams, otherwise the answer is a one-element JSON list). Operation
``text_completion``; provider ``huggingface.tgi`` (no well-known value: a custom one).

The API names no model (a TGI server serves one), so a call is recognised by its shape
instead: a request object with ``inputs`` and a response with ``generated_text``, a
``token`` event or an ``error_type`` (some other application's ``POST /`` yields no
facts). Request ``parameters``: ``max_new_tokens``, ``temperature``, ``top_p``.
From ``details`` (the client asks ``details=true``): ``finish_reason``,
``generated_tokens`` (output tokens), input tokens from the stream's
``details.input_length`` or from ``prefill`` (``decoder_input_details``). A stream's output
chunks are its token events whose token is not ``special`` (an EOS token is not output);
the middle events (``"generated_text":null,"details":null``) are counted from their bytes
(chunks.tgi_event), never decoded.
"""

from __future__ import annotations

from protocols.genai import chunks
from protocols.genai.api import Endpoint, LlmApi, request_model, sampling
from protocols.genai.jsonutil import count, scan_object
from protocols.genai.llm import SSE


class TgiApi(LlmApi):
    name = "tgi"
    provider = "huggingface.tgi"
    operations = ("text_completion",)
    plain_event = staticmethod(chunks.tgi_event)
    list_response = True
    prompt_keys = ("prompt", "input", "inputs")

    def routes(self):
        endpoint = Endpoint(self, "text_completion")
        for path in ("/", "/generate", "/generate_stream"):
            yield path, endpoint

    def request_facts(self, call, request, facts):
        request_model(request, facts)
        parameters = request.get("parameters")
        params = parameters if isinstance(parameters, dict) else request
        sampling(params, facts)
        facts.max_tokens = count(params.get("max_new_tokens"))

    def request_stream(self, call, request):
        stream = request.get("stream")
        if isinstance(stream, bool):
            return stream
        return call.mode == SSE  # /generate_stream: the route asks for the stream

    def event(self, call, ts_ns, name, obj):
        if tgi_object(call, obj, streamed=True):
            call.chunk(ts_ns)

    def truncated_event(self, call, ts_ns, name, head, tail):
        call.chunk(ts_ns)  # a huge token event: output; its end holds the details
        tgi_object(call, scan_object(head, tail), streamed=True)

    def response(self, call, obj):
        tgi_object(call, obj, streamed=False)

    def scanned_response(self, call, obj):
        tgi_object(call, obj, streamed=True)  # generated_text is not kept whole

    def is_call(self, call, request, facts):
        return call.shaped and isinstance(request.get("inputs"), (str, list))


def tgi_object(call, obj: dict, streamed: bool) -> bool:
    """A TGI response (``/generate``'s object, ``/``'s list item) or stream event;
    True if it carries output (a token event whose token is not special)."""
    output = False
    token = obj.get("token")
    if isinstance(token, dict):
        call.shaped = True
        if not token.get("special"):
            output = True
            if isinstance(token.get("text"), str):
                call.capture_output(token["text"])
    text = obj.get("generated_text")
    if isinstance(text, str):
        call.shaped = True
        if not streamed:
            call.capture_output(text)
    if isinstance(obj.get("error_type"), str) or (isinstance(obj.get("error"), str) and call.shaped):
        call.shaped = True
    details = obj.get("details")
    if isinstance(details, dict):
        facts = call.facts
        call.finish_reason(0, details.get("finish_reason"))
        tokens = count(details.get("generated_tokens"))
        if tokens is not None:
            facts.output_tokens = tokens
        tokens = count(details.get("input_length"))  # stream details (TGI 2)
        prefill = details.get("prefill")
        if tokens is None and isinstance(prefill, list) and prefill:  # decoder_input_details
            tokens = len(prefill)
        if tokens is not None:
            facts.input_tokens = tokens
    return output


API = TgiApi()
