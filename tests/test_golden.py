"""Golden replay tests: each tests/golden/<protocol>/<case>.pcap, replayed
in-process through the pcap source and the pipeline (otelbpf.cli.replay), must
give the spans its <case>.expected.json describes.

The expected file is a stable summary (see :func:`summarize`): per span its
name, kind, service (the synthetic process), status, attributes, parent and
trace by position in the list, never IDs or times. Regenerate after an
intended change with

    OTELBPF_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py

and review the diff (tests/golden/README.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from otelbpf.cli.replay import replay_spans
from otelbpf.core.model import SpanKind, SpanRecord, StatusCode
from otelbpf.sources.pcap import PcapSource

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(GOLDEN.glob("*/*.pcap"))
UPDATE = os.environ.get("OTELBPF_UPDATE_GOLDEN", "") not in ("", "0")
#: The perspective a new case is replayed from (an expected file names its own).
DEFAULT_PERSPECTIVE = "both"
#: Attributes left out of the summaries (none yet: every attribute counts).
IGNORED_ATTRIBUTES: frozenset[str] = frozenset()


def expected_path(capture: Path) -> Path:
    return capture.with_name(capture.stem + ".expected.json")


def span_label(index: int, span: SpanRecord) -> str:
    return f"#{index} {span.name} {span.kind.name}"


def summarize(spans: list[SpanRecord], source: PcapSource, perspective: str) -> dict:
    """The spans as plain, stable data. Spans are ordered by start time (the
    capture's, so fixed), CLIENT before SERVER at the same instant (the
    caller's side first), then end time, name and service; parents, links
    and traces are given by that position. A parent that is not in the
    list (propagated from a header in the capture) is ``remote <span id>``."""
    services = {pid: e.service_name for pid, e in source.endpoints.items()}
    spans = sorted(
        spans,
        key=lambda s: (s.start_ns, s.kind != SpanKind.CLIENT, s.end_ns, s.name, services.get(s.pid, ""), s.pid),
    )
    position = {span.span_id: i for i, span in enumerate(spans)}
    first_of_trace: dict[bytes, int] = {}
    summary = []
    for i, span in enumerate(spans):
        first_of_trace.setdefault(span.trace_id, i)
        if not span.parent_span_id:
            parent = None
        elif span.parent_span_id in position:
            parent = span_label(position[span.parent_span_id], spans[position[span.parent_span_id]])
        else:
            parent = f"remote {span.parent_span_id.hex()}"
        entry: dict = {
            "span": span_label(i, span),
            "name": span.name,
            "kind": span.kind.name,
            "service": services.get(span.pid, f"pid {span.pid}"),
            "status": span.status_code.name,
        }
        if span.status_message:
            entry["status_message"] = span.status_message
        entry["parent"] = parent
        entry["trace"] = f"#{first_of_trace[span.trace_id]}"
        if span.links:
            entry["links"] = [
                span_label(position[link.span_id], spans[position[link.span_id]]) if link.span_id in position
                else f"remote {link.span_id.hex()}"
                for link in span.links
            ]
        entry["attributes"] = {k: span.attributes[k] for k in sorted(span.attributes) if k not in IGNORED_ATTRIBUTES}
        summary.append(entry)
    return {"perspective": perspective, "spans": summary}


def render(summary: dict) -> str:
    return json.dumps(summary, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("capture", CASES, ids=[f"{c.parent.name}/{c.stem}" for c in CASES])
def test_golden_replay(capture: Path) -> None:
    path = expected_path(capture)
    expected = json.loads(path.read_text()) if path.exists() else None
    perspective = expected["perspective"] if expected else DEFAULT_PERSPECTIVE
    spans, source = replay_spans(capture, perspective)
    protocol = capture.parent.name
    assert all(span.protocol in ("", protocol) for span in spans), "a span from another protocol"
    actual = summarize(spans, source, perspective)
    if UPDATE:
        path.write_text(render(actual))
        return
    assert expected is not None, f"{path} is missing: run with OTELBPF_UPDATE_GOLDEN=1 to write it"
    assert render(actual).splitlines() == render(expected).splitlines()  # pytest shows a line diff


def test_every_protocol_has_golden_cases() -> None:
    """Every protocol the agent registers has a capture with its expected spans, and every
    capture folder names a registered protocol (a new protocol cannot land without one)."""
    from otelbpf.registry import default_registry

    assert CASES, "no golden captures found"
    registered = {entry.id for entry in default_registry().protocols}
    for protocol in sorted(registered):
        folder = GOLDEN / protocol
        captures = sorted(folder.glob("*.pcap")) if folder.is_dir() else []
        assert captures, f"protocol {protocol!r} has no golden capture in {folder} (tests/golden/README.md)"
        missing = [c for c in captures if not c.with_name(c.stem + ".expected.json").exists()]
        assert not missing, f"captures without their expected spans: {missing}"
    folders = {folder.name for folder in GOLDEN.iterdir() if folder.is_dir()}
    assert folders <= registered, f"golden folders of no registered protocol: {sorted(folders - registered)}"
    orphans = [p for p in GOLDEN.glob("*/*.expected.json") if not p.with_name(p.name.replace(".expected.json", ".pcap")).exists()]
    assert not orphans, f"expected files without a capture: {orphans}"


def test_summary_changes_with_what_the_golden_files_guard() -> None:
    """A change in a span's name, kind, attribute value, status or parent
    changes the summary; a change in IDs or times does not."""
    case = GOLDEN / "http1" / "gateway.pcap"
    spans, source = replay_spans(case, "both")
    baseline = summarize(spans, source, "both")
    child = next(s for s in spans if s.parent_span_id and any(p.span_id == s.parent_span_id for p in spans))

    def changed(mutate) -> bool:
        copies, _ = replay_spans(case, "both")
        target = next(s for s in copies if (s.start_ns, s.kind, s.name) == (child.start_ns, child.kind, child.name))
        mutate(target, copies)
        return summarize(copies, source, "both") != baseline

    assert changed(lambda s, _: setattr(s, "name", s.name + "x"))
    assert changed(lambda s, _: setattr(s, "kind", SpanKind.INTERNAL))
    assert changed(lambda s, _: s.attributes.update({"http.response.status_code": 299}))
    assert changed(lambda s, _: setattr(s, "status_code", StatusCode.OK))
    assert changed(lambda s, _: setattr(s, "parent_span_id", b""))
    assert changed(lambda s, copies: setattr(s, "parent_span_id", next(o.span_id for o in copies if o is not s and o.span_id != s.parent_span_id)))
    assert not changed(lambda s, _: None)  # a new replay: new random IDs, same summary

    def shift_times(_, copies: list[SpanRecord]) -> None:
        for span in copies:
            span.start_ns += 10**12
            span.end_ns += 10**12

    assert not changed(shift_times)
