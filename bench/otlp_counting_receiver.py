"""An OTLP receiver that only counts spans, run as a child process by bench/nginx_wrk.py.

It reuses tests/otlp_receiver.py (the official protobufs, gRPC + HTTP) but
keeps no requests, so a benchmark that sends hundreds of thousands of spans
does not grow its memory. It runs in its own process so that decoding does
not share a GIL (or, with --cpus in the parent, a core) with the benchmark.

Protocol on stdin/stdout, one line each:

    -> READY {"grpc_port": 43123, "http_port": 40111}       (once, at start)
    <- count        -> {"server_spans": N, "other_spans": N, "excluded_spans": N, "requests": N}
    <- reset        -> {"ok": true}
    <- EOF          (the receiver stops and exits)

Spans whose ``url.path`` is one of --exclude-path (the benchmark's own
stub_status reads) are counted as ``excluded_spans``, not as server spans.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from otlp_receiver import OtlpReceiver  # noqa: E402

SPAN_KIND_SERVER = 2


class CountingReceiver(OtlpReceiver):
    def __init__(self, exclude_paths: set[str]) -> None:
        super().__init__(grpc_port=0, http_port=0)
        self._exclude = exclude_paths
        self._count_lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._count_lock:
            self.counts = {"server_spans": 0, "other_spans": 0, "excluded_spans": 0, "requests": 0}

    def _record_traces(self, request, headers) -> None:  # overrides OtlpReceiver: count, keep nothing
        server = other = excluded = 0
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    if self._exclude and _url_path(span) in self._exclude:
                        excluded += 1
                    elif span.kind == SPAN_KIND_SERVER:
                        server += 1
                    else:
                        other += 1
        with self._count_lock:
            self.counts["server_spans"] += server
            self.counts["other_spans"] += other
            self.counts["excluded_spans"] += excluded
            self.counts["requests"] += 1

    def _record_metrics(self, request) -> None:
        pass


def _url_path(span) -> str | None:
    for kv in span.attributes:
        if kv.key == "url.path":
            return kv.value.string_value
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exclude-path", action="append", default=[])
    args = parser.parse_args()
    receiver = CountingReceiver(set(args.exclude_path)).start()
    try:
        print("READY " + json.dumps({"grpc_port": receiver.grpc_port, "http_port": receiver.http_port}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "count":
                with receiver._count_lock:
                    print(json.dumps(receiver.counts), flush=True)
            elif command == "reset":
                receiver.reset()
                print(json.dumps({"ok": True}), flush=True)
            elif command:
                print(json.dumps({"error": f"unknown command {command!r}"}), flush=True)
    finally:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
