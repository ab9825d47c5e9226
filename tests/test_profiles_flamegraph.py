"""The flame graph page: bounded accumulation here, and the page itself driven in headless Chromium.

The page reads its state from the URL hash and writes what it shows into
``<pre id="state">`` (JSON); ``chromium --dump-dom`` gives the DOM after the
scripts ran, so each test sets a hash and checks the totals, the matched
share and the frames it drew.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_profiles_export import RESOURCES, SPAN_A, T0, TRACE_B, make_samples

from otelbpf.profiles.flamegraph import FlameGraph, write_flamegraph
from otelbpf.profiles.model import FRAME_PYTHON, Frame, Sample
from otelbpf.profiles.types import CPU, OFF_CPU

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
HOSTILE = "</script><script>document.title='pwned'</script>&amp;"


def chromium(tmp_path: Path, url: str, *extra: str) -> str:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=5000", *extra, url]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=tmp_path, env=dict(os.environ, HOME=str(tmp_path)))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def page_state(tmp_path: Path, page: Path, fragment: str = "") -> dict[str, Any]:
    dom = chromium(tmp_path, page.as_uri() + ("#" + fragment if fragment else ""), "--dump-dom")
    match = re.search(r'<pre id="state">(.*?)</pre>', dom, re.S)
    assert match and match.group(1), dom[-3000:]
    state = json.loads(html.unescape(match.group(1)))
    state["dom"] = dom
    return state


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    samples = make_samples() + [Sample(CPU, 200, 201, T0 + 30, (Frame(FRAME_PYTHON, HOSTILE, "/x.py", 1),), (1,))]
    return write_flamegraph(tmp_path_factory.mktemp("flame") / "flame.html", samples, RESOURCES)


# --- in the browser ----------------------------------------------------------------------------------


@needs_chromium
def test_search_and_span_filter_from_the_hash(tmp_path: Path, page: Path) -> None:
    state = page_state(tmp_path, page, f"search=inner&span={SPAN_A.hex()}")
    assert state["type"] == "cpu" and state["filter"] == SPAN_A.hex()
    assert state["total"] == 3  # only the three samples linked to span A
    assert state["matched"] == 3 and state["matchedPct"] == 100
    assert "Model.inner" in state["visible"] and "do_syscall_64" not in state["visible"]
    assert 'id="state-matched-pct">100.00%<' in state["dom"]
    assert re.search(r'class="frame k-cpython match"[^>]*>Model\.inner<', state["dom"])


@needs_chromium
def test_search_share_over_all_processes(tmp_path: Path, page: Path) -> None:
    state = page_state(tmp_path, page, "type=cpu&search=syscall")
    assert state["total"] == 8 and state["matched"] == 1
    assert round(state["matchedPct"], 2) == 12.5
    assert {"api (100)", "engine (200)", "engine::compute(int)", "[unwind stopped: no CFI]"} <= set(state["visible"])


@needs_chromium
def test_zoom_trace_filter_process_and_type(tmp_path: Path, page: Path) -> None:
    zoomed = page_state(tmp_path, page, "zoom=Model.inner")
    assert zoomed["zoom"] == "Model.inner" and zoomed["zoomValue"] == 5 and zoomed["total"] == 8
    assert "__memcpy_avx_unaligned" in zoomed["visible"] and "engine::compute(int)" not in zoomed["visible"]
    assert 'id="state-zoom">Model.inner<' in zoomed["dom"]

    traced = page_state(tmp_path, page, f"id={TRACE_B.hex()}")
    assert traced["total"] == 1 and "read" in traced["visible"] and "__memcpy_avx_unaligned" not in traced["visible"]

    engine = page_state(tmp_path, page, "pid=200")
    assert engine["pid"] == "200" and engine["total"] == 3
    assert "Model.inner" not in engine["visible"] and HOSTILE in engine["visible"]

    off_cpu = page_state(tmp_path, page, "type=offcpu")
    assert off_cpu["type"] == "offcpu" and off_cpu["total"] == 5_000_000
    assert "schedule" in off_cpu["visible"] and "5.00 ms" in off_cpu["dom"]


@needs_chromium
def test_embedded_data_cannot_end_the_script(tmp_path: Path, page: Path) -> None:
    state = page_state(tmp_path, page)
    assert "pwned" not in state["dom"].split("<body")[0]  # the title is still ours
    assert HOSTILE in state["visible"]


@needs_chromium
def test_screenshot(tmp_path: Path, page: Path) -> None:
    """A picture to look at (kept at $OTELBPF_FLAMEGRAPH_SCREENSHOT when set)."""
    target = Path(os.environ.get("OTELBPF_FLAMEGRAPH_SCREENSHOT") or tmp_path / "flame.png")
    chromium(tmp_path, page.as_uri() + "#search=inner", f"--screenshot={target}", "--window-size=1200,520", "--hide-scrollbars")
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- accumulation --------------------------------------------------------------------------------------


def test_identical_samples_are_summed_and_processes_named() -> None:
    graph = FlameGraph()
    graph.add(make_samples(), RESOURCES)
    graph.add(make_samples(), RESOURCES)
    document = graph.document()
    assert [t["id"] for t in document["types"]] == ["cpu", "offcpu"]
    assert document["processes"]["100"]["name"] == "api (100)"
    linked = [s for s in document["stacks"] if s[4] == SPAN_A.hex() and s[1] == 0]
    assert [(s[5], s[6]) for s in linked] == [([6], 6)]  # 3 samples per add, twice
    assert sum(s[5][0] for s in document["stacks"] if s[1] == 0) == 14
    assert document["dropped"]["samples"] == 0


def test_cpu_is_the_first_type_whichever_sample_came_first() -> None:
    """The page opens on its first type: CPU, even when an off-CPU sample arrived first."""
    graph = FlameGraph()
    graph.add([Sample(OFF_CPU, 1, 1, T0, (Frame(FRAME_PYTHON, "wait", "/a.py", 1),), (7,)),
               Sample(CPU, 1, 1, T0 + 1, (Frame(FRAME_PYTHON, "spin", "/a.py", 2),), (1,))], {})  # fmt: skip
    document = graph.document()
    assert [t["id"] for t in document["types"]] == ["cpu", "offcpu"]
    names = [frame[1] for frame in document["frames"]]  # [kind, function, file, line, mapping]
    by_type = {document["types"][s[1]]["id"]: [names[i] for i in s[2]] for s in document["stacks"]}
    assert by_type == {"cpu": ["spin"], "offcpu": ["wait"]}


def test_distinct_stacks_are_capped_and_the_rest_counted() -> None:
    graph = FlameGraph(max_stacks=2)
    samples = [Sample(CPU, 1, 1, T0 + i, (Frame(FRAME_PYTHON, f"f{i}", "/a.py", i),), (1,)) for i in range(5)]
    graph.add(samples, {})
    graph.add(samples[:1], {})  # an entry already held still counts
    document = graph.document()
    assert len(document["stacks"]) == 2 and graph.dropped_samples == 3
    assert len(document["frames"]) == 2  # dropped samples left nothing behind
    assert document["dropped"] == {"samples": 3, "maxStacks": 2}
    assert "3 samples dropped" in graph.summary()


def test_the_page_is_self_contained(page: Path) -> None:
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)
    assert "fetch(" not in text and "XMLHttpRequest" not in text
    assert "__OTELBPF_FLAMEGRAPH_DATA__" not in text
    assert "</script><script>document.title" not in text  # escaped inside the JSON
