"""A readable trace tree on a terminal, one line per span.

Spans reach sinks in batches as requests finish, children usually before
their parents. To print a trace as one tree the sink holds it until no new
span of that trace arrived for ``settle_s``, then prints it: children
indented under their parents in start order, spans whose parent is not in
the output (it finished later, or lives in an uninstrumented process) at the
top level. ``flush``/``shutdown`` print everything still held.

    trace 4bf92f3577b34da6a3ce929d0e0e4736 · 12:00:01.234 · 3 spans
      api-gateway  SERVER  GET /chat  12.3 ms  status=200
      └─ api-gateway  CLIENT  POST /v1/completions  10.1 ms  status=200
         └─ vllm  SERVER  POST /v1/completions  9.8 ms  status=500  ✗ ERROR upstream failed

An LLM API call also shows its time to first chunk and token counts::

      chat llama-3-8b  412.0 ms  status=200  ttft=81.2 ms  tokens=12in/64out  chunks=64
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator, TextIO

from otelbpf import semconv as sc
from otelbpf.core.model import SpanKind, SpanRecord, StatusCode
from otelbpf.export.sinks import FailureLog, SpanBatch, SpanSink

_log = logging.getLogger(__name__)

#: Attributes shown after the duration, first present key wins per label.
_STATUS_KEYS = ("http.response.status_code", "rpc.response.status_code", "rpc.grpc.status_code", "http.status_code")
_PATH_KEYS = ("url.path", "http.route", "http.target")


@dataclass(frozen=True)
class _Symbols:
    branch: str
    last_branch: str
    pipe: str
    blank: str
    dot: str
    error: str
    microseconds: str


_UNICODE = _Symbols("├─ ", "└─ ", "│  ", "   ", "·", "✗", "µs")
_ASCII = _Symbols("|- ", "`- ", "|  ", "   ", "-", "x", "us")


@dataclass
class _HeldTrace:
    spans: list[tuple[SpanRecord, str]] = field(default_factory=list)
    last_arrival: float = 0.0


class ConsoleSink(SpanSink):
    """Prints traces as trees on ``stream`` (stdout by default) once they settle."""

    def __init__(self, stream: TextIO | None = None, settle_s: float = 1.0, *, name: str = "console") -> None:
        self.name = name
        self._stream = stream if stream is not None else sys.stdout
        self._settle_s = settle_s
        self._symbols = _symbols_for(self._stream)
        self._held: dict[bytes, _HeldTrace] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None
        self._failures = FailureLog(_log, name)

    def export(self, batch: SpanBatch) -> bool:
        services = _ServiceNames(batch)
        arrivals = [(span, services.of(span.pid)) for span in batch.spans]
        now = time.monotonic()
        with self._lock:
            for span, service in arrivals:
                held = self._held.get(span.trace_id)
                if held is None:
                    held = self._held[span.trace_id] = _HeldTrace()
                held.spans.append((span, service))
                held.last_arrival = now
            self._start_ticker()
        self._print(self._take(settled_before=now - self._settle_s))
        return True

    def flush(self) -> None:
        self._print(self._take(settled_before=float("inf")))

    def shutdown(self) -> None:
        self._stopped.set()
        self.flush()

    def _start_ticker(self) -> None:
        """Prints settled traces even when no further batch arrives (called under the lock)."""
        if self._ticker is None and not self._stopped.is_set():
            self._ticker = threading.Thread(target=self._tick, name=f"otelbpf-{self.name}-ticker", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        interval = min(max(self._settle_s / 4, 0.05), 0.5)
        while not self._stopped.wait(interval):
            self._print(self._take(settled_before=time.monotonic() - self._settle_s))

    def _take(self, settled_before: float) -> list[list[tuple[SpanRecord, str]]]:
        with self._lock:
            settled = [trace_id for trace_id, held in self._held.items() if held.last_arrival <= settled_before]
            traces = [self._held.pop(trace_id).spans for trace_id in settled]
        return sorted(traces, key=lambda spans: min(_start(item) for item in spans))

    def _print(self, traces: list[list[tuple[SpanRecord, str]]]) -> None:
        if not traces:
            return
        text = "".join(line + "\n" for spans in traces for line in self._render(spans))
        with self._write_lock:
            try:
                self._stream.write(text)
                self._stream.flush()
            except (OSError, ValueError) as exc:  # closed or broken stream
                self._failures.failed(type(exc).__name__, exc)

    def _render(self, spans: list[tuple[SpanRecord, str]]) -> list[str]:
        try:
            return render_trace(spans, self._symbols)
        except Exception as exc:  # noqa: BLE001 - a malformed record must not stop the ticker
            self._failures.failed("unprintable trace", exc)
            return []


class _ServiceNames:
    """``service.name`` per pid, looked up once per batch."""

    def __init__(self, batch: SpanBatch) -> None:
        self._resources = batch.resources
        self._names: dict[int, str] = {}

    def of(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            try:
                name = str(self._resources.attributes(pid).get("service.name") or f"pid {pid}")
            except Exception:  # noqa: BLE001 - a label is not worth failing over
                name = f"pid {pid}"
            self._names[pid] = name
        return name


def render_trace(spans: list[tuple[SpanRecord, str]], symbols: _Symbols = _UNICODE) -> list[str]:
    """Lines for one trace: a header, then the span tree (spans given with their service names)."""
    first = min(spans, key=_start)[0]
    count = f"{len(spans)} span" + ("" if len(spans) == 1 else "s")
    header = f"trace {first.trace_id.hex()} {symbols.dot} {_clock(first.start_ns)} {symbols.dot} {count}"
    return [header, *_tree_lines(spans, symbols)]


def _tree_lines(spans: list[tuple[SpanRecord, str]], symbols: _Symbols) -> Iterator[str]:
    by_id = {span.span_id: (span, service) for span, service in spans}
    children: dict[bytes, list[tuple[SpanRecord, str]]] = defaultdict(list)
    roots: list[tuple[SpanRecord, str]] = []
    for span, service in spans:
        if span.parent_span_id in by_id and span.parent_span_id != span.span_id:
            children[span.parent_span_id].append((span, service))
        else:
            roots.append((span, service))
    shown: set[int] = set()
    # Spans caught in a parent cycle have no root; they are shown as roots at the end.
    for root in sorted(roots, key=_start) + sorted(spans, key=_start):
        if id(root[0]) not in shown:
            yield from _subtree_lines(root, children, shown, symbols)


def _subtree_lines(
    root: tuple[SpanRecord, str],
    children: dict[bytes, list[tuple[SpanRecord, str]]],
    shown: set[int],
    symbols: _Symbols,
) -> Iterator[str]:
    """Depth first without recursion, so a long chain cannot hit the recursion limit."""
    stack: list[tuple[tuple[SpanRecord, str], str, str]] = [(root, "  ", "  ")]
    while stack:
        (span, service), line_prefix, child_prefix = stack.pop()
        if id(span) in shown:
            continue
        shown.add(id(span))
        yield line_prefix + describe_span(span, service, symbols)
        kids = sorted(children.get(span.span_id, ()), key=_start)
        for index in reversed(range(len(kids))):
            last = index == len(kids) - 1
            stack.append(
                (
                    kids[index],
                    child_prefix + (symbols.last_branch if last else symbols.branch),
                    child_prefix + (symbols.blank if last else symbols.pipe),
                )
            )


def describe_span(span: SpanRecord, service: str, symbols: _Symbols = _UNICODE) -> str:
    """``service  KIND  name  duration  key attributes  error`` on one line."""
    parts = [service, _kind_name(span.kind), span.name, _duration(span.end_ns - span.start_ns, symbols)]
    status = _first_attribute(span, _STATUS_KEYS)
    if status is not None:
        parts.append(f"status={status}")
    path = _first_attribute(span, _PATH_KEYS)
    if path is not None and str(path) not in span.name:
        parts.append(f"path={path}")
    parts.extend(_llm_parts(span, symbols))
    parts.extend(_gpu_parts(span))
    if span.links:  # a GPU engine step's requests, a DDS sample's producer
        parts.append(f"links={len(span.links)}")
    if span.status_code == StatusCode.ERROR:
        parts.append(f"{symbols.error} ERROR" + (f" {span.status_message}" if span.status_message else ""))
    return "  ".join(str(part) for part in parts)


def _llm_parts(span: SpanRecord, symbols: _Symbols) -> list[str]:
    """Time to first chunk, input and output tokens and chunk count of an LLM API call."""
    attributes = span.attributes
    parts = []
    ttft = attributes.get(sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK)
    if isinstance(ttft, (int, float)):
        parts.append(f"ttft={_duration(int(ttft * 1e9), symbols)}")
    tokens_in = attributes.get(sc.GEN_AI_USAGE_INPUT_TOKENS)
    tokens_out = attributes.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    if tokens_in is not None or tokens_out is not None:
        parts.append(f"tokens={'?' if tokens_in is None else tokens_in}in/{'?' if tokens_out is None else tokens_out}out")
    chunks = attributes.get(sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS)
    if chunks is not None:
        parts.append(f"chunks={chunks}")
    return parts


def _gpu_parts(span: SpanRecord) -> list[str]:
    """Kernel launches of a request; direction, bytes and pageable source of a copy;
    bytes of an allocation."""
    attributes = span.attributes
    parts = []
    launches = attributes.get(sc.OTELBPF_GPU_KERNEL_LAUNCHES)
    if launches:
        parts.append(f"launches={launches}")
    kind = attributes.get(sc.OTELBPF_GPU_MEMCPY_KIND)
    if kind is not None:
        pageable = " pageable" if attributes.get(sc.OTELBPF_GPU_MEMCPY_PAGEABLE) else ""
        parts.append(f"{kind} {attributes.get(sc.OTELBPF_GPU_MEMCPY_BYTES, '?')} B{pageable}")
    elif attributes.get(sc.OTELBPF_GPU_MEMORY_BYTES) is not None:
        parts.append(f"{attributes[sc.OTELBPF_GPU_MEMORY_BYTES]} B")
    return parts


def _start(item: tuple[SpanRecord, str]) -> int:
    """Sort key; a malformed timestamp sorts first instead of breaking the ordering."""
    start_ns = item[0].start_ns
    return start_ns if type(start_ns) is int else 0


def _first_attribute(span: SpanRecord, keys: tuple[str, ...]) -> object | None:
    for key in keys:
        value = span.attributes.get(key)
        if value is not None:
            return value
    return None


def _kind_name(kind: int) -> str:
    try:
        return SpanKind(kind).name
    except ValueError:
        return f"KIND{kind}"


def _duration(nanoseconds: int, symbols: _Symbols) -> str:
    if nanoseconds < 1_000_000:
        return f"{nanoseconds / 1000:.0f} {symbols.microseconds}"
    if nanoseconds < 1_000_000_000:
        return f"{nanoseconds / 1e6:.1f} ms"
    return f"{nanoseconds / 1e9:.2f} s"


def _clock(unix_ns: int) -> str:
    try:
        return datetime.fromtimestamp(unix_ns / 1e9).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        return "??:??:??"


def _symbols_for(stream: TextIO) -> _Symbols:
    """Box-drawing characters only where the stream can encode them."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        "".join(vars(_UNICODE).values()).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return _ASCII
    return _UNICODE
