"""Peer fill of GenAI usage: when one end of a traced call lost its usage (a capture gap)
and the other end's span had it, the usage is copied across and marked
(otelbpf.genai.usage.source = peer), as gRPC method recovery does."""

from otelbpf import semconv as sc
from otelbpf.semantics.genai import GenAiLayer, genai_attributes
from protocols.genai import LlmFacts, match_endpoint

CHAT = match_endpoint("POST", "/v1/chat/completions")


def facts(response_id="chatcmpl-1", usage=True, model="m") -> LlmFacts:
    f = LlmFacts(CHAT, request_model=model, response_id=response_id, streamed=True)
    if usage:
        f.input_tokens, f.output_tokens, f.finish_reasons = 7, 200, ("length",)
    return f


def test_the_side_that_lost_usage_takes_the_peers():
    layer = GenAiLayer()
    server, client = facts(), facts(usage=False)
    layer._peer_fill(server)
    layer._peer_fill(client)
    attrs: dict = {}
    genai_attributes(client, 0, attrs)
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (7, 200)
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
    assert attrs[sc.OTELBPF_GENAI_USAGE_SOURCE] == "peer" and layer.peer_filled == 1
    server_attrs: dict = {}
    genai_attributes(server, 0, server_attrs)
    assert sc.OTELBPF_GENAI_USAGE_SOURCE not in server_attrs


def test_no_fill_from_another_call_or_model():
    layer = GenAiLayer()
    layer._peer_fill(facts("chatcmpl-1"))
    other, other_model = facts("chatcmpl-2", usage=False), facts("chatcmpl-1", usage=False, model="n")
    layer._peer_fill(other)
    layer._peer_fill(other_model)
    assert other.input_tokens is None and other_model.input_tokens is None and layer.peer_filled == 0
