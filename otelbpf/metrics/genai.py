"""GenAI metric instruments, per the GenAI metrics conventions (semantic-conventions-genai).

LLM calls on HTTP/1 are HTTP/1 spans that also carry ``gen_ai.*`` attributes
(otelbpf/semantics/genai.py), so these instruments are registered with
HTTP/1's (``otelbpf/registry.py``) and select the spans that carry
``gen_ai.operation.name``. Bucket boundaries are the conventions' advice.

Client (CLIENT spans):

* ``gen_ai.client.operation.duration`` (s): every LLM call;
* ``gen_ai.client.token.usage`` ({token}): two definitions of one metric,
  ``gen_ai.token.type=input`` and ``output`` (fixed attributes), each
  recorded when the response reported that count;
* ``gen_ai.client.operation.time_to_first_chunk`` (s): streamed calls with
  at least one output chunk;
* ``gen_ai.client.operation.time_per_output_chunk`` (s): streamed calls with
  at least two output chunks. The convention records one value per chunk
  after the first; an instrument here records one value per span, so this is
  the call's mean gap between output chunks ((last - first) / (chunks - 1)).

Server (SERVER spans):

* ``gen_ai.server.request.duration`` (s): every LLM call served;
* ``gen_ai.server.time_to_first_token`` (s): streamed responses, from the
  request's first byte read to the first output chunk written;
* ``gen_ai.server.time_per_output_token`` (s): streamed responses, (last
  output chunk - first) / (output tokens - 1), with the output tokens from
  the response's usage, or the output chunks when it reports none.

Data-point attributes: ``gen_ai.operation.name``, ``gen_ai.provider.name``,
``gen_ai.request.model``, ``gen_ai.response.model``, ``server.address``,
``server.port``, ``error.type`` (models are bounded in practice: a server
serves a few).
"""

from __future__ import annotations

from typing import Callable

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind, SpanRecord
from otelbpf.metrics.instruments import SpanHistogram, duration_seconds

ATTRIBUTES: tuple[str, ...] = (
    sc.GEN_AI_OPERATION_NAME,
    sc.GEN_AI_PROVIDER_NAME,
    sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_RESPONSE_MODEL,
    sc.SERVER_ADDRESS,
    sc.SERVER_PORT,
    sc.ERROR_TYPE,
)
#: gen_ai.client.token.usage: no error.type (it is recorded for answered calls only).
TOKEN_ATTRIBUTES: tuple[str, ...] = ATTRIBUTES[:-1]


def genai_span(kind: SpanKind, *required: str) -> Callable[[SpanRecord], bool]:
    """A selector: LLM-call spans of ``kind`` that carry every ``required`` attribute."""

    def select(span: SpanRecord) -> bool:
        if span.kind != kind:
            return False
        attributes = span.attributes
        if sc.GEN_AI_OPERATION_NAME not in attributes:
            return False
        for key in required:
            if key not in attributes:
                return False
        return True

    select.__name__ = f"genai_{kind.name.lower()}_with_{'_'.join(k.rsplit('.', 1)[-1] for k in required) or 'any'}"
    return select


def attribute(key: str) -> Callable[[SpanRecord], float]:
    def value(span: SpanRecord) -> float:
        return float(span.attributes[key])  # type: ignore[arg-type]

    value.__name__ = f"value_of_{key.replace('.', '_')}"
    return value


def time_per_output_token(span: SpanRecord) -> float:
    """(last output chunk - first) / (output tokens - 1); by chunks when usage is missing."""
    attributes = span.attributes
    per_chunk = float(attributes[sc.OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK])  # type: ignore[arg-type]
    chunks = int(attributes.get(sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS, 0))  # type: ignore[arg-type]
    tokens = attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    if isinstance(tokens, int) and tokens > 1 and chunks > 1:
        return per_chunk * (chunks - 1) / (tokens - 1)
    return per_chunk


CLIENT_OPERATION_DURATION = SpanHistogram(
    name=sc.GEN_AI_CLIENT_OPERATION_DURATION,
    unit="s",
    description="GenAI operation duration.",
    boundaries=sc.GEN_AI_DURATION_BOUNDARIES,
    attributes=ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.CLIENT),
    value=duration_seconds,
)
CLIENT_INPUT_TOKENS = SpanHistogram(
    name=sc.GEN_AI_CLIENT_TOKEN_USAGE,
    unit="{token}",
    description="Number of input and output tokens used.",
    boundaries=sc.GEN_AI_TOKEN_USAGE_BOUNDARIES,
    attributes=TOKEN_ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.CLIENT, sc.GEN_AI_USAGE_INPUT_TOKENS),
    value=attribute(sc.GEN_AI_USAGE_INPUT_TOKENS),
    fixed_attributes=((sc.GEN_AI_TOKEN_TYPE, sc.GEN_AI_TOKEN_TYPE_INPUT),),
)
CLIENT_OUTPUT_TOKENS = SpanHistogram(
    name=sc.GEN_AI_CLIENT_TOKEN_USAGE,
    unit="{token}",
    description="Number of input and output tokens used.",
    boundaries=sc.GEN_AI_TOKEN_USAGE_BOUNDARIES,
    attributes=TOKEN_ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.CLIENT, sc.GEN_AI_USAGE_OUTPUT_TOKENS),
    value=attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS),
    fixed_attributes=((sc.GEN_AI_TOKEN_TYPE, sc.GEN_AI_TOKEN_TYPE_OUTPUT),),
)
CLIENT_TIME_TO_FIRST_CHUNK = SpanHistogram(
    name=sc.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
    unit="s",
    description="Time to receive the first chunk in a streaming response.",
    boundaries=sc.GEN_AI_DURATION_BOUNDARIES,
    attributes=ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.CLIENT, sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
    value=attribute(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
)
CLIENT_TIME_PER_OUTPUT_CHUNK = SpanHistogram(
    name=sc.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
    unit="s",
    description="Time per output chunk after the first one (the call's mean).",
    boundaries=sc.GEN_AI_DURATION_BOUNDARIES,
    attributes=ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.CLIENT, sc.OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK),
    value=attribute(sc.OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK),
)
SERVER_REQUEST_DURATION = SpanHistogram(
    name=sc.GEN_AI_SERVER_REQUEST_DURATION,
    unit="s",
    description="Generative AI server request duration such as time-to-last byte or last output token.",
    boundaries=sc.GEN_AI_DURATION_BOUNDARIES,
    attributes=ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.SERVER),
    value=duration_seconds,
)
SERVER_TIME_TO_FIRST_TOKEN = SpanHistogram(
    name=sc.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
    unit="s",
    description="Time to generate first token for successful responses.",
    boundaries=sc.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN_BOUNDARIES,
    attributes=ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.SERVER, sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
    value=attribute(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK),
)
SERVER_TIME_PER_OUTPUT_TOKEN = SpanHistogram(
    name=sc.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
    unit="s",
    description="Time per output token generated after the first token for successful responses.",
    boundaries=sc.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN_BOUNDARIES,
    attributes=ATTRIBUTES,
    requires=sc.GEN_AI_OPERATION_NAME,
    select=genai_span(SpanKind.SERVER, sc.OTELBPF_GEN_AI_RESPONSE_TIME_PER_OUTPUT_CHUNK),
    value=time_per_output_token,
)

INSTRUMENTS: tuple[SpanHistogram, ...] = (
    CLIENT_OPERATION_DURATION,
    CLIENT_INPUT_TOKENS,
    CLIENT_OUTPUT_TOKENS,
    CLIENT_TIME_TO_FIRST_CHUNK,
    CLIENT_TIME_PER_OUTPUT_CHUNK,
    SERVER_REQUEST_DURATION,
    SERVER_TIME_TO_FIRST_TOKEN,
    SERVER_TIME_PER_OUTPUT_TOKEN,
)
