"""The flame graph page at real sizes: file size, time to the first draw, time to redraw after a
heat-map selection, in headless Chromium.

Makes ``--samples`` CPU samples (default 200,000) over ``--stacks`` distinct stacks (default
20,000; 12-40 frames from a pool of Python and native functions, as a model server's are) spread
over ``--seconds`` of recording (default 600: 30,000 heat-map cells) with a 200 ms stall every
7 s, writes the page (FlameGraph, as the agent does at exit), and opens it ``--runs`` times in
headless Chromium with ``#cells=A-B`` (a 2-second selection). The page reports its own timings
(performance.now(), in its state JSON): first draw (from navigation: parse + heat map + graph) and
the redraw after the selection (the graph rebuilt from the selected cells).

    .venv/bin/python bench/flamegraph_page.py
"""

from __future__ import annotations

import argparse
import html
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otelbpf.profiles.flamegraph import FlameGraph  # noqa: E402
from otelbpf.profiles.model import FRAME_NATIVE, FRAME_PYTHON, Frame, Mapping, Sample  # noqa: E402
from otelbpf.profiles.types import CPU  # noqa: E402

SECOND = 1_000_000_000
START = 1_750_000_000 * SECOND


def make_samples(count: int, stacks: int, seconds: int, seed: int = 1) -> list[Sample]:
    rng = random.Random(seed)
    torch = Mapping("/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so", build_id="ab" * 10)
    python = [Frame(FRAME_PYTHON, f"module{i // 20}.function_{i}", f"/app/pkg/module{i // 20}.py", 10 + i) for i in range(3000)]
    native = [Frame(FRAME_NATIVE, f"at::native::kernel_{i}(at::Tensor const&)", mapping=torch, address=0x1000 + i) for i in range(2000)]
    shapes = []
    for _ in range(stacks):
        depth = rng.randint(8, 30)
        frames = [rng.choice(python) for _ in range(depth)] + [rng.choice(native) for _ in range(rng.randint(4, 10))]
        shapes.append(tuple(reversed(frames)))  # leaf first
    weights = [1 / (i + 1) for i in range(stacks)]  # a few hot stacks, a long tail
    chosen = rng.choices(range(stacks), weights, k=count)
    chosen[: stacks] = range(stacks)  # every stack at least once
    out = []
    for index in chosen:
        ts = START + rng.randrange(seconds * SECOND)
        if rng.random() < 0.05:  # a 200 ms stall every 7 s
            ts = START + rng.randrange(seconds // 7) * 7 * SECOND + 3 * SECOND + rng.randrange(200_000_000)
        out.append(Sample(CPU, 100, 101, ts, shapes[index], (1,), "worker"))
    return out


def open_page(chromium: str, page: Path, fragment: str, profile_dir: Path) -> dict:
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
               f"--user-data-dir={profile_dir}", "--virtual-time-budget=60000", "--dump-dom", page.as_uri() + "#" + fragment]  # fmt: skip
    dom = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(html.unescape(re.search(r'<pre id="state">(.*?)</pre>', dom, re.S).group(1)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--stacks", type=int, default=20_000)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    samples = make_samples(args.samples, args.stacks, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        graph = FlameGraph()
        graph.add(samples, {100: {"service.name": "model-server"}})
        page = graph.write(Path(tmp) / "flame.html")
        written_s = time.perf_counter() - started
        size = page.stat().st_size
        print(f"{args.samples} samples, {args.stacks} stacks, {args.seconds} s: {graph.summary()}; "
              f"page {size / 1e6:.1f} MB, written in {written_s:.1f} s")  # fmt: skip
        if chromium is None:
            print("no chromium: no timings")
            return 0
        first, redraw = [], []
        selection = f"cells={3 * 50 * 7 + 150}-{3 * 50 * 7 + 249}"  # 2 s around the third stall
        for run in range(args.runs):
            state = open_page(chromium, page, selection, Path(tmp) / f"chromium-{run}")
            assert state["range"] is not None, state.get("range")
            first.append(state["timings"]["firstDrawMs"])
            redraw.append(state["timings"]["lastRedrawMs"])
            print(f"  run {run}: first draw {first[-1]:.0f} ms (JSON parse {state['timings']['parseMs']:.0f} ms), "
                  f"redraw after the selection {redraw[-1]:.0f} ms ({state['total']} samples in it, "
                  f"{len(state['visible'])} frames drawn, {state['heat']['columns']} columns)")  # fmt: skip
        print(f"median: first draw {statistics.median(first):.0f} ms, redraw {statistics.median(redraw):.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
