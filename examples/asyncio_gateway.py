"""Example asyncio gateway: FastAPI on uvicorn, calling the backend with httpx.

Many requests interleave on one event-loop thread here, the case where
thread identity says nothing about which request a backend call serves.

  GET /api/items/<id>  -> backend GET /items/<id>

Prints "listening on PORT" once ready.
"""

import argparse
import asyncio
import socket

import httpx
import uvicorn
from fastapi import FastAPI, Response

app = FastAPI()
state: dict = {}


@app.get("/api/items/{item_id}")
async def get_item(item_id: str) -> Response:
    answer = await state["client"].get(f"/items/{item_id}")
    return Response(content=answer.content, status_code=answer.status_code, media_type="application/json")


async def serve(host: str, port: int, backend: str) -> None:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=f"http://{backend}", limits=limits, timeout=30) as client:
        state["client"] = client
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        config = uvicorn.Config(app, log_level="warning", access_log=False, backlog=256)
        server = uvicorn.Server(config)
        print(f"listening on {sock.getsockname()[1]}", flush=True)
        await server.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", default="127.0.0.1:8081", help="host:port of the backend")
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port, args.backend))


if __name__ == "__main__":
    main()
