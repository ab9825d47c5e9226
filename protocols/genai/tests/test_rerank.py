"""Rerank and score calls (/v1/rerank, /v1/score): vLLM, Cohere, Jina and TEI shapes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from protocols.genai import match_endpoint
from protocols.genai.llm import LlmCall
from protocols.genai.tests.test_fuzz import FUZZ, split

RERANK = match_endpoint("POST", "/v1/rerank")
SCORE = match_endpoint("POST", "/v1/score")


def facts_of(endpoint, request, response, chunks=None):
    call = LlmCall(endpoint)
    call.request_body(json.dumps(request).encode())
    call.response_start("application/json")
    body = json.dumps(response).encode()
    for piece in split(body, chunks or []):
        call.response_body(1, piece)
    return call.finish(), call


def test_paths():
    for path in ("/v1/rerank", "/rerank", "/v2/rerank", "/cohere/v1/rerank", "/v1/rerank/"):
        assert match_endpoint("POST", path) == RERANK, path
    for path in ("/v1/score", "/score"):
        assert match_endpoint("POST", path) == SCORE, path
    assert match_endpoint("POST", "/v2/score") is None
    assert match_endpoint("POST", "/reranked") is None
    assert match_endpoint("GET", "/v1/rerank") is None


def test_vllm_and_jina_rerank():
    request = {"model": "BAAI/bge-reranker-base", "query": "q", "documents": ["a", "b", "c"], "top_n": 2}
    response = {"id": "rerank-1", "model": "BAAI/bge-reranker-base", "usage": {"total_tokens": 17},
                "results": [{"index": 1, "document": {"text": "b"}, "relevance_score": 0.9},
                            {"index": 0, "document": {"text": "a"}, "relevance_score": 0.1}]}  # fmt: skip
    facts, call = facts_of(RERANK, request, response)
    assert call.errors == 0
    assert (facts.request_model, facts.response_model, facts.response_id) == ("BAAI/bge-reranker-base",) * 2 + ("rerank-1",)
    assert (facts.documents, facts.top_n, facts.results, facts.input_tokens, facts.output_tokens) == (3, 2, 2, 17, None)
    assert facts.stream is None and facts.max_tokens is None and facts.streamed is False


def test_cohere_v2_rerank_usage_in_meta():
    request = {"model": "rerank-v3.5", "query": "q", "documents": [{"text": "a"}, {"text": "b"}], "top_n": 1}
    response = {"id": "0b8f", "results": [{"index": 0, "relevance_score": 0.7}],
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                         "tokens": {"input_tokens": 40, "output_tokens": 0}}}  # fmt: skip
    facts, _ = facts_of(RERANK, request, response)
    assert (facts.request_model, facts.response_model, facts.documents, facts.top_n, facts.results, facts.input_tokens) == (
        "rerank-v3.5", None, 2, 1, 1, 40)


def test_vllm_score():
    request = {"model": "bge-reranker", "text_1": "what", "text_2": ["x", "y", "z"]}
    response = {"id": "score-1", "object": "list", "created": 1, "model": "bge-reranker",
                "data": [{"index": i, "object": "score", "score": 0.5} for i in range(3)],
                "usage": {"prompt_tokens": 11, "total_tokens": 11}}  # fmt: skip
    facts, _ = facts_of(SCORE, request, response)
    assert (facts.documents, facts.top_n, facts.results, facts.input_tokens, facts.response_id) == (3, None, 3, 11, "score-1")
    single, _ = facts_of(SCORE, dict(request, text_2="x"), response)
    assert single.documents == 1


def test_a_big_response_read_from_its_ends():
    docs = ["word " * 2000 for _ in range(40)]
    request = {"model": "r", "query": "q", "documents": docs, "return_documents": True}
    response = {"id": "rerank-9", "model": "r", "results": [{"index": i, "document": {"text": d}, "relevance_score": 0.1}
                                                            for i, d in enumerate(docs)], "usage": {"total_tokens": 80001}}  # fmt: skip
    facts, call = facts_of(RERANK, request, response)
    assert call.errors == 0 and facts.input_tokens == 80001 and facts.response_id == "rerank-9"
    assert facts.request_model == "r"  # the >64 KiB request is scanned: its model is still read


def test_not_a_reranker_without_a_model():
    facts, _ = facts_of(RERANK, {"query": "q", "documents": []}, {"results": []})
    assert facts is None


@FUZZ
@given(st.lists(st.integers(min_value=0), max_size=10))
def test_any_chunking_gives_the_same_facts(cuts):
    request = {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1}
    response = {"id": "r1", "model": "m", "usage": {"total_tokens": 4}, "results": [{"index": 0, "relevance_score": 1.0}]}
    whole, _ = facts_of(RERANK, request, response)
    facts, _ = facts_of(RERANK, request, response, cuts)
    assert facts == whole


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_any_bytes_never_raise(request, response):
    for endpoint in (RERANK, SCORE):
        call = LlmCall(endpoint)
        call.request_body(request)
        call.response_start("application/json")
        call.response_body(1, response)
        call.finish()
        assert call.errors == 0
