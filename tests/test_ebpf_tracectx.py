"""--publish-trace-context: the pinned traces_ctx_v1 map (OBI's format) names
the span a thread serves while it serves it, read back as another eBPF tool
would read it: by opening the pin."""

from __future__ import annotations

import ctypes
import json
import threading
import urllib.request

import pytest

from conftest import EXAMPLES, wait_until

pytestmark = pytest.mark.ebpf

PIN = b"/sys/fs/bpf/traces_ctx_v1"


class _Value(ctypes.Structure):
    _fields_ = [("trace_id", ctypes.c_ubyte * 16), ("span_id", ctypes.c_ubyte * 8)]


def _entries() -> dict[int, tuple[str, str]]:
    """key (tgid << 32 | tid) -> (trace id, span id) in hex, through the pin."""
    from bcc import libbcc

    fd = libbcc.lib.bpf_obj_get(PIN)
    assert fd >= 0, "traces_ctx_v1 is not pinned"
    out = {}
    try:
        key, next_key, value = ctypes.c_uint64(0), ctypes.c_uint64(0), _Value()
        first = True
        while True:
            got = libbcc.lib.bpf_get_next_key(fd, None if first else ctypes.byref(key), ctypes.byref(next_key))
            if got != 0:
                return out
            first = False
            key.value = next_key.value
            if libbcc.lib.bpf_lookup_elem(fd, ctypes.byref(key), ctypes.byref(value)) == 0:
                out[key.value] = (bytes(value.trace_id).hex(), bytes(value.span_id).hex())
    finally:
        import os

        os.close(fd)


def test_the_serving_thread_is_published_while_it_serves(services, agent, tmp_path):
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0", "--delay-ms", "1500"])
    traces = tmp_path / "traces.json"
    run = agent(["--pid", str(backend.pid), "--json-file", str(traces), "--publish-trace-context", "--no-profiles"])
    done = threading.Event()
    threading.Thread(
        target=lambda: (urllib.request.urlopen(f"http://127.0.0.1:{backend.port}/items/7", timeout=30).read(), done.set()),
        daemon=True,
    ).start()
    seen: dict[int, tuple[str, str]] = {}
    assert wait_until(lambda: bool(seen.update({k: v for k, v in _entries().items() if k >> 32 == backend.pid}) or seen), 10)
    assert done.wait(30)
    assert wait_until(lambda: not any(k >> 32 == backend.pid for k in _entries()), 10), "the entry outlived its request"
    run.stop()
    spans = [
        span
        for line in traces.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
        if span["kind"] == 2  # SERVER
    ]
    assert len(spans) == 1
    (key, (trace_id, span_id)), = seen.items()
    assert (trace_id, span_id) == (spans[0]["traceId"], spans[0]["spanId"])
    assert key & 0xFFFFFFFF != 0  # a thread id, the serving thread of the ThreadingHTTPServer
