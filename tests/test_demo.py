"""The README's first command, as a user runs it: the installed `otelbpf` console script,
from a folder of the user's, with no variable set by hand.

The demo once looked for its example services one folder off after a layout change,
and every other test passed: this one runs it end to end and reads what it wrote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import ROOT

#: The console script `make install` put beside the interpreter running the tests.
OTELBPF_SCRIPT = Path(sys.executable).with_name("otelbpf")
#: A trace tree's head line, as the console prints it.
TREE_HEAD = re.compile(r"^trace [0-9a-f]{32} · \S+ · \d+ spans$", re.M)


def user_environment() -> dict[str, str]:
    """The environment of a user who set nothing: no OTELBPF_* variable, no PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTELBPF_") and k != "PYTHONPATH"}


def read_otlp_json(path: Path) -> list[ExportTraceServiceRequest]:
    """The demo's OTLP JSON file, one ExportTraceServiceRequest per line, decoded with the
    official protobufs (an unknown field or a wrong type fails the parse)."""
    return [json_format.Parse(line, ExportTraceServiceRequest()) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.ebpf
def test_make_demo_traces_the_example_services_and_writes_its_outputs(tmp_path):
    assert OTELBPF_SCRIPT.is_file(), f"{OTELBPF_SCRIPT} missing: run `make install`"
    result = subprocess.run(
        [str(OTELBPF_SCRIPT), "demo", "--requests", "5"],
        cwd=tmp_path,
        env=user_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "FAILED" not in result.stderr

    # trace trees on the console, the gateway's request under curl's
    trees = TREE_HEAD.findall(result.stdout)
    assert len(trees) >= 5, result.stdout[-3000:]
    assert re.search(r"curl  CLIENT  GET .*\n\s+└─ http_gateway  SERVER  GET /api/items/\{id\}", result.stdout)

    # the OTLP JSON: a SERVER span of each example service, and the gateway's children in its trace
    requests = read_otlp_json(tmp_path / "otelbpf-demo.json")
    spans_by_service: dict[str, list[Span]] = {}
    for request in requests:
        for resource_spans in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                spans_by_service.setdefault(attrs.get("service.name", ""), []).extend(scope_spans.spans)
    servers = {name for name, spans in spans_by_service.items() if any(s.kind == Span.SPAN_KIND_SERVER for s in spans)}
    assert {"http_gateway", "http_backend", "grpc_service", "openai_mock_server"} <= servers, sorted(servers)
    backend_server = next(s for s in spans_by_service["http_backend"] if s.kind == Span.SPAN_KIND_SERVER)
    gateway_ids = {s.span_id for s in spans_by_service["http_gateway"] if s.trace_id == backend_server.trace_id}
    assert backend_server.parent_span_id in gateway_ids
    # the streamed chat completion carries its time to first token
    llm = [s for s in spans_by_service["openai_mock_server"] if s.kind == Span.SPAN_KIND_SERVER]
    assert any(a.key == "gen_ai.response.time_to_first_chunk" for s in llm for a in s.attributes), llm

    # the flame graph page, with the samples it embeds
    page = (tmp_path / "otelbpf-demo.flamegraph.html").read_text()
    assert "<html" in page.lower() and "http_backend" in page
    summary = re.search(r"demo: (\d+) stack samples", result.stdout)
    assert summary and int(summary.group(1)) > 0, result.stdout[-2000:]


def test_the_demo_finds_its_services_from_the_code_location_alone(tmp_path):
    """No OTELBPF_EXAMPLES: the examples beside the package are found wherever the user is."""
    code = "from otelbpf.cli.demo import EXAMPLES, demo_prerequisites; print(EXAMPLES); print(demo_prerequisites())"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=user_environment(), capture_output=True, text=True, check=True
    )
    examples, missing = result.stdout.splitlines()
    assert Path(examples) == ROOT / "examples"
    assert missing == "None"


def test_a_demo_that_traced_nothing_fails(tmp_path):
    from otelbpf.cli.demo import demo_problems

    json_file, page = tmp_path / "t.json", tmp_path / "t.html"
    assert demo_problems({}, str(json_file), str(page)) == [
        "no span was traced (is this host able to trace? run `otelbpf doctor`)",
        f"no OTLP JSON in {json_file}",
        f"no flame graph in {page}",
    ]
    json_file.write_text(json.dumps({"resourceSpans": []}))
    page.write_text("<html></html>")
    stats = {"otelbpf.spans.created": 3, "otelbpf.export.spans{console}": 3}
    assert demo_problems(stats, str(json_file), str(page)) == []
    assert demo_problems({"otelbpf.spans.created": 3}, str(json_file), None) == ["no trace tree was printed"]
