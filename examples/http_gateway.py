"""Example gateway service: forwards /api/... to the backend (stdlib only).

Each handler thread keeps one keep-alive connection to the backend, like a
typical connection-pooling HTTP client.

  GET  /api/items/<id>  -> backend GET /items/<id>
  POST /api/predict     -> backend POST /predict
  GET  /api/error       -> backend GET /error (500 passes through as 502)

With --keep-path the path is forwarded unchanged (to chain gateways), and
with --fresh-connections every backend call opens a new connection.

Prints "listening on PORT" once ready.
"""

import argparse
import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_local = threading.local()


def backend_connection(host: str, port: int, fresh: bool) -> http.client.HTTPConnection:
    conn = getattr(_local, "conn", None)
    if conn is None or fresh:
        if conn is not None:
            conn.close()
        conn = _local.conn = http.client.HTTPConnection(host, port, timeout=10)
    return conn


class GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    backend_host = "127.0.0.1"
    backend_port = 8081
    keep_path = False
    fresh_connections = False

    def log_message(self, fmt, *args):
        pass

    def _call_backend(self, method: str, path: str, body: bytes | None = None):
        headers = {"Content-Type": "application/json"} if body else {}
        for attempt in range(2):  # one retry if the kept-alive connection went stale
            conn = backend_connection(self.backend_host, self.backend_port, self.fresh_connections)
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                _local.conn = None
                if attempt:
                    raise
        raise RuntimeError("unreachable")

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _backend_path(self, path: str) -> str:
        return self.path if self.keep_path else path

    def do_GET(self):
        if self.path.startswith("/api/items/"):
            status, body = self._call_backend("GET", self._backend_path(self.path[len("/api"):]))
            self._reply(status, body)
        elif self.path == "/api/error":
            status, body = self._call_backend("GET", self._backend_path("/error"))
            self._reply(502 if status >= 500 else status, body)
        else:
            self._reply(404, json.dumps({"error": "not found"}).encode())

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/api/predict":
            status, answer = self._call_backend("POST", self._backend_path("/predict"), body)
            self._reply(status, answer)
        else:
            self._reply(404, json.dumps({"error": "not found"}).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", default="127.0.0.1:8081", help="host:port of the backend")
    parser.add_argument("--keep-path", action="store_true", help="forward /api/... unchanged (chain gateways)")
    parser.add_argument("--fresh-connections", action="store_true", help="a new backend connection per call")
    args = parser.parse_args()
    host, _, port = args.backend.rpartition(":")
    GatewayHandler.backend_host, GatewayHandler.backend_port = host, int(port)
    GatewayHandler.keep_path = args.keep_path
    GatewayHandler.fresh_connections = args.fresh_connections
    server = ThreadingHTTPServer((args.host, args.port), GatewayHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
