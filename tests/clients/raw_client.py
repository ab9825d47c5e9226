"""Test client speaking raw bytes over TCP, for misbehaving-peer tests.

Waits for a line on stdin, then runs one scenario:
  garbage HOST PORT            send random bytes, then a valid request on a new connection
  partial HOST PORT            send half a request head, then hang (the test kills it)
  request HOST PORT PATH       send a request and wait for the reply forever (the test kills it)
Prints "sent" when the bytes are written.
"""

import os
import socket
import sys
import time


def main() -> None:
    scenario, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("ready", flush=True)
    sys.stdin.readline()
    if scenario == "garbage":
        with socket.create_connection((host, port)) as sock:
            sock.sendall(os.urandom(3000) + b"\r\n\r\n")
            sock.settimeout(2)
            try:
                sock.recv(65536)
            except OSError:
                pass
        with socket.create_connection((host, port)) as sock:
            sock.sendall(f"GET /items/after-garbage HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
            while sock.recv(65536):
                pass
        print("sent", flush=True)
    elif scenario == "partial":
        sock = socket.create_connection((host, port))
        sock.sendall(b"GET /items/partial HTTP/1.1\r\nHost: x\r\nUser-Ag")
        print("sent", flush=True)
        time.sleep(3600)
    elif scenario == "request":
        path = sys.argv[4]
        sock = socket.create_connection((host, port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        print("sent", flush=True)
        time.sleep(3600)


if __name__ == "__main__":
    main()
