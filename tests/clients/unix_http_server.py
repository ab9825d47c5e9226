"""HTTP/1.1 server on a Unix domain socket (stdlib), like a local model server.

Usage: unix_http_server.py SOCKET_PATH. Prints "listening on 0" when ready
(the port is meaningless for a Unix socket). GET /items/<id> -> 200 JSON.
"""

import json
import os
import socketserver
import sys
from http.server import BaseHTTPRequestHandler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def address_string(self):
        return "unix"

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200 if self.path.startswith("/items/") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> None:
    path = sys.argv[1]
    if os.path.exists(path):
        os.unlink(path)
    server = Server(path, Handler)
    print("listening on 0", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
