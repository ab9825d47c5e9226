"""The LLM API families otelbpf reads, one module each, registered with one line each.

Adding an API (DEVELOPERS.md, "Adding an LLM API"): a module here holding an ``API``
object (a :class:`~protocols.genai.api.LlmApi`), one line in :func:`default_routes`, its
tests and a golden capture. Nothing else names an API: the per-call state
(protocols/genai/llm.py), the routing (protocols/genai/routes.py) and the span semantics
(otelbpf/semantics/genai.py) ask the API object.
"""

from __future__ import annotations

from protocols.genai.apis import anthropic, bedrock, gemini, ollama, openai, openai_responses, rerank, tgi, v2infer
from protocols.genai.routes import Routes


def default_routes() -> Routes:
    """Every LLM API otelbpf ships (routes of one key are tried in this order)."""
    routes = Routes()
    routes.register(openai.API)
    routes.register(openai_responses.API)
    routes.register(anthropic.API)
    routes.register(ollama.API)
    routes.register(rerank.API)
    routes.register(tgi.API)
    routes.register(v2infer.API)
    routes.register(gemini.API)
    routes.register(bedrock.API)
    return routes


#: The shipped APIs' routes (otelbpf/semantics/genai.py asks them per exchange).
ROUTES = default_routes()


def match_endpoint(method: str, target: str):
    """The LLM endpoint a request names (``method``, request-target), or None: :meth:`Routes.match`."""
    return ROUTES.match(method, target)
