"""An interactive flame graph as ONE self-contained HTML file, for looking at profiles without a backend.

``FlameGraph`` accumulates samples over the agent's whole run (bounded: at
most ``max_stacks`` distinct (process, type, stack, span) entries; samples
of new entries beyond that are counted as dropped and shown on the page)
and ``write`` renders ``flamegraph.html`` (next to this module) with the
data embedded as JSON. The page needs no network (vanilla JS and CSS inline,
a Content-Security-Policy that forbids fetching anything): it can be mailed,
attached to a ticket, opened from a file:// URL on an air-gapped host.

The page (an icicle graph: callers on top) offers click-to-zoom, a search
(regex over function and file:line) that highlights frames and shows the
share of samples matched, a trace id / span id filter (prefix of either), a
profile type and a process selector, tooltips (function, file:line,
mapping, value and percentages), frames coloured by kind (Python, native,
kernel, unwind-stop markers). Its URL hash drives and reflects the state
(``#type=cpu&pid=42&search=inner&id=<hex>&zoom=outer``; ``span=`` and
``trace=`` are accepted for ``id=``), and it writes the state as JSON into
``<pre id="state">`` so a headless browser's ``--dump-dom`` can be checked.

Above the graph, a sub-second heat map (as Netflix's FlameScope draws one):
one column per second of the recording, 50 cells of 20 ms each, shaded by
the selected type's value in that time (with the process and trace filters
applied). Selecting a range of cells (press on one, release on another)
redraws the graph from that range's samples only; ``#cells=A-B`` in the hash
selects cells A to B (cell = second * 50 + row, from the recording's first
whole second). For that, each stack entry keeps its values per 20 ms cell.
"Set as base" keeps the selected process and cells as the base of a
comparison (``base=PID:A-B``): the graph is then coloured by each frame's
share change against it (red grew, blue shrank), as ``otelbpf profiles diff``
colours its page.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import otelbpf
from otelbpf.otlp.jsonlines import go_escaped
from otelbpf.profiles.model import Frame, ProfileType, Sample

DEFAULT_MAX_STACKS = 20_000
#: The heat map's cell (FlameScope's: 50 rows of 20 ms per one-second column).
CELL_NS = 20_000_000
CELLS_PER_SECOND = 50
#: (stack entry, cell) pairs kept for the heat map (~170 bytes each: ~50 MB at most); beyond,
#: samples count in their stack's total only (counted, and the page says so). 10 minutes of 8 busy
#: threads at 19 Hz is ~90,000 samples, so at most as many pairs.
DEFAULT_MAX_CELLS = 300_000
TEMPLATE = Path(__file__).with_name("flamegraph.html")
PLACEHOLDER = '"__OTELBPF_FLAMEGRAPH_DATA__"'


class FlameGraph:
    """Samples summed per (pid, profile type, stack, trace id, span id), with frames and types interned."""

    def __init__(self, max_stacks: int = DEFAULT_MAX_STACKS, max_cells: int = DEFAULT_MAX_CELLS) -> None:
        self.max_stacks = max_stacks
        self.max_cells = max_cells
        #: key -> {20 ms cell since the epoch: [values...]}: the heat map and time selections
        self._cells: dict[tuple, dict[int, list[int]]] = {}
        self._cell_count = 0
        self.untimed_samples = 0
        self._frames: dict[Frame, int] = {}
        self._types: dict[ProfileType, int] = {}
        self._processes: dict[int, dict[str, Any]] = {}
        #: key -> [values..., observation count]
        self._stacks: dict[tuple, list[int]] = {}
        #: id(frames tuple) -> (the tuple, its frame indices), for the tuples of the last add()
        #: (samples share stack tuples: otelbpf.profiles.stacks)
        self._known: dict[int, tuple[tuple[Frame, ...], tuple[int, ...]]] = {}
        self.dropped_samples = 0

    def add(self, samples: Iterable[Sample], resources: Mapping[int, Mapping[str, Any]]) -> None:
        """Sum ``samples`` in; a sample whose entry is new once ``max_stacks`` are held is dropped (counted)."""
        self._known = {}  # held for one call: the tuples of older intervals are not kept alive
        for sample in samples:
            full = len(self._stacks) >= self.max_stacks
            key = self._key(sample, intern=not full)
            totals = self._stacks.get(key) if key is not None else None
            if totals is None:
                if full:  # nothing of it was interned either: the frame table stays bounded too
                    self.dropped_samples += 1
                    continue
                totals = self._stacks[key] = [0] * (len(sample.profile.sample_types) + 1)
                self._note_process(sample.pid, resources)
            width = len(totals) - 1
            for index in range(width):
                totals[index] += int(sample.values[index]) if index < len(sample.values) else 0
            totals[-1] += 1
            self._add_cell(key, sample, width)

    def _add_cell(self, key: tuple, sample: Sample, width: int) -> None:
        """The sample's values in its stack entry's 20 ms cell (bounded: max_cells in all)."""
        cells = self._cells.get(key)
        if cells is None:
            cells = self._cells[key] = {}
        cell = sample.time_unix_nano // CELL_NS
        values = cells.get(cell)
        if values is None:
            if self._cell_count >= self.max_cells or sample.time_unix_nano <= 0:
                self.untimed_samples += 1
                return
            self._cell_count += 1
            values = cells[cell] = [0] * width
        for index in range(width):
            values[index] += int(sample.values[index]) if index < len(sample.values) else 0

    def _key(self, sample: Sample, *, intern: bool) -> tuple | None:
        """The sample's entry key; None when not interning and a frame or type is unknown (a new entry)."""
        known = self._known.get(id(sample.frames))
        if known is not None and known[0] is sample.frames:
            type_index = self._types.get(sample.profile)
            if type_index is None and intern:
                type_index = self._types.setdefault(sample.profile, len(self._types))
            if type_index is None:
                return None
            frames = known[1]
        elif intern:
            type_index = self._types.setdefault(sample.profile, len(self._types))
            frames = tuple(self._frames.setdefault(frame, len(self._frames)) for frame in sample.frames)
            self._known[id(sample.frames)] = (sample.frames, frames)
        else:
            type_index = self._types.get(sample.profile)
            frames = tuple(self._frames.get(frame, -1) for frame in sample.frames)
            if type_index is None or -1 in frames:
                return None
        return sample.pid, type_index, frames, sample.trace_id.hex(), sample.span_id.hex()

    def _note_process(self, pid: int, resources: Mapping[int, Mapping[str, Any]]) -> None:
        if pid not in self._processes:
            attributes = dict(resources.get(pid) or {})
            self._processes[pid] = {"name": process_name(pid, attributes), "attributes": _plain(attributes)}

    def summary(self) -> str:
        text = f"{len(self._stacks)} distinct stacks, {len(self._frames)} frames"
        return text + (f", {self.dropped_samples} samples dropped" if self.dropped_samples else "")

    def document(self) -> dict[str, Any]:
        """What the page reads (see flamegraph.html): types, processes, frames, stacks (frames leaf first).

        The page opens on its first type: CPU when there is one, not whichever
        type's sample happened to arrive first (an off-CPU one, often)."""
        types = sorted(self._types, key=lambda profile_type: (profile_type.id != "cpu", self._types[profile_type]))
        position = {self._types[profile_type]: index for index, profile_type in enumerate(types)}
        first = min((cell for cells in self._cells.values() for cell in cells), default=0)
        first -= first % CELLS_PER_SECOND  # the first whole second: cell 0 is its first 20 ms
        return {
            "generator": f"otelbpf {otelbpf.__version__}",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "types": [_type_entry(profile_type) for profile_type in types],
            "processes": {str(pid): process for pid, process in self._processes.items()},
            "frames": [_frame_entry(frame) for frame in self._frames],
            # [pid, type, frames, trace, span, values, observations, [cell, values..., cell, values...]]
            "stacks": [
                [pid, position[type_index], list(frames), trace, span, totals[:-1], totals[-1],
                 _flat_cells(self._cells.get((pid, type_index, frames, trace, span)), first)]
                for (pid, type_index, frames, trace, span), totals in self._stacks.items()
            ],  # fmt: skip
            "time": {"startUnixNano": first * CELL_NS, "cellNs": CELL_NS, "cellsPerColumn": CELLS_PER_SECOND,
                     "untimedSamples": self.untimed_samples},  # fmt: skip
            "dropped": {"samples": self.dropped_samples, "maxStacks": self.max_stacks},
        }

    def html(self) -> str:
        return render_html(self.document())

    def write(self, path: str | Path) -> Path:
        """Write the page whole (aside, then renamed: a browser never opens half of it)."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(self.html(), encoding="utf-8")
        os.replace(partial, path)
        return path


def render_html(document: Mapping[str, Any]) -> str:
    """The page with ``document`` embedded; ``<``, ``>``, ``&`` escaped so no data can end the script."""
    data = go_escaped(json.dumps(document, ensure_ascii=False, separators=(",", ":")))
    return TEMPLATE.read_text(encoding="utf-8").replace(PLACEHOLDER, data, 1)


def write_flamegraph(
    path: str | Path,
    samples: Iterable[Sample],
    resources: Mapping[int, Mapping[str, Any]],
    *,
    max_stacks: int = DEFAULT_MAX_STACKS,
) -> Path:
    """One-shot: the flame graph page of ``samples`` at ``path``."""
    graph = FlameGraph(max_stacks)
    graph.add(samples, resources)
    return graph.write(path)


def process_name(pid: int, attributes: Mapping[str, Any]) -> str:
    """What the process selector shows: the service or executable name, and the pid."""
    for key in ("service.name", "process.executable.name", "process.command"):
        if attributes.get(key):
            return f"{attributes[key]} ({pid})"
    return f"pid {pid}"


def _flat_cells(cells: Mapping[int, list[int]] | None, first: int) -> list[int]:
    """A stack entry's cells as the page reads them: cell (from ``first``), its values, ...; by time."""
    out: list[int] = []
    for cell in sorted(cells or ()):
        out.append(cell - first)
        out.extend(cells[cell])
    return out


def _type_entry(profile_type: ProfileType) -> dict[str, Any]:
    return {
        "id": profile_type.id,
        "sampleTypes": [list(pair) for pair in profile_type.sample_types],
        "periodType": list(profile_type.period_type),
        "period": profile_type.period,
    }


def _frame_entry(frame: Frame) -> list[Any]:
    """[kind, function, file, line, mapping path (with build id)]."""
    mapping = ""
    if frame.mapping is not None:
        mapping = frame.mapping.path + (f" (build id {frame.mapping.build_id})" if frame.mapping.build_id else "")
        if frame.address:
            mapping += f" @ {frame.address:#x}"
    return [frame.kind, frame.function, frame.file, frame.line, mapping]


def _plain(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as JSON can hold them (anything odd as text)."""
    plain = (str, int, float, bool)
    return {str(key): value if isinstance(value, plain) else str(value) for key, value in attributes.items()}
