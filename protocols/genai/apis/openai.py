"""The OpenAI wire format: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

Served by OpenAI, Azure OpenAI (``/openai/deployments/X/...``) and every OpenAI-compatible
engine (vLLM, SGLang, llama.cpp, TGI's ``/v1`` routes, gateways), so its suffixes are
recognised under any prefix containing ``/v1/`` or starting with ``/openai/``. Operations
``chat``, ``text_completion``, ``embeddings``; provider ``openai_compatible`` (a known API
host names its own: otelbpf/semantics/genai.py).

Request: ``model``, ``max_completion_tokens`` (else ``max_tokens``), ``temperature``,
``top_p``, ``stream``. Response (or stream chunk): ``id``, ``model``, each choice's
``finish_reason`` (by its ``index``; ``n`` > 1 keeps up to 16), ``usage``
(``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens`` as
cache read). A stream chunk is output when a choice's delta has content, text, reasoning or
tool calls. The streams of chat and text completions are unnamed JSON chunks: the HTTP/1
parser's tap reads them in place, and the chunks that can only be output are counted from
their bytes (protocols/genai/chunks.py). The protocol's defaults (protocols/genai/api.py)
are this format's; this module only claims the paths.
"""

from __future__ import annotations

from protocols.genai import chunks
from protocols.genai.api import Endpoint, LlmApi, last_segment, suffix_claim


class OpenAiApi(LlmApi):
    name = "openai"
    provider = "openai_compatible"
    operations = ("chat", "text_completion", "embeddings")
    plain_event = staticmethod(chunks.openai_event)
    sse_tap = True

    def routes(self):
        chat = Endpoint(self, "chat", tap=True)
        completion = Endpoint(self, "text_completion", tap=True)
        embeddings = Endpoint(self, "embeddings")
        for suffix, endpoint in (("/chat/completions", chat), ("/completions", completion), ("/embeddings", embeddings)):
            yield last_segment(suffix), suffix_claim(suffix, endpoint)


API = OpenAiApi()
