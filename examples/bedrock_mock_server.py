"""A deterministic AWS Bedrock Runtime server, for the tests (stdlib only).

Routes (POST, as Bedrock Runtime's REST API; point boto3 at it with
``boto3.client("bedrock-runtime", endpoint_url="http://HOST:PORT", region_name=...,
aws_access_key_id=..., aws_secret_access_key=...)``: any credentials, nothing is checked):

  /model/{modelId}/converse                      Converse: one answer
  /model/{modelId}/converse-stream               ConverseStream: AWS's binary event stream
                                                 (messageStart, contentBlockDelta per token,
                                                 contentBlockStop, messageStop, metadata)
  /model/{modelId}/invoke                        InvokeModel: the model's own body format
  /model/{modelId}/invoke-with-response-stream   InvokeModelWithResponseStream: event-stream
                                                 ``chunk`` events, each the model's own
                                                 stream event, base64 in ``bytes``

The model id is percent-decoded (ids hold ``:``; ARNs ``/``). InvokeModel bodies: Anthropic's
Messages (``anthropic_version``: answered as Anthropic answers, streamed as its named events
``message_start`` ... ``message_stop``) or a prompt body (Meta Llama's ``prompt``,
``max_gen_len``: answered ``generation``, ``prompt_token_count``, ``generation_token_count``,
``stop_reason``). The last streamed chunk carries ``amazon-bedrock-invocationMetrics``.

Everything it answers is a function of the request, so a test can predict it:

* the output is ``maxTokens`` (Converse's ``inferenceConfig``), ``max_tokens`` (Anthropic)
  or ``max_gen_len`` (Llama) tokens, default 5, token i being ``"tok{i} "``; the stop reason
  ``max_tokens`` (Llama: ``length``) when that was given, else ``end_turn`` (``stop``);
* input tokens: the words of the messages' and the system prompt's text; with Converse, the
  words of system text blocks before a ``cachePoint`` block are reported as
  ``cacheReadInputTokens`` instead;
* the request id (``x-amzn-RequestId``, boto3's ``ResponseMetadata.RequestId``)
  ``bedrock-mock-N`` (N counts requests from 1); Anthropic message ids ``msg_bdrk_mock_N``;
* the model id ``missing`` answers 404 ``ResourceNotFoundException``.

Timing: a stream writes its first events at once, waits ``--first-token-delay-ms`` before
the first token's event, ``--token-delay-ms`` between tokens, one write per event; a single
answer waits first-token delay + (tokens - 1) x token delay. Every event's payload has the
``"p"`` padding field AWS adds.

Prints "listening on PORT" once ready, so callers can wait for it.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

_ids = itertools.count(1)
_ids_lock = threading.Lock()
_ACTIONS = ("converse", "converse-stream", "invoke", "invoke-with-response-stream")


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


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message of AWS's event stream (prelude, string headers, payload, CRCs)."""
    head = b""
    for name, value in headers.items():
        raw = value.encode()
        head += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(raw)) + raw
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + head + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(name: str, payload: dict) -> bytes:
    body = dict(payload, p="abcdefghijklmnopqrstuvwxyz"[: 4 + len(name) % 8])  # AWS pads events
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return event_message(headers, json.dumps(body, separators=(",", ":")).encode())


def model_chunk(payload: dict) -> bytes:
    """An invoke-with-response-stream ``chunk``: the model's event, base64."""
    return event("chunk", {"bytes": base64.b64encode(json.dumps(payload).encode()).decode()})


class BedrockHandler(BaseHTTPRequestHandler):
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

    def _send_json(self, status: int, payload: dict, request_id: str, extra: dict | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amzn-RequestId", request_id)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _start_stream(self, request_id: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.amazon.eventstream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-amzn-RequestId", request_id)
        self.send_header("X-Amzn-Bedrock-Content-Type", "application/json")
        self.end_headers()

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        path = self.path.partition("?")[0]
        model, _, action = path[len("/model/") :].partition("/") if path.startswith("/model/") else ("", "", "")
        model = unquote(model)
        request = self._read_json()
        request_id = f"bedrock-mock-{next_id()}"
        if not model or action not in _ACTIONS or request is None:
            self._send_json(400, {"message": "bad request"}, request_id, {"x-amzn-ErrorType": "ValidationException"})
            return
        if model == "missing":
            self._send_json(404, {"message": "The provided model identifier is invalid."}, request_id,
                            {"x-amzn-ErrorType": "ResourceNotFoundException"})  # fmt: skip
            return
        if action.startswith("converse"):
            self._converse(request, request_id, action == "converse-stream")
        elif "anthropic_version" in request or isinstance(request.get("messages"), list):
            self._anthropic(model, request, request_id, action != "invoke")
        else:
            self._llama(request, request_id, action != "invoke")

    def _converse(self, request: dict, request_id: str, stream: bool) -> None:
        config = request.get("inferenceConfig") or {}
        limit = config.get("maxTokens")
        tokens = [f"tok{i} " for i in range(int(limit or 5))]
        system = request.get("system") or []
        cached = 0
        for i, block in enumerate(system):
            if isinstance(block, dict) and "cachePoint" in block:
                cached = words(system[:i])
        prompt = words(request.get("messages") or []) + words(system) - cached
        usage = {"inputTokens": prompt, "outputTokens": len(tokens), "totalTokens": prompt + cached + len(tokens)}
        if cached:
            usage.update(cacheReadInputTokens=cached, cacheWriteInputTokens=0)
        stop = "max_tokens" if limit else "end_turn"
        first, gap = self.first_token_delay_s, self.token_delay_s
        if not stream:
            time.sleep(first + gap * max(len(tokens) - 1, 0))
            answer = {"output": {"message": {"role": "assistant", "content": [{"text": "".join(tokens)}]}},
                      "stopReason": stop, "usage": usage, "metrics": {"latencyMs": 1}}  # fmt: skip
            self._send_json(200, answer, request_id)
            return
        self._start_stream(request_id)
        self._write(event("messageStart", {"role": "assistant"}))
        for i, token in enumerate(tokens):
            time.sleep(first if i == 0 else gap)
            self._write(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": token}}))
        self._write(event("contentBlockStop", {"contentBlockIndex": 0}))
        self._write(event("messageStop", {"stopReason": stop}))
        self._write(event("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
        self._end_stream()

    def _anthropic(self, model: str, request: dict, request_id: str, stream: bool) -> None:
        limit = request.get("max_tokens")
        tokens = [f"tok{i} " for i in range(int(limit or 5))]
        prompt = words(request.get("messages") or []) + words(request.get("system") or "")
        stop = "max_tokens" if limit else "end_turn"
        message_id = "msg_bdrk_mock_" + request_id.rsplit("-", 1)[1]
        metrics = {"inputTokenCount": prompt, "outputTokenCount": len(tokens), "invocationLatency": 1, "firstByteLatency": 1}
        first, gap = self.first_token_delay_s, self.token_delay_s
        if not stream:
            time.sleep(first + gap * max(len(tokens) - 1, 0))
            answer = {"id": message_id, "type": "message", "role": "assistant", "model": model,
                      "content": [{"type": "text", "text": "".join(tokens)}], "stop_reason": stop, "stop_sequence": None,
                      "usage": {"input_tokens": prompt, "output_tokens": len(tokens)}}  # fmt: skip
            self._send_json(200, answer, request_id, {"X-Amzn-Bedrock-Input-Token-Count": str(prompt),
                                                      "X-Amzn-Bedrock-Output-Token-Count": str(len(tokens))})  # fmt: skip
            return
        self._start_stream(request_id)
        start = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None, "usage": {"input_tokens": prompt, "output_tokens": 1}}  # fmt: skip
        self._write(model_chunk({"type": "message_start", "message": start}))
        self._write(model_chunk({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}))
        for i, token in enumerate(tokens):
            time.sleep(first if i == 0 else gap)
            self._write(model_chunk({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": token}}))
        self._write(model_chunk({"type": "content_block_stop", "index": 0}))
        self._write(model_chunk({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": len(tokens)}}))  # fmt: skip
        self._write(model_chunk({"type": "message_stop", "amazon-bedrock-invocationMetrics": metrics}))
        self._end_stream()

    def _llama(self, request: dict, request_id: str, stream: bool) -> None:
        limit = request.get("max_gen_len")
        tokens = [f"tok{i} " for i in range(int(limit or 5))]
        prompt = words(request.get("prompt") or "")
        stop = "length" if limit else "stop"
        first, gap = self.first_token_delay_s, self.token_delay_s
        if not stream:
            time.sleep(first + gap * max(len(tokens) - 1, 0))
            answer = {"generation": "".join(tokens), "prompt_token_count": prompt, "generation_token_count": len(tokens),
                      "stop_reason": stop}  # fmt: skip
            self._send_json(200, answer, request_id)
            return
        self._start_stream(request_id)
        metrics = {"inputTokenCount": prompt, "outputTokenCount": len(tokens), "invocationLatency": 1, "firstByteLatency": 1}
        for i, token in enumerate(tokens):
            time.sleep(first if i == 0 else gap)
            last = i == len(tokens) - 1
            chunk = {"generation": token, "prompt_token_count": prompt if i == 0 else None,
                     "generation_token_count": i + 1, "stop_reason": stop if last else None}  # fmt: skip
            if last:
                chunk["amazon-bedrock-invocationMetrics"] = metrics
            self._write(model_chunk(chunk))
        self._end_stream()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0, help="wait before the first token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="wait between tokens")
    args = parser.parse_args()
    BedrockHandler.first_token_delay_s = args.first_token_delay_ms / 1000.0
    BedrockHandler.token_delay_s = args.token_delay_ms / 1000.0
    server = ThreadingHTTPServer((args.host, args.port), BedrockHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
