"""What the TLS probes cost a process that uses the host's libssl (indicative).

The agent attaches its SSL_read/SSL_write uprobes once per library file, for
every process (bpf/tls.c, otelbpf/sources/tls.py): a process it does not trace
still takes the uprobe trap on each call (the filter then returns at once).
This script times small TLS round trips between two threads of one process
over loopback (OpenSSL through CPython's ``ssl``) in three runs:

  off                 no agent
  untraced, per-pid   the agent tracing another process by --pid: probes attached for that
                      process only, so this one takes no trap
  untraced, host-wide the agent tracing by --comm (a name matching nothing): probes on the
                      host's libssl for every process; this one takes the trap, the filter rejects
  traced              the agent tracing this process (plaintext copied; not HTTP, so muted
                      after detection)

and prints round trips per second and the ratio to ``off``. Needs root and
the repository's venv; run it on a quiet machine for figures worth quoting.

    .venv/bin/python bench/tls_probe_tax.py --round-trips 20000
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_certificate(directory: str) -> tuple[str, str]:
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def round_trips_per_second(cert: str, key: str, count: int) -> float:
    """``count`` 64-byte request/response round trips over one TLS connection on loopback."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=cert)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            while True:
                data = tls.recv(64)
                if not data:
                    return
                tls.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with client_ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as tls:
        payload = b"x" * 64
        start = time.perf_counter()
        for _ in range(count):
            tls.sendall(payload)
            tls.recv(64)
        elapsed = time.perf_counter() - start
    thread.join(timeout=5)
    listener.close()
    return count / elapsed


def start_agent(selection: list[str]) -> subprocess.Popen:
    agent = subprocess.Popen(
        [sys.executable, "-m", "otelbpf", "run", *selection, "--json-file", os.devnull],
        cwd=str(ROOT), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    for line in agent.stderr:
        if line.startswith("otelbpf: tracing,"):
            return agent
    raise RuntimeError("the agent did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        cert, key = make_certificate(directory)
        results = {"off": round_trips_per_second(cert, key, args.round_trips)}
        other = subprocess.Popen(["sleep", "600"])
        runs = (
            ("untraced, per-pid", ["--pid", str(other.pid)]),
            ("untraced, host-wide", ["--comm", "no-such-comm"]),
            ("traced", ["--pid", str(os.getpid())]),
        )
        for name, selection in runs:
            agent = start_agent(selection)
            try:
                results[name] = round_trips_per_second(cert, key, args.round_trips)
            finally:
                agent.terminate()
                agent.wait(timeout=30)
        other.kill()
    for name, rate in results.items():
        print(f"{name:>19}: {rate:9.0f} round trips/s  ({rate / results['off']:.2f}x)")


if __name__ == "__main__":
    main()
