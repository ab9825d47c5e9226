"""``otelbpf profiles diff``: two ranks of one recording, one made slow in a known function.

The recording is written as the agent writes it (``--profiles-json-file``: OTLP JSON lines); the
command reads it back, selects each rank by its resource attribute, and writes the diff page
(checked in headless Chromium: the slow function grew, the others' shares shrank) and a pprof pair
that ``go tool pprof -diff_base`` reads.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest
from test_profiles_export import flat_and_cum, go_pprof
from test_profiles_flamegraph import CHROMIUM, chromium, needs_chromium

from otelbpf.cli.main import main
from otelbpf.profiles.diff import Selection, samples_of_file, select
from otelbpf.profiles.export import ProfilesJsonFileExporter
from otelbpf.profiles.model import FRAME_NATIVE, FRAME_PYTHON, Frame, Sample
from otelbpf.profiles.types import CPU, OFF_CPU

SECOND = 1_000_000_000
T0 = 1_750_000_000 * SECOND
TRAIN = Frame(FRAME_PYTHON, "train_step", "/app/train.py", 10)
FORWARD = Frame(FRAME_PYTHON, "forward", "/app/model.py", 20)
ALLREDUCE = Frame(FRAME_NATIVE, "ncclAllReduce")
SLOW = Frame(FRAME_PYTHON, "load_batch_from_slow_disk", "/app/data.py", 30)
RESOURCES = {
    11: {"process.pid": 11, "service.name": "trainer", "otelbpf.nccl.rank": 0},
    12: {"process.pid": 12, "service.name": "trainer", "otelbpf.nccl.rank": 1},
}


def rank_samples(pid: int, slow: int) -> list[Sample]:
    """60 forward and 40 all-reduce samples a rank; the slow rank also ``slow`` in the data loader,
    all in the recording's second 5 onward (its first seconds are warm-up: 10 forward samples)."""
    out = [Sample(CPU, pid, pid, T0 + i * 1000, (FORWARD, TRAIN), (1,)) for i in range(10)]
    at = T0 + 5 * SECOND
    out += [Sample(CPU, pid, pid, at + i * 1000, (FORWARD, TRAIN), (1,)) for i in range(60)]
    out += [Sample(CPU, pid, pid, at + i * 1000, (ALLREDUCE, TRAIN), (1,)) for i in range(40)]
    out += [Sample(CPU, pid, pid, at + i * 1000, (SLOW, TRAIN), (1,)) for i in range(slow)]
    out += [Sample(OFF_CPU, pid, pid, at, (ALLREDUCE, TRAIN), (1_000_000,))]  # another type: not compared
    return out


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("diff") / "profiles.jsonl"
    exporter = ProfilesJsonFileExporter(path)
    assert exporter.export(rank_samples(11, 0) + rank_samples(12, 50), RESOURCES)
    exporter.shutdown()
    return path


def test_a_recording_reads_back_and_selects_by_rank_and_time(recording: Path) -> None:
    samples, resources = samples_of_file(recording)
    assert resources[12]["otelbpf.nccl.rank"] == 1
    first = min(s.time_unix_nano for s in samples)
    rank1 = select(samples, resources, Selection(attributes={"otelbpf.nccl.rank": "1"}), "samples", first)
    assert len(rank1) == 160 and {s.pid for s in rank1} == {12}
    steady = select(samples, resources, Selection(pid=11, time_range=(4, 10)), "samples", first)
    assert len(steady) == 100  # the warm-up's 10 left out
    assert {s.frames[0].function for s in steady} == {"forward", "ncclAllReduce"}


def test_the_diff_of_a_rank_made_slow_shows_its_function_grown(tmp_path: Path, recording: Path) -> None:
    out = tmp_path / "diff"
    assert main(["profiles", "diff", str(recording), str(recording), "--base-select", "otelbpf.nccl.rank=0",
                 "--new-select", "otelbpf.nccl.rank=1", "--base-time", "4:", "--new-time", "4:", "--out", str(out)]) == 0  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["base.pb.gz", "diff.html", "new.pb.gz"]

    if shutil.which("go"):  # pprof's own diff: the slow function +50, the rest unchanged
        top = flat_and_cum(go_pprof(tmp_path, "-top", "-diff_base", str(out / "base.pb.gz"), str(out / "new.pb.gz")))
        assert top["load_batch_from_slow_disk"] == (50, 50)
        assert "forward" not in top or top["forward"][0] == 0

    if CHROMIUM is None:
        pytest.skip("chromium not installed")
    dom = chromium(tmp_path, (out / "diff.html").as_uri(), "--dump-dom")
    match = re.search(r'<pre id="state">(.*?)</pre>', dom, re.S)
    state = json.loads(html.unescape(match.group(1)))
    frames = {f["path"]: f for f in state["frames"]}
    slow = frames["train_step;load_batch_from_slow_disk"]
    assert slow["baseShare"] == 0 and slow["newShare"] == pytest.approx(50 / 150) and slow["delta"] > 0.3
    assert slow["colour"].startswith("rgb(") and _red(slow["colour"])
    forward = frames["train_step;forward"]  # same count, smaller share of a longer step: shrank
    assert forward["baseShare"] == pytest.approx(0.6) and forward["newShare"] == pytest.approx(0.4) and forward["delta"] < 0
    assert not _red(forward["colour"])
    assert frames["train_step"]["delta"] == pytest.approx(0)
    assert state["base"]["total"] == 100 and state["new"]["total"] == 150


@needs_chromium
def test_frames_only_in_the_base_are_listed_as_gone(tmp_path: Path, recording: Path) -> None:
    out = tmp_path / "diff"
    assert main(["profiles", "diff", str(recording), str(recording), "--base-pid", "12", "--new-pid", "11",
                 "--out", str(out)]) == 0  # fmt: skip
    dom = chromium(tmp_path, (out / "diff.html").as_uri(), "--dump-dom")
    state = json.loads(html.unescape(re.search(r'<pre id="state">(.*?)</pre>', dom, re.S).group(1)))
    assert state["gone"] == ["train_step;load_batch_from_slow_disk"]
    assert "Gone (in the base only): train_step &gt; load_batch_from_slow_disk" in dom


def test_a_bad_selection_is_a_clear_error(tmp_path: Path, recording: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["profiles", "diff", str(recording), str(recording), "--base-select", "rank"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["profiles", "diff", str(recording), str(recording), "--new-pid", "99", "--out", str(tmp_path)]) == 1
    assert "the new selection has no samples of type 'samples'" in capsys.readouterr().err


def _red(colour: str) -> bool:
    r, g, b = (int(x) for x in re.findall(r"\d+", colour)[:3])
    return r > g and r > b
