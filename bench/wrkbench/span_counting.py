"""Counting the spans the agent delivered, to hold them against the requests nginx served.

Two sinks: an OTLP/JSON lines file the agent writes (``--json-file``), or
bench/otlp_counting_receiver.py, a child process that receives OTLP/gRPC as a remote collector
would and keeps counts, not requests. Either way the bench's own ``stub_status`` reads are left out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .checkout import ROOT
from .console import BenchError
from .nginx import STATUS_PATH
from .processes import Children, taskset

SPAN_KIND_SERVER = 2


def count_spans_in_json_file(path: Path) -> dict[str, int]:
    """SERVER spans (not the bench's own status reads), other spans, status spans, in an OTLP/JSON lines file."""
    counts = {"server_spans": 0, "other_spans": 0, "excluded_spans": 0, "lines": 0}
    if not path.exists():
        return counts
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                continue  # a partial last line: never written completely
            counts["lines"] += 1
            for rs in json.loads(raw).get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    for span in ss.get("spans", ()):
                        if _json_url_path(span) == STATUS_PATH:
                            counts["excluded_spans"] += 1
                        elif span.get("kind") == SPAN_KIND_SERVER:
                            counts["server_spans"] += 1
                        else:
                            counts["other_spans"] += 1
    return counts


def _json_url_path(span: dict) -> str | None:
    for kv in span.get("attributes", ()):
        if kv.get("key") == "url.path":
            return kv.get("value", {}).get("stringValue")
    return None


class CountingReceiver:
    """bench/otlp_counting_receiver.py in a child process (its own GIL, pinned with the load generator)."""

    def __init__(self, children: Children, cpus: str | None) -> None:
        script = ROOT / "bench" / "otlp_counting_receiver.py"
        argv = taskset(cpus, [sys.executable, str(script), "--exclude-path", STATUS_PATH])
        self.children = children
        self.proc = children.start(
            "OTLP receiver", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1, cwd=ROOT
        )
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.children.stop(self.proc)
            raise BenchError(f"the OTLP receiver did not start (got {line!r}); see its stderr above")
        ports = json.loads(line[len("READY ") :])
        self.grpc_endpoint = f"http://127.0.0.1:{ports['grpc_port']}"

    def _ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def counts(self) -> dict[str, int]:
        return self._ask("count")

    def reset(self) -> None:
        self._ask("reset")

    def stop(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.children.stop(self.proc, timeout=10)

