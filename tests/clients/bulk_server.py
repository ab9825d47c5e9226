"""A server for byte-integrity checks: the bodies it takes and gives are hashed.

  POST /upload          -> 200, body: the SHA-256 (hex) of the request body it read
  GET  /download/<n>    -> 200, n bytes of a fixed pseudo-random stream; header
                           X-Sha256: their SHA-256 (hex)

``--host`` (IPv6 too) and ``--port``; prints "listening on PORT" once ready.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 64 * 1024


def stream(size: int):
    """The same bytes for the same size, in chunks."""
    rng = random.Random(size)
    left = size
    while left:
        take = min(CHUNK, left)
        yield rng.randbytes(take)
        left -= take


class BulkHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        digest = hashlib.sha256()
        while length:
            chunk = self.rfile.read(min(CHUNK, length))
            if not chunk:
                break
            digest.update(chunk)
            length -= len(chunk)
        body = digest.hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        size = int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/download/") else 0
        digest = hashlib.sha256()
        for chunk in stream(size):
            digest.update(chunk)
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.send_header("X-Sha256", digest.hexdigest())
        self.end_headers()
        for chunk in stream(size):
            self.wfile.write(chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server_class = ThreadingHTTPServer
    if ":" in args.host:
        server_class = type("ThreadingHTTPServer6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    server = server_class((args.host, args.port), BulkHandler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
