"""A deterministic Google Gemini API server, for the tests (stdlib only).

Routes (POST, JSON bodies, as the Gemini API under ``/v1`` or ``/v1beta``; point the
``google-genai`` SDK at it with ``http_options=HttpOptions(base_url="http://HOST:PORT",
api_version="v1beta")``):

  /v1beta/models/{model}:generateContent         one answer
  /v1beta/models/{model}:streamGenerateContent   streamed: SSE with ?alt=sse (the SDK's
                                                 way; events end with CRLF CRLF as
                                                 Google's do), else one JSON array
                                                 written element by element
  /v1beta/models/{model}:embedContent            one embedding
  /v1beta/models/{model}:batchEmbedContents      one embedding per request (the SDK's
                                                 embed_content posts here)

Everything it answers is a function of the request, so a test can predict it:

* the output is ``generationConfig.maxOutputTokens`` tokens (default 5), token i being
  ``"tok{i} "``; ``finishReason`` ``MAX_TOKENS`` when that was given, else ``STOP``;
* ``usageMetadata``: ``promptTokenCount`` = the words of the contents' and the system
  instruction's text parts, ``candidatesTokenCount`` = the tokens sent,
  ``thoughtsTokenCount`` = ``generationConfig.thinkingConfig.thinkingBudget`` (or ``thinking_budget``) capped at 3
  when the request sets one, ``totalTokenCount`` their sum; a stream's events each carry
  the usage so far (as Gemini's do), the last one the whole;
* ``responseId`` ``gemini-mock-N`` (N counts requests from 1), ``modelVersion`` the path's
  model with ``-001`` appended; the model ``missing`` answers 404 with Google's error shape.

Timing: a stream waits ``--first-token-delay-ms`` before its first event (each event
carries one token), then ``--token-delay-ms`` between events, one write per event; a
single answer waits first-token delay + (tokens - 1) x token delay.

Prints "listening on PORT" once ready, so callers can wait for it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_ids = itertools.count(1)
_ids_lock = threading.Lock()
_METHODS = ("generateContent", "streamGenerateContent", "embedContent", "batchEmbedContents")


def next_id() -> int:
    with _ids_lock:
        return next(_ids)


def words(parts) -> int:
    """Words of the text parts of a content's ``parts`` (or a list of contents)."""
    total = 0
    for item in parts if isinstance(parts, list) else [parts]:
        if isinstance(item, dict):
            if isinstance(item.get("text"), str):
                total += len(item["text"].split())
            total += words(item.get("parts") or [])
        elif isinstance(item, str):
            total += len(item.split())
    return total


def route(path: str) -> tuple[str, str] | None:
    """(model, method) of ``/v1[beta]/models/{model}:{method}``, or None."""
    prefix, _, last = path.rpartition("/")
    model, _, method = last.rpartition(":")
    if not model or method not in _METHODS or not (prefix.endswith("/models") or prefix.endswith("/tunedModels")):
        return None
    return unquote(model), method


class GeminiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, chunked streaming
    first_token_delay_s = 0.0
    token_delay_s = 0.0

    def log_message(self, fmt, *args):
        pass

    def _read_json(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _send_json(self, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        url = urlsplit(self.path)
        found = route(url.path)
        request = self._read_json()
        if found is None or request is None:
            self._send_json(404 if found is None else 400, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})
            return
        model, method = found
        if model == "missing":
            message = f"models/{model} is not found for API version v1beta"
            self._send_json(404, {"error": {"code": 404, "message": message, "status": "NOT_FOUND"}})
            return
        if method in ("embedContent", "batchEmbedContents"):
            self._embed(method, request)
            return
        number = next_id()
        config = request.get("generationConfig") or {}
        limit = config.get("maxOutputTokens")
        tokens = [f"tok{i} " for i in range(int(limit or 5))]
        prompt = words(request.get("contents") or []) + words((request.get("systemInstruction") or {}).get("parts") or [])
        thinking = config.get("thinkingConfig") or {}
        budget = thinking.get("thinkingBudget", thinking.get("thinking_budget"))  # the SDK writes the proto name
        thoughts = min(int(budget), 3) if isinstance(budget, int) and budget > 0 else None
        finish = "MAX_TOKENS" if limit else "STOP"
        base = {"modelVersion": f"{model}-001", "responseId": f"gemini-mock-{number}"}

        def usage(sent: int) -> dict:
            out = {"promptTokenCount": prompt, "candidatesTokenCount": sent, "totalTokenCount": prompt + sent + (thoughts or 0)}
            if thoughts:
                out["thoughtsTokenCount"] = thoughts
            return out

        def candidate(text: str, last: bool) -> dict:
            answer = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
            if last:
                answer["finishReason"] = finish
            return answer

        first, gap = self.first_token_delay_s, self.token_delay_s
        if method == "generateContent":
            time.sleep(first + gap * max(len(tokens) - 1, 0))
            self._send_json(200, {"candidates": [candidate("".join(tokens), True)], "usageMetadata": usage(len(tokens)), **base})
            return
        sse = "alt=sse" in url.query
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if sse else "application/json; charset=UTF-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if not sse:
            self._chunk(b"[")
        for i, token in enumerate(tokens):
            time.sleep(first if i == 0 else gap)
            event = json.dumps({"candidates": [candidate(token, i == len(tokens) - 1)], "usageMetadata": usage(i + 1), **base})
            if sse:
                self._chunk(b"data: " + event.encode() + b"\r\n\r\n")
            else:
                self._chunk((event if i == 0 else "\n,\r\n" + event).encode())
        if not sse:
            self._chunk(b"\n]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _embed(self, method: str, request: dict) -> None:
        """One small deterministic vector per content (8 dimensions)."""
        items = request.get("requests") if method == "batchEmbedContents" else [request]
        items = items if isinstance(items, list) else []
        vectors = [{"values": [round((i + 1) * 0.001 * (d + 1), 6) for d in range(8)]} for i in range(len(items))]
        self._send_json(200, {"embeddings": vectors} if method == "batchEmbedContents" else {"embedding": vectors[0] if vectors else {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0, help="wait before the first token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="wait between tokens")
    args = parser.parse_args()
    GeminiHandler.first_token_delay_s = args.first_token_delay_ms / 1000.0
    GeminiHandler.token_delay_s = args.token_delay_ms / 1000.0
    server = ThreadingHTTPServer((args.host, args.port), GeminiHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
