#!/usr/bin/env python3
"""What the native unwinder (otelbpf/profiles/native) costs per stack sample.

A CPython interpreter spins in Python code (or, with --serve, serves HTTP requests doing varied
Python work from a client: stacks that end anywhere in the interpreter, in the socket module or in a
system call); its main thread is snapshotted with ptrace as bpf/profile.c would take it
(registers + a copy of the stack, tests/ptrace_snapshot.py), and the snapshots are unwound
by DWARF CFI through libdw: the first pass over them as a fresh unwinder meets them (every
new PC looked up: rules from the CFI, symbols), then warm passes (from the unwinder's rule
and symbol caches). The first pass is what a live agent pays per sample while the stacks
it sees are new; prints both and the unwinder's cache counters; asserts nothing.

    sudo .venv/bin/python bench/native_unwind.py                  # Debian's python3, spinning
    sudo .venv/bin/python bench/native_unwind.py --serve          # serving requests back to back
    sudo .venv/bin/python bench/native_unwind.py --python /root/.pyenv/versions/3.12.1/bin/python3.12
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ptrace_snapshot import snapshot  # noqa: E402

from otelbpf.profiles.native import NativeUnwinder  # noqa: E402

PY_SPIN = "def spin():\n    while True:\n        pass\nspin()\n"
#: An HTTP service burning ~1 ms of Python per request (bench/profile_cost.py's), on a free port.
PY_SERVE = r'''
import http.server, json, re, sys
DOC = {"items": [{"id": i, "name": f"item {i}", "tags": ["a", "b", str(i)]} for i in range(200)]}
def work():  # varied Python: the interpreter's code all over, and C helpers (json, re, sort)
    text = json.dumps(DOC)
    found = re.findall(r"item (\d+)", text)
    back = json.loads(text)
    return sorted((x["name"] for x in back["items"]), key=len)[:3] + found[:2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = str(work()).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
'''
PACED = r'''
import http.client, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
while True:
    conn.request("GET", "/"); conn.getresponse().read()
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter to spin (default Debian's)")
    p.add_argument("--snapshots", type=int, default=20, help="distinct snapshots to unwind")
    p.add_argument("--rounds", type=int, default=200, help="warm passes over them")
    p.add_argument("--serve", action="store_true", help="snapshot an HTTP service under a paced client instead")
    args = p.parse_args()
    client = None
    if args.serve:
        target = subprocess.Popen([args.python, "-c", PY_SERVE], stdout=subprocess.PIPE, text=True)
        client = subprocess.Popen([sys.executable, "-c", PACED, target.stdout.readline().strip()])
    else:
        target = subprocess.Popen([args.python, "-c", PY_SPIN])
    try:
        time.sleep(0.3)
        samples = []
        for _ in range(args.snapshots):
            samples.append(snapshot(target.pid))
            time.sleep(0.002 if args.serve else 0)
        unwinder = NativeUnwinder()
        started = time.perf_counter()
        first = unwinder.unwind(target.pid, *samples[0])
        opening = time.perf_counter() - started  # the process's modules opened, their CFI read
        started = time.perf_counter()
        for sample in samples[1:]:
            unwinder.unwind(target.pid, *sample)
        first_pass = (time.perf_counter() - started) / max(1, len(samples) - 1)
        warm = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            for sample in samples:
                unwinder.unwind(target.pid, *sample)
            warm.append((time.perf_counter() - started) / len(samples))
    finally:
        for proc in (client, target):
            if proc is not None:
                proc.kill()
                proc.wait()
    stats = unwinder.stats
    print(f"native unwind, {args.python} {'serving' if args.serve else 'spinning'} ({len(first.frames)} frames in the "
          f"first): opening {opening * 1e3:.1f} ms, first pass {first_pass * 1e6:.1f} us/sample, warm "
          f"{statistics.median(warm) * 1e6:.1f} us/sample (median of {args.rounds} passes, min {min(warm) * 1e6:.1f})")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items()) if k.startswith(("walks:", "frame_")) or k == "samples"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
