"""A deterministic OpenAI-compatible API server, for the demo and the tests (stdlib only).

Routes (POST, JSON bodies, as the OpenAI API):

  /v1/chat/completions   chat; streamed (SSE) when "stream": true
  /v1/completions        legacy text completions; streamed likewise
  /v1/embeddings         embeddings of "input" (a string or a list of strings)
  /v1/messages           the Anthropic Messages API (the anthropic SDK with
                         base_url = this server); streamed as Anthropic's named
                         SSE events when "stream": true
  /v1/rerank, /rerank, /v2/rerank
                         rerank "documents" against "query" (vLLM / Jina / Cohere
                         shape: results by relevance, top_n of them, usage)
  /v1/score, /score      vLLM's score API: "text_1" against each of "text_2"
  /v1/responses          OpenAI's Responses API ("input", "max_output_tokens"); streamed as
                         its named SSE events when "stream": true
  /api/chat, /api/generate, /api/embed
                         Ollama's own API (the ollama Python client with host = this
                         server); chat and generate stream NDJSON lines unless
                         "stream": false
  /generate, /generate_stream, /
                         Hugging Face TGI's native API ("inputs", "parameters"):
                         huggingface_hub's InferenceClient(model=this server)
                         .text_generation posts to / ("stream": true streams)

The TGI routes: ``parameters.max_new_tokens`` tokens, finish reason ``length``; without
it 4 tokens and an EOS token (``special``, text ``</s>``), finish reason ``eos_token``.
``details`` (when ``parameters.details``): ``generated_tokens`` (the EOS counted),
``prefill`` with one entry per word of ``inputs`` when ``decoder_input_details``,
the tokens; a stream's last event carries ``generated_text`` and ``details`` with
``input_length`` (the words of ``inputs``), every other one ``"generated_text":null``,
as TGI writes them (compact JSON, ``data:`` without a space). ``/`` answers a
one-element list unless streamed; ``/generate`` an object. Delays as below.

The Responses route: ``max_output_tokens`` tokens (default 5) as above; status
``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens`` when that was given,
else ``completed``; ``usage`` with ``input_tokens`` (the words of ``instructions`` and
``input``), ``output_tokens``, ``input_tokens_details.cached_tokens`` 0; ids ``resp_mock_N``.
Streamed as OpenAI sends it: ``response.created``, ``response.in_progress``,
``response.output_item.added`` and ``response.content_part.added`` at once, one
``response.output_text.delta`` per token (delays as below), then ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and ``response.completed``
(``response.incomplete`` when cut at ``max_output_tokens``) with the whole response.

The Ollama routes: ``options.num_predict`` tokens (default 5); ``prompt_eval_count`` the words
of the messages or prompt, ``eval_count`` the tokens, ``done_reason`` ``length`` when
``num_predict`` was given, else ``stop``; streamed as one NDJSON line per token
(``"done": false``) and a last line (``"done": true``) with the counts; ``/api/embed``: one
vector per input.

The Anthropic route: the output is ``min(max_tokens, mock_output_tokens or 5)``
tokens as above, ``stop_reason`` ``max_tokens`` when that is ``max_tokens``, else
``end_turn``; ``input_tokens`` counts the words of the system prompt and the
messages, except those of content blocks marked ``cache_control``, reported as
``cache_read_input_tokens`` (``cache_creation_input_tokens`` instead when the request
sets the extra field ``mock_cache_write``); ids ``msg_mock_N``. Streamed:
``message_start`` (id, model, input usage), ``content_block_start`` and ``ping`` at
once, then one ``content_block_delta`` per token (first-token and token delays
as above), ``content_block_stop``, ``message_delta`` (stop_reason, cumulative
usage), ``message_stop``.

Everything it answers is a function of the request, so a test can predict it:

* the output is ``max_tokens`` tokens (default 5), token i being ``"tok{i} "``
  padded with ``x`` to ``mock_token_bytes`` bytes when the request sets that
  extra field (to make long responses);
* usage: ``prompt_tokens`` = the number of whitespace-separated words in the
  prompt (message contents, prompt or input), ``completion_tokens`` = the
  tokens sent; finish reason ``length`` when ``max_tokens`` was given, else ``stop``;
* ids ``chatcmpl-mock-N`` / ``cmpl-mock-N`` (N counts requests from 1); the
  response model is the request's model with ``-mock`` appended.

Timing (the point of the mock): a streamed response sends its role chunk at
once (as vLLM does), waits ``--first-token-delay-ms`` before the first token
and ``--token-delay-ms`` between tokens (a request may override them with the
extra fields ``mock_first_token_delay_ms`` / ``mock_token_delay_ms``); the usage chunk comes last when the
request asks for it (``stream_options: {include_usage: true}``), then
``data: [DONE]``. A non-streamed response waits first-token delay + (tokens - 1)
x token delay before it answers. Each SSE event is one chunk, written with one
``write``, unless the server is bursty: ``--burst-events N`` (or the request's extra
field ``mock_burst_events``) writes the token events N per ``write`` (0: all of them
in one), one token delay apart, as real engines deliver them; the finish, usage and
``[DONE]`` events then go together in one last write. With ``--gather`` (or the extra
field ``mock_gather``) a burst is one ``sendmsg`` with a buffer per chunk instead, as
asyncio's ``writelines`` sends them. ``--ssl-certfile`` / ``--ssl-keyfile`` serve HTTPS
(Python's ssl on the socket: one SSL_write per write).

Prints "listening on PORT" once ready, so callers can wait for it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def next_id() -> int:
    with _ids_lock:
        return next(_ids)


def words(value) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(words(item) for item in value)
    if isinstance(value, dict):
        return words(value.get("content", "")) + words(value.get("text", ""))
    return 0


def cached_words(value) -> int:
    """Words of the Anthropic content blocks marked ``cache_control``."""
    if isinstance(value, list):
        return sum(cached_words(item) for item in value)
    if isinstance(value, dict):
        if value.get("cache_control"):
            return words(value.get("text", ""))
        return cached_words(value.get("content"))
    return 0


def rerank_response(request: dict, number: int) -> dict:
    """Rerank: each document's score falls with its index (0.9, 0.8, ...); top_n of them."""
    model = str(request.get("model", "mock-reranker"))
    query = request.get("query", "")
    documents = request.get("documents") or []
    documents = documents if isinstance(documents, list) else [documents]
    results = [
        {"index": i, "document": {"text": d if isinstance(d, str) else (d or {}).get("text", "")},
         "relevance_score": round(0.9 / (i + 1), 6)}
        for i, d in enumerate(documents)
    ]  # fmt: skip
    top_n = request.get("top_n")
    if isinstance(top_n, int) and top_n >= 0:
        results = results[:top_n]
    if request.get("return_documents") is False:
        for result in results:
            del result["document"]
    tokens = words(query) * len(documents) + words(documents)
    return {"id": f"rerank-mock-{number}", "model": f"{model}-mock", "usage": {"total_tokens": tokens}, "results": results}


def score_response(request: dict, number: int) -> dict:
    """vLLM's score API: text_1 against each of text_2."""
    model = str(request.get("model", "mock-scorer"))
    first, second = request.get("text_1", ""), request.get("text_2", "")
    second = second if isinstance(second, list) else [second]
    data = [{"index": i, "object": "score", "score": round(0.9 / (i + 1), 6)} for i in range(len(second))]
    tokens = words(first) * len(second) + words(second)
    return {"id": f"score-mock-{number}", "object": "list", "created": 1700000000, "model": f"{model}-mock",
            "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def tokens_for(request: dict) -> list[str]:
    count = request.get("max_tokens") or request.get("max_completion_tokens") or 5
    size = int(request.get("mock_token_bytes") or 0)
    out = []
    for i in range(int(count)):
        token = f"tok{i} "
        if len(token) < size:
            token = f"tok{i}" + "x" * (size - len(token) - 1) + " "
        out.append(token)
    return out



def embeddings_response(request: dict) -> dict:
    """The embeddings answer: one small deterministic vector per input."""
    model = str(request.get("model", "mock-embedding"))
    inputs = request.get("input", "")
    inputs = inputs if isinstance(inputs, list) else [inputs]
    dimensions = int(request.get("dimensions") or 8)
    data = [
        {"object": "embedding", "index": i, "embedding": [round((i + 1) * 0.001 * (d + 1), 6) for d in range(dimensions)]}
        for i in range(len(inputs))
    ]
    prompt = words(inputs)
    return {"object": "list", "data": data, "model": f"{model}-mock", "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}

class MockHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, chunked streaming
    first_token_delay_s = 0.0
    token_delay_s = 0.0
    burst_events: int | None = None  # None: one write per event
    gather = False  # bursts with sendmsg, a buffer per chunk (--gather)

    def log_message(self, fmt, *args):
        pass

    # -- plumbing ----------------------------------------------------------------

    def _read_json(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _send_json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _event(self, payload, held: list | None = None, name: str = "") -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        event = (f"event: {name}\n" if name else "") + f"data: {data}\n\n"
        event = event.encode()
        framed = b"%x\r\n%s\r\n" % (len(event), event)  # one chunk
        if held is not None:
            held.append(framed)  # written with the burst it belongs to
        else:
            self.wfile.write(framed)  # one write

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _write_burst(self, held: list[bytes], gather: bool) -> None:
        """A burst's chunks in one write, or with ``gather`` in one sendmsg, a buffer per
        chunk (as asyncio's writelines sends them on Python 3.12+)."""
        if not gather:
            self.wfile.write(b"".join(held))
            return
        sent = self.connection.sendmsg(held)
        rest = b"".join(held)[sent:]
        if rest:  # a partial send (a signal): the rest plainly
            self.connection.sendall(rest)

    # -- routes --------------------------------------------------------------------

    def do_POST(self):
        request = self._read_json()
        if request is None:
            self._send_json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
            return
        path = self.path.partition("?")[0]
        if path == "/v1/chat/completions":
            self._completion(request, chat=True)
        elif path == "/v1/completions":
            self._completion(request, chat=False)
        elif path == "/v1/embeddings":
            self._embeddings(request)
        elif path == "/v1/messages":
            self._messages(request)
        elif path in ("/v1/rerank", "/rerank", "/v2/rerank"):
            self._send_json(200, rerank_response(request, next_id()))
        elif path == "/v1/responses":
            self._responses(request)
        elif path in ("/api/chat", "/api/generate"):
            self._ollama(request, chat=path == "/api/chat")
        elif path == "/api/embed":
            self._ollama_embed(request)
        elif path in ("/generate", "/generate_stream", "/"):
            self._tgi(request, stream=path == "/generate_stream" or (path == "/" and request.get("stream") is True),
                      listed=path == "/")
        elif path in ("/v1/score", "/score"):
            self._send_json(200, score_response(request, next_id()))
        else:
            self._send_json(404, {"error": {"message": f"no route {path}", "type": "invalid_request_error"}})

    def _completion(self, request: dict, chat: bool) -> None:
        number = next_id()
        model = str(request.get("model", "mock-model"))
        response_id = f"chatcmpl-mock-{number}" if chat else f"cmpl-mock-{number}"
        response_model = f"{model}-mock"
        tokens = tokens_for(request)
        finish = "length" if (request.get("max_tokens") or request.get("max_completion_tokens")) else "stop"
        prompt = words(request.get("messages")) if chat else words(request.get("prompt"))
        usage = {"prompt_tokens": prompt, "completion_tokens": len(tokens), "total_tokens": prompt + len(tokens)}
        created = 1700000000
        kind = "chat.completion" if chat else "text_completion"
        first_delay, token_delay = self.first_token_delay_s, self.token_delay_s
        if isinstance(request.get("mock_first_token_delay_ms"), (int, float)):
            first_delay = request["mock_first_token_delay_ms"] / 1000.0
        if isinstance(request.get("mock_token_delay_ms"), (int, float)):
            token_delay = request["mock_token_delay_ms"] / 1000.0
        if not request.get("stream"):
            time.sleep(first_delay + token_delay * max(len(tokens) - 1, 0))
            text = "".join(tokens)
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            self._send_json(
                200,
                {"id": response_id, "object": kind, "created": created, "model": response_model, "choices": [choice], "usage": usage},
            )
            return
        kind += ".chunk" if chat else ""

        def chunk(choice: dict, usage_value=None) -> dict:
            out = {"id": response_id, "object": kind, "created": created, "model": response_model}
            out["choices"] = [choice] if choice else []
            if usage_value is not None:
                out["usage"] = usage_value
            return out

        burst = self.burst_events
        if isinstance(request.get("mock_burst_events"), int):
            burst = request["mock_burst_events"]
        gather = bool(request.get("mock_gather", self.gather))
        self._start_stream()
        if chat:  # the role chunk, at once (vLLM does this before the first token)
            self._event(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
        if burst is None:
            for i, token in enumerate(tokens):
                time.sleep(first_delay if i == 0 else token_delay)
                if chat:
                    self._event(chunk({"index": 0, "delta": {"content": token}, "finish_reason": None}))
                else:
                    self._event(chunk({"index": 0, "text": token, "finish_reason": None}))
        else:  # bursty: several events per write
            time.sleep(first_delay)
            size = burst if burst > 0 else max(len(tokens), 1)
            for start in range(0, len(tokens), size):
                if start:
                    time.sleep(token_delay)
                held: list[bytes] = []
                for token in tokens[start : start + size]:
                    delta = {"content": token} if chat else None
                    self._event(chunk({"index": 0, "delta": delta, "finish_reason": None} if chat
                                      else {"index": 0, "text": token, "finish_reason": None}), held)
                self._write_burst(held, gather)
        held = [] if burst is not None else None
        last = {"index": 0, "delta": {}, "finish_reason": finish} if chat else {"index": 0, "text": "", "finish_reason": finish}
        self._event(chunk(last), held)
        options = request.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            self._event(chunk({}, usage), held)
        self._event("[DONE]", held)
        if held is not None:
            self._write_burst(held + [b"0\r\n\r\n"], gather)
            return
        self._end_stream()

    def _embeddings(self, request: dict) -> None:
        self._send_json(200, embeddings_response(request))

    def _messages(self, request: dict) -> None:
        """The Anthropic Messages API."""
        number = next_id()
        model = str(request.get("model", "claude-mock"))
        max_tokens = int(request.get("max_tokens") or 1024)
        count = min(max_tokens, int(request.get("mock_output_tokens") or 5))
        tokens = tokens_for({"max_tokens": count, "mock_token_bytes": request.get("mock_token_bytes")})
        stop = "max_tokens" if count == max_tokens else "end_turn"
        system, messages = request.get("system"), request.get("messages")
        cached = cached_words(system) + cached_words(messages)
        usage = {"input_tokens": words(system) + words(messages) - cached, "output_tokens": len(tokens),
                 "cache_creation_input_tokens": cached if request.get("mock_cache_write") else 0,
                 "cache_read_input_tokens": 0 if request.get("mock_cache_write") else cached}
        message = {"id": f"msg_mock_{number}", "type": "message", "role": "assistant", "model": f"{model}-mock",
                   "content": [], "stop_reason": None, "stop_sequence": None}
        first_delay, token_delay = self.first_token_delay_s, self.token_delay_s
        if isinstance(request.get("mock_first_token_delay_ms"), (int, float)):
            first_delay = request["mock_first_token_delay_ms"] / 1000.0
        if isinstance(request.get("mock_token_delay_ms"), (int, float)):
            token_delay = request["mock_token_delay_ms"] / 1000.0
        if not request.get("stream"):
            time.sleep(first_delay + token_delay * max(len(tokens) - 1, 0))
            message.update(content=[{"type": "text", "text": "".join(tokens)}], stop_reason=stop, usage=usage)
            self._send_json(200, message)
            return
        self._start_stream()
        start_usage = dict(usage, output_tokens=1)
        self._event({"type": "message_start", "message": dict(message, usage=start_usage)}, name="message_start")
        self._event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    name="content_block_start")
        self._event({"type": "ping"}, name="ping")
        for i, token in enumerate(tokens):
            time.sleep(first_delay if i == 0 else token_delay)
            self._event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token}},
                        name="content_block_delta")
        self._event({"type": "content_block_stop", "index": 0}, name="content_block_stop")
        self._event({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
                    name="message_delta")
        self._event({"type": "message_stop"}, name="message_stop")
        self._end_stream()


    def _delays(self, request: dict) -> tuple[float, float]:
        """First-token and between-token delays, the request's extra fields winning."""
        first_delay, token_delay = self.first_token_delay_s, self.token_delay_s
        if isinstance(request.get("mock_first_token_delay_ms"), (int, float)):
            first_delay = request["mock_first_token_delay_ms"] / 1000.0
        if isinstance(request.get("mock_token_delay_ms"), (int, float)):
            token_delay = request["mock_token_delay_ms"] / 1000.0
        return first_delay, token_delay

    def _responses(self, request: dict) -> None:
        """OpenAI's Responses API."""
        number = next_id()
        model = str(request.get("model", "mock-model"))
        limit = request.get("max_output_tokens")
        tokens = tokens_for({"max_tokens": limit or 5, "mock_token_bytes": request.get("mock_token_bytes")})
        prompt = words(request.get("instructions")) + words(request.get("input"))
        usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": len(tokens),
                 "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + len(tokens)}
        response = {"id": f"resp_mock_{number}", "object": "response", "created_at": 1700000000, "model": f"{model}-mock",
                    "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
        text = "".join(tokens)
        item = {"id": f"msg_mock_{number}", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}
        done = dict(response, status="incomplete" if limit else "completed", output=[item], usage=usage,
                    incomplete_details={"reason": "max_output_tokens"} if limit else None)
        first_delay, token_delay = self._delays(request)
        if not request.get("stream"):
            time.sleep(first_delay + token_delay * max(len(tokens) - 1, 0))
            self._send_json(200, done)
            return
        self._start_stream()
        sequence = iter(range(1_000_000))
        self._event({"type": "response.created", "sequence_number": next(sequence), "response": response},
                    name="response.created")
        self._event({"type": "response.in_progress", "sequence_number": next(sequence), "response": response},
                    name="response.in_progress")
        opened = dict(item, status="in_progress", content=[])
        self._event({"type": "response.output_item.added", "sequence_number": next(sequence), "output_index": 0,
                     "item": opened}, name="response.output_item.added")
        part = {"type": "output_text", "text": "", "annotations": []}
        self._event({"type": "response.content_part.added", "sequence_number": next(sequence), "item_id": item["id"],
                     "output_index": 0, "content_index": 0, "part": part}, name="response.content_part.added")
        for i, token in enumerate(tokens):
            time.sleep(first_delay if i == 0 else token_delay)
            self._event({"type": "response.output_text.delta", "sequence_number": next(sequence), "item_id": item["id"],
                         "output_index": 0, "content_index": 0, "delta": token}, name="response.output_text.delta")
        self._event({"type": "response.output_text.done", "sequence_number": next(sequence), "item_id": item["id"],
                     "output_index": 0, "content_index": 0, "text": text}, name="response.output_text.done")
        self._event({"type": "response.content_part.done", "sequence_number": next(sequence), "item_id": item["id"],
                     "output_index": 0, "content_index": 0, "part": item["content"][0]}, name="response.content_part.done")
        self._event({"type": "response.output_item.done", "sequence_number": next(sequence), "output_index": 0,
                     "item": item}, name="response.output_item.done")
        event = "response.incomplete" if limit else "response.completed"
        self._event({"type": event, "sequence_number": next(sequence), "response": done}, name=event)
        self._end_stream()

    def _ollama(self, request: dict, chat: bool) -> None:
        """Ollama's /api/chat and /api/generate: NDJSON lines unless "stream": false."""
        model = str(request.get("model", "mock-model"))
        options = request.get("options") if isinstance(request.get("options"), dict) else {}
        limit = options.get("num_predict")
        tokens = tokens_for({"max_tokens": limit or 5, "mock_token_bytes": request.get("mock_token_bytes")})
        prompt = words(request.get("messages")) if chat else words(request.get("prompt"))
        created = "2023-11-14T22:13:20Z"

        def line(token: str | None) -> dict:
            out = {"model": model, "created_at": created}
            if chat:
                out["message"] = {"role": "assistant", "content": token or ""}
            else:
                out["response"] = token or ""
            out["done"] = token is None
            if token is None:
                out.update(done_reason="length" if limit else "stop", total_duration=1000, load_duration=10,
                           prompt_eval_count=prompt, prompt_eval_duration=100, eval_count=len(tokens), eval_duration=800)
            return out

        first_delay, token_delay = self._delays(request)
        if request.get("stream") is False:
            time.sleep(first_delay + token_delay * max(len(tokens) - 1, 0))
            answer = line(None)
            if chat:
                answer["message"]["content"] = "".join(tokens)
            else:
                answer["response"] = "".join(tokens)
            self._send_json(200, answer)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i, token in enumerate(tokens + [None]):
            time.sleep(first_delay if i == 0 else token_delay)
            data = (json.dumps(line(token)) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self._end_stream()

    def _ollama_embed(self, request: dict) -> None:
        inputs = request.get("input")
        texts = inputs if isinstance(inputs, list) else [inputs]
        vectors = [[round(0.01 * (i + 1) * (j + 1), 4) for j in range(4)] for i in range(len(texts))]
        self._send_json(200, {"model": str(request.get("model", "mock-embed")), "embeddings": vectors,
                              "total_duration": 1000, "load_duration": 10, "prompt_eval_count": words(texts)})

    def _tgi(self, request: dict, stream: bool, listed: bool) -> None:
        """Hugging Face TGI's native API."""
        inputs = request.get("inputs")
        if not isinstance(inputs, str):
            body = json.dumps({"error": "Input validation error: `inputs` must be a string", "error_type": "validation"})
            self._send_json(422, json.loads(body))
            return
        params = request.get("parameters") if isinstance(request.get("parameters"), dict) else {}
        limit = params.get("max_new_tokens")
        texts = tokens_for({"max_tokens": limit or 4, "mock_token_bytes": request.get("mock_token_bytes")})
        tokens = [{"id": 100 + i, "text": t, "logprob": -0.5, "special": False} for i, t in enumerate(texts)]
        if limit:
            finish = "length"
        else:
            finish = "eos_token"
            tokens.append({"id": 2, "text": "</s>", "logprob": -0.1, "special": True})
        text = "".join(texts)
        first_delay, token_delay = self.first_token_delay_s, self.token_delay_s
        if isinstance(request.get("mock_first_token_delay_ms"), (int, float)):
            first_delay = request["mock_first_token_delay_ms"] / 1000.0
        if isinstance(request.get("mock_token_delay_ms"), (int, float)):
            token_delay = request["mock_token_delay_ms"] / 1000.0
        seed = params.get("seed")
        if not stream:
            time.sleep(first_delay + token_delay * max(len(tokens) - 1, 0))
            answer: dict = {"generated_text": text}
            if params.get("details"):
                prefill = [{"id": 1000 + i, "text": w, "logprob": None}
                           for i, w in enumerate(inputs.split())] if params.get("decoder_input_details") else []
                answer["details"] = {"finish_reason": finish, "generated_tokens": len(tokens), "seed": seed,
                                     "prefill": prefill, "tokens": tokens}
            body = json.dumps([answer] if listed else answer, separators=(",", ":")).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("x-generated-tokens", str(len(tokens)))
            self.end_headers()
            self.wfile.write(body)
            return
        self._start_stream()
        for i, token in enumerate(tokens):
            time.sleep(first_delay if i == 0 else token_delay)
            event = {"index": i + 1, "token": token, "generated_text": None, "details": None, "top_tokens": None}
            if i == len(tokens) - 1:
                event["generated_text"] = text
                event["details"] = {"finish_reason": finish, "generated_tokens": len(tokens), "seed": seed,
                                    "input_length": len(inputs.split())}
            data = f"data:{json.dumps(event, separators=(',', ':'))}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self._end_stream()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0, help="wait before the first token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="wait between tokens")
    parser.add_argument("--burst-events", type=int, default=None,
                        help="write token events N per write (0: all in one), as real engines deliver bursts")
    parser.add_argument("--gather", action="store_true",
                        help="write each burst with sendmsg, one buffer per chunk (plain HTTP only)")
    parser.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM; with --ssl-keyfile)")
    parser.add_argument("--ssl-keyfile", help="the certificate's private key (PEM)")
    args = parser.parse_args()
    MockHandler.burst_events = args.burst_events
    MockHandler.gather = args.gather
    MockHandler.first_token_delay_s = args.first_token_delay_ms / 1000.0
    MockHandler.token_delay_s = args.token_delay_ms / 1000.0
    server = ThreadingHTTPServer((args.host, args.port), MockHandler)
    server.daemon_threads = True
    if args.ssl_certfile:  # TLS on the socket (OpenSSL's SSL_write sees each burst whole)
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
