"""Test server that sends its response body with sendfile(2), like nginx does
for static files: the body never passes through a read/write the probes see.

Prints "listening on PORT" when ready. Serves GET /file (SIZE bytes).
"""

import os
import socket
import sys
import tempfile
import threading


def serve(conn: socket.socket, path: str, size: int) -> None:
    with conn:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
            _, buf = buf.split(b"\r\n\r\n", 1)
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nContent-Type: application/octet-stream\r\n\r\n".encode())
            with open(path, "rb") as f:
                conn.sendfile(f)


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    fd, path = tempfile.mkstemp()
    os.write(fd, os.urandom(size))
    os.close(fd)
    listener = socket.create_server(("127.0.0.1", 0))
    print(f"listening on {listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, path, size), daemon=True).start()


if __name__ == "__main__":
    main()
