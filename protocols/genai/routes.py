"""Which request paths are LLM API calls: :class:`Routes`, the table the registered APIs
(protocols/genai/apis/) fill, asked once per HTTP exchange that starts.

Each API claims exact paths (``/api/chat``) and keys on the path's last segment
(``completions``; for a ``name:method`` segment, its ``:method`` part, as Gemini's
``models/{model}:generateContent``), each key with a check of the whole path
(:meth:`~protocols.genai.api.LlmApi.routes`). Matching is a dict lookup of the path,
then of its key, then the few checks registered under that key (in registration order):
the cost does not grow with the number of APIs, and a request to no LLM endpoint (most
POSTs: gRPC's) ends after two lookups. Compiled (routes.pxd): otelbpf/semantics/genai.py
calls :meth:`Routes.match` as a C method.
"""

from __future__ import annotations


class Routes:
    """Request paths -> the :class:`~protocols.genai.facts.Endpoint` of the API that claims them."""

    def __init__(self) -> None:
        #: The registered APIs, in registration order.
        self.apis: list = []
        #: Exact paths -> their Endpoint; keys of the last path segment -> their claims, in order.
        self.exact: dict = {}
        self.by_key: dict = {}

    def register(self, api) -> None:
        """Add an API (an :class:`~protocols.genai.api.LlmApi`): its routes are tried after
        those of the APIs registered before it. An exact path is claimed once."""
        if not api.name or api.name in [known.name for known in self.apis]:
            raise ValueError(f"LLM API {api.name!r}: no name, or registered twice")
        for key, claim in api.routes():
            if key.startswith("/"):
                if key in self.exact:
                    raise ValueError(f"path {key!r} is claimed by {self.exact[key].api.name} and {api.name}")
                self.exact[key] = claim
            else:
                self.by_key[key] = self.by_key.get(key, ()) + (claim,)
        self.apis.append(api)

    def match(self, method: str, target: str):
        """The LLM endpoint a request names (``method``, request-target), or None. Cheap:
        string steps and dict lookups."""
        if method != "POST" or not target:
            return None
        if target[0] != "/":
            if not target.startswith(("http://", "https://")):
                return None  # absolute-form only (a proxy's request); no authority-form or "*"
            rest = target.partition("://")[2]
            slash = rest.find("/")
            target = rest[slash:] if slash >= 0 else "/"
        path = target
        cut = path.find("?")
        if cut >= 0:
            path = path[:cut]
        cut = path.find("#")
        if cut >= 0:
            path = path[:cut]
        if len(path) > 1 and path[-1] == "/":
            path = path[:-1]
        endpoint = self.exact.get(path or "/")
        if endpoint is not None:
            return endpoint
        key = path[path.rfind("/") + 1 :]
        cut = key.rfind(":")
        if cut >= 0:
            key = key[cut:]
        claims = self.by_key.get(key)
        if claims is None:
            return None
        for claim in claims:
            endpoint = claim(path)
            if endpoint is not None:
                return endpoint
        return None
