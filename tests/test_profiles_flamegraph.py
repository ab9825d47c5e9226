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


# --- the sub-second heat map ----------------------------------------------------------------------------

SECOND = 1_000_000_000
START = 1_750_000_000 * SECOND  # a whole second: cell 0 is its first 20 ms
STALL = Frame(FRAME_PYTHON, "checkpoint_stall", "/app/train.py", 7)
STEADY = Frame(FRAME_PYTHON, "serve_step", "/app/serve.py", 3)
OTHER = Frame(FRAME_PYTHON, "other_process", "/app/other.py", 1)
STALL_SPAN = bytes.fromhex("5a11" * 4)


def timed_samples() -> list[Sample]:
    """Three seconds of a server: a step every 100 ms, a 60 ms stall at 1.40 s (linked to a span),
    and another process busy at 1.41 s."""
    steady = [Sample(CPU, 100, 101, START + i * SECOND // 10 + 5_000_000, (STEADY,), (1,)) for i in range(30)]
    stall = [Sample(CPU, 100, 102, START + 1_400_000_000 + i * 6_000_000, (STALL,), (1,), trace_id=TRACE_B, span_id=STALL_SPAN)
             for i in range(10)]  # fmt: skip
    other = [Sample(CPU, 200, 201, START + 1_410_000_000 + i, (OTHER,), (1,)) for i in range(3)]
    return steady + stall + other


def in_cells(samples: list[Sample], first: int, last: int, pid: int | None = None) -> dict[str, int]:
    """Function -> samples of ``samples`` whose time falls in heat-map cells first..last."""
    out: dict[str, int] = {}
    for s in samples:
        cell = (s.time_unix_nano - START) // 20_000_000
        if first <= cell <= last and (pid is None or s.pid == pid):
            out[s.frames[0].function] = out.get(s.frames[0].function, 0) + s.values[0]
    return out


@pytest.fixture(scope="module")
def timed_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_flamegraph(tmp_path_factory.mktemp("heat") / "flame.html", timed_samples(), RESOURCES)


def test_samples_keep_their_20ms_cell() -> None:
    graph = FlameGraph()
    graph.add(timed_samples(), RESOURCES)
    document = graph.document()
    assert document["time"]["startUnixNano"] == START and document["time"]["cellNs"] == 20_000_000
    names = [frame[1] for frame in document["frames"]]
    stall = next(s for s in document["stacks"] if names[s[2][0]] == "checkpoint_stall")
    cells = dict(zip(stall[7][::2], stall[7][1::2]))  # [cell, value, cell, value, ...] (one sample type)
    assert cells == {70: 4, 71: 3, 72: 3} and sum(cells.values()) == stall[5][0] == 10
    steady = next(s for s in document["stacks"] if names[s[2][0]] == "serve_step")
    assert steady[7][::2] == [5 * i for i in range(30)]  # one step per 100 ms, in the first cell of each


def test_cells_beyond_the_bound_count_in_the_whole_run_only() -> None:
    graph = FlameGraph(max_cells=5)
    graph.add(timed_samples(), RESOURCES)
    document = graph.document()
    assert sum(len(s[7]) // 2 for s in document["stacks"]) == 5
    assert document["time"]["untimedSamples"] == len(timed_samples()) - sum(
        sum(s[7][1::2]) for s in document["stacks"])  # fmt: skip
    assert sum(s[5][0] for s in document["stacks"]) == len(timed_samples())


@needs_chromium
def test_selecting_heat_map_cells_redraws_only_that_range(tmp_path: Path, timed_page: Path) -> None:
    """The hash's cells=A-B presses on cell A and releases on cell B, as a hand would; the graph then
    holds only the samples of those 20 ms cells, with the process and trace filters still applied."""
    samples = timed_samples()
    whole = page_state(tmp_path, timed_page, "pid=100")
    assert whole["range"] is None and whole["total"] == 40
    assert whole["heat"]["columns"] == 3 and whole["heat"]["total"] == 40
    heat = {int(cell): value for cell, value in whole["heat"]["cells"].items()}
    assert heat == {cell: sum(in_cells(samples, cell, cell, pid=100).values()) for cell in range(150) if in_cells(samples, cell, cell, pid=100)}
    assert heat[70] == 5 and heat[75] == 1  # the stall's first cell (and a step), a step alone
    assert 'id="state-range">whole run<' in whole["dom"]

    stall = page_state(tmp_path, timed_page, "pid=100&cells=70-72")
    assert stall["range"] == [70, 72] and stall["rangeMs"] == [1400, 1460]
    expected = in_cells(samples, 70, 72, pid=100)
    assert expected == {"checkpoint_stall": 10, "serve_step": 1}
    assert stall["total"] == sum(expected.values())
    assert {"checkpoint_stall", "serve_step"} <= set(stall["visible"]) and "other_process" not in stall["visible"]
    assert stall["dom"].count('class="cell sel"') == 3
    assert 'id="state-range">1.40 s to 1.46 s (3 cells)<' in stall["dom"]

    everyone = page_state(tmp_path, timed_page, "cells=70-72")  # all processes: the other one's too
    assert everyone["total"] == sum(in_cells(samples, 70, 72).values()) == 14
    assert "other_process" in everyone["visible"]

    traced = page_state(tmp_path, timed_page, f"cells=60-80&id={STALL_SPAN.hex()}")  # and the trace filter
    assert traced["total"] == 10 and "serve_step" not in traced["visible"]

    quiet = page_state(tmp_path, timed_page, "pid=100&cells=100-110")  # 2.00-2.22 s: steps only
    assert quiet["total"] == sum(in_cells(samples, 100, 110, pid=100).values()) == 3
    assert "checkpoint_stall" not in quiet["visible"]


@needs_chromium
def test_the_page_compares_two_time_ranges_and_two_processes(tmp_path: Path, timed_page: Path) -> None:
    """Without the diff command: a base side (process, cells) from the hash (what "Set as base" keeps),
    the selected side coloured against it: the stall grew against a quiet range of the same process."""
    samples = timed_samples()
    quiet = in_cells(samples, 100, 149, pid=100)  # 2.00-3.00 s: steps only
    stalled = in_cells(samples, 70, 72, pid=100)
    state = page_state(tmp_path, timed_page, "pid=100&cells=70-72&base=100:100-149")
    assert state["compare"]["pid"] == "100" and state["compare"]["range"] == [100, 149]
    assert state["compare"]["total"] == sum(quiet.values()) and state["total"] == sum(stalled.values())
    frames = {f["label"]: f for f in state["compare"]["frames"]}
    stall = frames["checkpoint_stall"]
    assert stall["baseShare"] == 0 and stall["share"] == pytest.approx(10 / 11) and _reddish(stall["colour"])
    step = frames["serve_step"]
    assert step["baseShare"] == 1 and step["share"] == pytest.approx(1 / 11) and not _reddish(step["colour"])
    assert "comparing with the base: api (100), 2.00 s to 3.00 s (50 cells)" in state["dom"]

    processes = page_state(tmp_path, timed_page, "pid=200&base=100:")  # another process against this one
    shares = {f["label"]: (f["share"], f["baseShare"]) for f in processes["compare"]["frames"]}
    assert shares["other_process"] == (1, 0) and "api (100)" not in processes["visible"]  # no process level


def _reddish(colour: str) -> bool:
    r, g, b = (int(x) for x in re.findall(r"\d+", colour)[:3])
    return r > g and r > b
