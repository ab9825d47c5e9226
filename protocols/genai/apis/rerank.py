"""Rerank and score APIs: ``.../v1/rerank``, ``/rerank``, ``/v2/rerank`` (vLLM, Cohere, Jina,
TEI shapes) and vLLM's ``.../v1/score``, ``/score``. Plain JSON, never streamed.

The conventions have no operation for ranking or scoring documents: the custom values
``rerank`` and ``score``; provider ``openai_compatible``. Request: ``model``, ``top_n``
(else ``top_k``), the documents sent (``documents``, ``texts``, ``text_2``, ``data_2`` or
``items``: a list, or one item). Response: the results (``results``, or ``data`` for
score), ``id``, ``model``, input tokens from ``usage`` (``prompt_tokens``, else
``input_tokens``, else ``total_tokens``: a ranker's tokens are all input) or Cohere's
``meta.tokens`` / ``meta.billed_units``.
"""

from __future__ import annotations

from protocols.genai import chunks
from protocols.genai.api import Endpoint, LlmApi, ids, last_segment, request_model, sampling, suffix_claim
from protocols.genai.jsonutil import count


class RerankApi(LlmApi):
    name = "rerank"
    provider = "openai_compatible"
    operations = ("rerank", "score")
    plain_event = staticmethod(chunks.openai_event)
    sse_tap = True

    def routes(self):
        rerank = Endpoint(self, "rerank")
        score = Endpoint(self, "score")
        # the bare routes engines answer too (vLLM's, Cohere's v2), then the OpenAI-style ones
        yield "/rerank", rerank
        yield "/v2/rerank", rerank
        yield "/score", score
        for suffix, endpoint in (("/rerank", rerank), ("/score", score)):
            yield last_segment(suffix), suffix_claim(suffix, endpoint)

    def request_facts(self, call, request, facts):
        request_model(request, facts)
        sampling(request, facts)
        facts.top_n = count(request.get("top_n"))
        if facts.top_n is None:
            facts.top_n = count(request.get("top_k"))
        for key in ("documents", "texts", "text_2", "data_2", "items"):
            value = request.get(key)
            if isinstance(value, list):
                facts.documents = len(value)
                return
            if isinstance(value, (str, dict)):
                facts.documents = 1
                return

    def request_stream(self, call, request):
        stream = request.get("stream")
        return stream if isinstance(stream, bool) else None

    def response(self, call, obj):
        rerank_object(call, obj)

    def scanned_response(self, call, obj):
        rerank_object(call, obj)


def rerank_object(call, obj: dict) -> None:
    """A rerank (``results``) or score (``data``) response: vLLM, Cohere, Jina, TEI shapes."""
    facts = call.facts
    ids(call, obj)
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
        tokens = count(usage.get("prompt_tokens"))
        if tokens is None:
            tokens = count(usage.get("input_tokens"))
        if tokens is None:
            tokens = count(usage.get("total_tokens"))  # a ranker's tokens are all input
        if tokens is not None:
            facts.input_tokens = tokens


API = RerankApi()
