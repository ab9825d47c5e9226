"""A threaded HTTP/1.1 server whose handler burns CPU in burn_threaded (stdlib only).

GET /work/<n> burns about 40 ms of the handler thread's CPU, then answers 200.
Prints "listening on PORT" once ready.
"""

import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CPU_S = 0.04


def burn_threaded(cpu_s):
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        for _ in range(5000):
            pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        burn_threaded(CPU_S)
        body = b"done\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening on {server.server_address[1]}", flush=True)
server.serve_forever()
