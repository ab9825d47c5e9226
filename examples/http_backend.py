"""Example backend service the demo and tests trace (unmodified, stdlib only).

Routes:
  GET  /items/<id>     -> 200 JSON item (sleeps --delay-ms first)
  POST /predict        -> 200 JSON with the body's length (a stand-in model call)
  GET  /error          -> 500
  GET  /health         -> 204
  anything else        -> 404

Prints "listening on PORT" once ready, so callers can wait for it.
"""

import argparse
import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BackendHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    delay_s = 0.0

    def log_message(self, fmt, *args):  # keep the demo output readable
        pass

    def _send(self, status: int, payload=None) -> None:
        body = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/items/"):
            time.sleep(self.delay_s)
            self._send(200, {"id": self.path.rsplit("/", 1)[-1], "name": "widget", "price": 42})
        elif self.path == "/error":
            self._send(500, {"error": "backend failure"})
        elif self.path == "/health":
            self.send_response(204)
            self.end_headers()
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/predict":
            time.sleep(self.delay_s)
            self._send(200, {"received_bytes": len(body), "label": "positive"})
        else:
            self._send(404, {"error": "not found"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (an IPv6 one: IPv6)")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    args = parser.parse_args()
    BackendHandler.delay_s = args.delay_ms / 1000
    server_class = ThreadingHTTPServer
    if ":" in args.host:
        server_class = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    server = server_class((args.host, args.port), BackendHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
