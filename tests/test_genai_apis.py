"""The LLM API plug-in point (protocols/genai/api.py, apis/, routes.py): every registered API
writes only names otelbpf/semconv.py holds and has a golden capture; routing stays a lookup by
path; an API defined outside the package works through the interface alone."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from otelbpf import semconv as sc
from otelbpf.semantics.genai import provider_name
from protocols.genai import ROUTES, Endpoint, LlmApi, LlmCall, Routes, default_routes
from protocols.genai.api import openai_style

GOLDEN = Path(__file__).resolve().parent / "golden"


def semconv_values(prefix: str) -> set[str]:
    return {value for name, value in vars(sc).items() if name.startswith(prefix) and isinstance(value, str)}


def test_every_api_names_its_provider_and_operations_from_semconv():
    providers = semconv_values("GEN_AI_PROVIDER_")
    operations = semconv_values("GEN_AI_OPERATION_") - {sc.GEN_AI_OPERATION_NAME}
    assert len(ROUTES.apis) >= 9
    for api in ROUTES.apis:
        assert isinstance(api, LlmApi) and api.name
        assert api.provider in providers, api
        assert api.operations and set(api.operations) <= operations, api
        assert provider_name("localhost", api) == api.provider


def golden_calls() -> list[tuple[str, dict]]:
    """(request path, attributes) of every GenAI span of the golden expected files."""
    out = []
    for path in sorted(GOLDEN.glob("*/*.expected.json")):
        for span in json.loads(path.read_text())["spans"]:
            attrs = span["attributes"]
            if "gen_ai.operation.name" not in attrs:
                continue
            if "url.full" in attrs:
                out.append((urlsplit(attrs["url.full"]).path, attrs))
            elif "rpc.method" in attrs:
                out.append(("/" + attrs["rpc.method"], attrs))
    return out


def test_every_registered_api_has_a_golden_capture():
    """A GenAI span of some tests/golden capture was routed to each API, with its provider
    and one of its operations: a new API comes with its capture (scripts/record_pcaps.sh)."""
    covered: dict[str, set[str]] = {}
    for path, attrs in golden_calls():
        endpoint = ROUTES.match("POST", path)
        assert endpoint is not None, path
        assert attrs["gen_ai.operation.name"] in endpoint.api.operations
        covered.setdefault(endpoint.api.name, set()).add(attrs["gen_ai.provider.name"])
    for api in ROUTES.apis:
        assert api.provider in covered.get(api.name, ()), f"no golden capture of the {api.name} API"


def test_routes_are_looked_up_by_path_not_tried_one_by_one():
    """Each claim key holds the few claims of its last segment; exact paths are one dict."""
    routes = default_routes()
    assert max(len(claims) for claims in routes.by_key.values()) <= 2  # "completions": chat, then text
    assert routes.match("POST", "/pkg.Service/Method") is None
    assert routes.match("POST", "/v1/chat/completions").api.name == "openai"


class ToyApi(LlmApi):
    """An API defined outside protocols/genai: NDJSON-free, its stream events are
    ``{"piece": ...}`` lines of SSE and its answer names ``used`` tokens."""

    name = "toy"
    provider = "openai_compatible"
    operations = ("chat",)

    def routes(self):
        yield "/toy/complete", Endpoint(self, "chat")
        yield ":toy", lambda path: Endpoint(self, "chat", path.rpartition("/")[2][:-4]) if openai_style(path) else None

    def request_facts(self, call, request, facts):
        facts.request_model = call.endpoint.model or request.get("engine")

    def event(self, call, ts_ns, name, obj):
        if obj.get("piece"):
            call.chunk(ts_ns)
        if isinstance(obj.get("used"), int):
            call.facts.output_tokens = obj["used"]


def test_an_api_plugs_in_with_its_module_and_one_registration_line():
    routes = Routes()
    routes.register(ToyApi())
    assert routes.match("POST", "/toy/complete").api.name == "toy"
    endpoint = routes.match("POST", "/v1/engines/tiny:toy?x=1")
    assert (endpoint.api.name, endpoint.model) == ("toy", "tiny")
    assert routes.match("POST", "/engines/tiny:toy") is None  # its claim said no
    call = LlmCall(endpoint)
    call.request_body(b'{"engine": "ignored"}')
    call.response_start("text/event-stream")
    for ts, piece in enumerate((b'data: {"piece": "a"}\n\n', b'data: {"piece": ""}\n\n', b'data: {"piece": "b", "used": 2}\n\n')):
        call.response_body(ts, piece)
    facts = call.finish()
    assert (facts.request_model, facts.chunks, facts.first_chunk_ns, facts.output_tokens, facts.stream) == ("tiny", 2, 0, 2, False)


def test_registration_refuses_what_would_be_ambiguous():
    routes = Routes()
    routes.register(ToyApi())
    with pytest.raises(ValueError):
        routes.register(ToyApi())  # the same name twice
    other = ToyApi()
    other.name = "toy2"
    with pytest.raises(ValueError):
        routes.register(other)  # "/toy/complete" claimed twice
