"""The OpenAI-compatible mock (openai_mock_server.py) as a FastAPI app under uvicorn, optionally over TLS.

Same routes, answers and timing as ``openai_mock_server.py`` (its helpers
decide tokens, usage and ids), plus ``GET /v1/models``. The difference is the
server: uvicorn on asyncio, which does TLS itself (``--ssl-keyfile`` /
``--ssl-certfile``) over memory BIOs, the case where the TLS library never
sees a socket: the tests use it to check that the agent attributes that
plaintext to the right connection.

Each SSE event is one ``send`` of the streaming response (one TLS record).
With ``--server hypercorn`` the same app is served by Hypercorn instead, which
also speaks HTTP/2 in cleartext (prior knowledge, as gRPC-style clients and
``httpx.Client(http1=False, http2=True)`` use it): the tests use that for LLM
calls over HTTP/2. Prints "listening on PORT" once ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from openai_mock_server import embeddings_response, next_id, tokens_for, words

app = FastAPI()
DELAYS = {"first": 0.0, "token": 0.0}


@app.get("/v1/models")
async def models() -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "gpt-mock", "object": "model", "owned_by": "otelbpf"}]})


@app.post("/v1/chat/completions")
async def chat(request: Request):
    return await _completion(await request.json(), chat=True)


@app.post("/v1/completions")
async def completions(request: Request):
    return await _completion(await request.json(), chat=False)


@app.post("/v1/embeddings")
async def embeddings(request: Request) -> JSONResponse:
    return JSONResponse(embeddings_response(await request.json()))


async def _completion(body: dict, chat: bool):
    number = next_id()
    model = str(body.get("model", "mock-model"))
    response_id = f"chatcmpl-mock-{number}" if chat else f"cmpl-mock-{number}"
    tokens = tokens_for(body)
    finish = "length" if (body.get("max_tokens") or body.get("max_completion_tokens")) else "stop"
    prompt = words(body.get("messages")) if chat else words(body.get("prompt"))
    usage = {"prompt_tokens": prompt, "completion_tokens": len(tokens), "total_tokens": prompt + len(tokens)}
    kind = "chat.completion" if chat else "text_completion"
    first_delay, token_delay = DELAYS["first"], DELAYS["token"]
    if isinstance(body.get("mock_first_token_delay_ms"), (int, float)):
        first_delay = body["mock_first_token_delay_ms"] / 1000.0
    if isinstance(body.get("mock_token_delay_ms"), (int, float)):
        token_delay = body["mock_token_delay_ms"] / 1000.0
    base = {"id": response_id, "object": kind, "created": 1700000000, "model": f"{model}-mock"}
    if not body.get("stream"):
        await asyncio.sleep(first_delay + token_delay * max(len(tokens) - 1, 0))
        text = "".join(tokens)
        choice = {"index": 0, "finish_reason": finish}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        return JSONResponse({**base, "choices": [choice], "usage": usage})
    if chat:
        base["object"] += ".chunk"

    def event(choice: dict | None, usage_value=None) -> bytes:
        out = {**base, "choices": [choice] if choice else []}
        if usage_value is not None:
            out["usage"] = usage_value
        return f"data: {json.dumps(out)}\n\n".encode()

    async def stream():
        if chat:  # the role chunk, at once
            yield event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        for i, token in enumerate(tokens):
            await asyncio.sleep(first_delay if i == 0 else token_delay)
            yield event({"index": 0, "delta": {"content": token}, "finish_reason": None} if chat else {"index": 0, "text": token, "finish_reason": None})
        yield event({"index": 0, "delta": {}, "finish_reason": finish} if chat else {"index": 0, "text": "", "finish_reason": finish})
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            yield event(None, usage)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def serve(args) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    if args.server == "hypercorn":
        await serve_hypercorn(sock)
        return
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile
    )
    server = uvicorn.Server(config)
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    await server.serve(sockets=[sock])


async def serve_hypercorn(sock: socket.socket) -> None:
    """HTTP/1.1 and cleartext HTTP/2 (h2c prior knowledge or Upgrade) on ``sock``."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    sock.listen(128)
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    print(f"listening on {sock.getsockname()[1]}", flush=True)
    await hypercorn_serve(app, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0, help="wait before the first token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="wait between tokens")
    parser.add_argument("--ssl-keyfile", help="serve HTTPS with this private key (uvicorn does TLS itself)")
    parser.add_argument("--ssl-certfile", help="... and this certificate")
    parser.add_argument("--server", choices=("uvicorn", "hypercorn"), default="uvicorn",
                        help="uvicorn (HTTP/1.1, TLS) or hypercorn (also cleartext HTTP/2)")
    args = parser.parse_args()
    DELAYS["first"], DELAYS["token"] = args.first_token_delay_ms / 1000.0, args.token_delay_ms / 1000.0
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
