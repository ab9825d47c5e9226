"""How Anthropic Messages, rerank and score calls show on a span (no eBPF: the facts given)."""

from otelbpf import semconv as sc
from otelbpf.semantics.genai import GenAiLayer, genai_attributes, provider_name
from protocols.genai import LlmFacts, match_endpoint
from protocols.genai.apis import anthropic, rerank

MESSAGES = match_endpoint("POST", "/v1/messages")
RERANK = match_endpoint("POST", "/v1/rerank")
SCORE = match_endpoint("POST", "/score")


def test_anthropic_span():
    facts = LlmFacts(MESSAGES, request_model="claude-haiku-4-5", max_tokens=64, response_id="msg_1",
                     finish_reasons=("end_turn",), input_tokens=110, output_tokens=5, cache_read_input_tokens=100,
                     cache_creation_input_tokens=0, streamed=True, first_chunk_ns=300, last_chunk_ns=700, chunks=5)  # fmt: skip
    attrs: dict = {sc.SERVER_ADDRESS: "127.0.0.1"}
    assert genai_attributes(facts, 100, attrs) == "chat claude-haiku-4-5"
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "chat" and attrs[sc.GEN_AI_PROVIDER_NAME] == "anthropic"
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 110 and attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 100
    assert attrs[sc.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] == 0
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["end_turn"]
    assert attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == 200 / 1e9


def test_provider_names():
    assert provider_name("api.anthropic.com", anthropic.API) == "anthropic"
    assert provider_name("localhost", anthropic.API) == "anthropic"
    assert provider_name("localhost", rerank.API) == "openai_compatible"


def test_rerank_and_score_spans():
    attrs: dict = {}
    facts = LlmFacts(RERANK, request_model="bge-reranker", documents=3, top_n=2, results=2, input_tokens=17)
    assert genai_attributes(facts, 0, attrs) == "rerank bge-reranker"
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "rerank"
    assert (attrs[sc.OTELBPF_GEN_AI_REQUEST_DOCUMENTS], attrs[sc.OTELBPF_GEN_AI_REQUEST_TOP_N],
            attrs[sc.OTELBPF_GEN_AI_RESPONSE_RESULTS], attrs[sc.GEN_AI_USAGE_INPUT_TOKENS]) == (3, 2, 2, 17)  # fmt: skip
    assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in attrs and sc.GEN_AI_REQUEST_STREAM not in attrs
    attrs = {}
    assert genai_attributes(LlmFacts(SCORE, request_model="s", documents=1), 0, attrs) == "score s"
    assert sc.OTELBPF_GEN_AI_REQUEST_TOP_N not in attrs


def test_peer_fill_carries_cache_tokens():
    layer = GenAiLayer()
    full = LlmFacts(MESSAGES, request_model="c", response_id="msg_1", input_tokens=9, output_tokens=2,
                    cache_read_input_tokens=4, cache_creation_input_tokens=1)  # fmt: skip
    lost = LlmFacts(MESSAGES, request_model="c", response_id="msg_1")
    layer._peer_fill(full)
    layer._peer_fill(lost)
    assert (lost.input_tokens, lost.cache_read_input_tokens, lost.cache_creation_input_tokens, lost.usage_source) == (9, 4, 1, "peer")
