"""Test server that reads a request head and closes without answering.

Prints "listening on PORT" when ready.
"""

import socket
import sys


def main() -> None:
    listener = socket.create_server(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0))
    print(f"listening on {listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        conn.close()


if __name__ == "__main__":
    main()
