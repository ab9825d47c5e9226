"""``otelbpf profiles diff BASE NEW``: a differential flame graph of two profiles.

Why: slow-rank detection says *which* rank is slow; the next question is *where*. A differential
flame graph of the slow rank against a normal one shows which frames grew and which shrank.

Each side is a profiles file the agent wrote (``--profiles-json-file``: OTLP JSON lines) with a
selection: a process (``--base-pid``), any resource attribute (``--base-select
otelbpf.nccl.rank=3``: a rank), a time range (``--base-time A:B``, seconds from the file's first
sample). Both sides may be the same file (two ranks, or before and after). One sample type is
compared (``--sample-type``, default the first of the base: ``samples`` for CPU profiles).

Writes into ``--out``:

* ``diff.html``: the new side's flame graph, widths normalised to each side's total (a share, so a
  rank that ran longer is not all "grown"), each frame coloured by its share's change: red grew,
  blue shrank, the deeper the more; the tooltip gives both shares. Frames only in the base have no
  width in the new side and are listed under the graph as "gone";
* ``base.pb.gz`` and ``new.pb.gz``: the two sides as pprof, for
  ``go tool pprof -diff_base base.pb.gz new.pb.gz`` (pprof's own diff: values, not shares).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from otelbpf.otlp.jsonlines import go_escaped
from otelbpf.profiles.model import Frame, Mapping, ProfileType, Sample
from otelbpf.profiles.pprof import encode_pprof

TEMPLATE = Path(__file__).with_name("diff.html")
PLACEHOLDER = '"__OTELBPF_DIFF_DATA__"'


@dataclass
class Selection:
    """Which samples of a file one side holds."""

    pid: int | None = None
    #: resource attribute -> value (compared as text)
    attributes: dict[str, str] | None = None
    #: seconds from the file's first sample: [start, end)
    time_range: tuple[float, float] | None = None

    def describe(self) -> str:
        parts = []
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        parts.extend(f"{key}={value}" for key, value in (self.attributes or {}).items())
        if self.time_range is not None:
            start, end = self.time_range
            parts.append(f"from {start:g} s" if end == float("inf") else f"{start:g}-{end:g} s")
        return ", ".join(parts) or "all"


def samples_of_file(path: str | Path) -> tuple[list[Sample], dict[int, dict[str, Any]]]:
    """Every observation of a profiles OTLP JSON-lines file as a Sample (one sample type each),
    and each process's resource attributes."""
    from otelbpf.profiles.export import read_profiles_json_file

    samples: list[Sample] = []
    resources: dict[int, dict[str, Any]] = {}
    for request in read_profiles_json_file(path):
        samples.extend(_samples_of_request(request, resources))
    return samples, resources


def _any(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _samples_of_request(request: Any, resources: dict[int, dict[str, Any]]) -> Iterable[Sample]:
    d = request.dictionary
    strings = d.string_table

    def attributes(indices: Iterable[int]) -> dict[str, Any]:
        return {strings[d.attribute_table[i].key_strindex]: _any(d.attribute_table[i].value) for i in indices}

    frames_of: dict[int, Frame] = {}

    def frame(index: int) -> Frame:
        known = frames_of.get(index)
        if known is None:
            location = d.location_table[index]
            function, line = "", 0
            file = ""
            if location.lines:
                entry = location.lines[0]
                f = d.function_table[entry.function_index]
                function, file, line = strings[f.name_strindex], strings[f.filename_strindex], entry.line
            mapping = None
            if location.mapping_index:
                m = d.mapping_table[location.mapping_index]
                mapping = Mapping(strings[m.filename_strindex])
            kind = str(attributes(location.attribute_indices).get("profile.frame.type", "native"))
            known = frames_of[index] = Frame(kind, function, file, line, location.address, mapping)
        return known

    for resource_profiles in request.resource_profiles:
        resource = {kv.key: _any(kv.value) for kv in resource_profiles.resource.attributes}
        pid = int(resource.get("process.pid", 0))
        resources.setdefault(pid, resource)
        for scope in resource_profiles.scope_profiles:
            for profile in scope.profiles:
                sample_type = (strings[profile.sample_type.type_strindex], strings[profile.sample_type.unit_strindex])
                period_type = (strings[profile.period_type.type_strindex], strings[profile.period_type.unit_strindex])
                profile_type = ProfileType(sample_type[0], (sample_type,), period_type, profile.period)
                for sample in profile.samples:
                    stack = tuple(frame(i) for i in d.stack_table[sample.stack_index].location_indices)
                    link = d.link_table[sample.link_index] if sample.link_index else None
                    extra = attributes(sample.attribute_indices)
                    tid = int(extra.pop("thread.id", 0) or 0)
                    name = str(extra.pop("thread.name", "") or "")
                    times = list(sample.timestamps_unix_nano) or [profile.time_unix_nano] * len(sample.values)
                    for value, ts in zip(sample.values, times):
                        yield Sample(profile_type, pid, tid, ts, stack, (value,), name,
                                     link.trace_id if link else b"", link.span_id if link else b"", extra)  # fmt: skip


def select(samples: Sequence[Sample], resources: dict[int, dict[str, Any]], selection: Selection, sample_type: str,
           first_ns: int) -> list[Sample]:  # fmt: skip
    """The samples of one side."""
    out = []
    for sample in samples:
        if sample.profile.sample_types[0][0] != sample_type:
            continue
        if selection.pid is not None and sample.pid != selection.pid:
            continue
        if selection.attributes:
            resource = resources.get(sample.pid) or {}
            if any(str(resource.get(key)) != value for key, value in selection.attributes.items()):
                continue
        if selection.time_range is not None:
            offset = (sample.time_unix_nano - first_ns) / 1e9
            if not selection.time_range[0] <= offset < selection.time_range[1]:
                continue
        out.append(sample)
    return out


def _tree(samples: Iterable[Sample]) -> tuple[dict[tuple[str, ...], int], int]:
    """Root-first path of labels -> its total value (every prefix), and the side's total."""
    totals: dict[tuple[str, ...], int] = defaultdict(int)
    whole = 0
    for sample in samples:
        value = int(sample.values[0])
        whole += value
        path: tuple[str, ...] = ()
        for frame in reversed(sample.frames):
            path = (*path, frame.function)
            totals[path] += value
    return dict(totals), whole


def diff_document(base: Sequence[Sample], new: Sequence[Sample], *, base_label: str, new_label: str,
                  sample_type: str, unit: str) -> dict[str, Any]:  # fmt: skip
    """What diff.html reads: the new side's tree with each node's share on both sides."""
    base_totals, base_whole = _tree(base)
    new_totals, new_whole = _tree(new)
    kinds: dict[str, str] = {}
    for sample in (*base, *new):
        for frame in sample.frames:
            kinds.setdefault(frame.function, frame.kind)
    nodes = [
        [list(path), new_totals[path], base_totals.get(path, 0)]
        for path in sorted(new_totals)
    ]
    gone = [[list(path), value] for path, value in base_totals.items()
            if path not in new_totals and (len(path) == 1 or path[:-1] in new_totals)]  # fmt: skip
    gone = sorted(gone, key=lambda entry: -entry[1])[:200]
    return {
        "base": {"label": base_label, "total": base_whole},
        "new": {"label": new_label, "total": new_whole},
        "sampleType": [sample_type, unit],
        "kinds": kinds,
        "nodes": nodes,
        "gone": gone,
    }


def render(document: dict[str, Any]) -> str:
    data = go_escaped(json.dumps(document, ensure_ascii=False, separators=(",", ":")))
    return TEMPLATE.read_text(encoding="utf-8").replace(PLACEHOLDER, data, 1)


def write_diff(out_dir: str | Path, base: Sequence[Sample], new: Sequence[Sample], *, base_label: str, new_label: str,
               sample_type: str) -> list[Path]:  # fmt: skip
    """diff.html, base.pb.gz and new.pb.gz in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    unit = (base or new)[0].profile.sample_types[0][1] if (base or new) else ""
    page = out / "diff.html"
    page.write_text(render(diff_document(base, new, base_label=base_label, new_label=new_label,
                                         sample_type=sample_type, unit=unit)), encoding="utf-8")  # fmt: skip
    written = [page]
    for name, side in (("base", base), ("new", new)):
        profile_type = ProfileType(sample_type, ((sample_type, unit),))
        typed = [Sample(profile_type, s.pid, s.tid, s.time_unix_nano, s.frames, s.values, s.thread_name, s.trace_id,
                        s.span_id, s.attributes) for s in side]  # fmt: skip
        path = out / f"{name}.pb.gz"
        path.write_bytes(encode_pprof(typed, profile_type, comments=[f"otelbpf profiles diff: {name}"]))
        written.append(path)
    return written


# -- the command ------------------------------------------------------------------------------------


def add_parser(sub: Any) -> None:
    profiles = sub.add_parser("profiles", help="work with profiles the agent wrote (docs/profiles.md)")
    verbs = profiles.add_subparsers(dest="profiles_command", required=True)
    diff = verbs.add_parser("diff", help="a differential flame graph of two profiles (and a pprof pair)")
    diff.add_argument("base", help="the base side: a --profiles-json-file")
    diff.add_argument("new", help="the new side: a --profiles-json-file (may be the same file)")
    for side in ("base", "new"):
        diff.add_argument(f"--{side}-pid", type=int, help=f"the {side} side: this process only")
        diff.add_argument(f"--{side}-select", action="append", default=[], metavar="KEY=VALUE",
                          help=f"the {side} side: processes whose resource has KEY=VALUE (a rank: otelbpf.nccl.rank=3)")
        diff.add_argument(f"--{side}-time", metavar="A:B", help=f"the {side} side: seconds A to B from the file's first sample")
    diff.add_argument("--sample-type", help="the sample type compared (default: the base's first, e.g. samples)")
    diff.add_argument("--out", default="profiles-diff", metavar="DIR", help="where diff.html, base.pb.gz, new.pb.gz go")


def _selection(args: Any, side: str) -> Selection:
    attributes = {}
    for item in getattr(args, f"{side}_select"):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--{side}-select {item!r}: KEY=VALUE")
        attributes[key] = value
    time_range = None
    text = getattr(args, f"{side}_time")
    if text:
        start, sep, end = text.partition(":")
        if not sep:
            raise ValueError(f"--{side}-time {text!r}: A:B (seconds)")
        time_range = (float(start or 0), float(end) if end else float("inf"))
    return Selection(getattr(args, f"{side}_pid"), attributes or None, time_range)


def run(args: Any) -> int:
    import sys

    try:
        base_selection, new_selection = _selection(args, "base"), _selection(args, "new")
    except ValueError as exc:
        print(f"otelbpf profiles diff: {exc}", file=sys.stderr)
        return 2
    base_samples, base_resources = samples_of_file(args.base)
    new_samples, new_resources = (base_samples, base_resources) if args.new == args.base else samples_of_file(args.new)
    if not base_samples:
        print(f"otelbpf profiles diff: no samples in {args.base}", file=sys.stderr)
        return 1
    sample_type = args.sample_type or base_samples[0].profile.sample_types[0][0]
    base = select(base_samples, base_resources, base_selection, sample_type, min(s.time_unix_nano for s in base_samples))
    first_new = min((s.time_unix_nano for s in new_samples), default=0)
    new = select(new_samples, new_resources, new_selection, sample_type, first_new)
    if not base or not new:
        print(f"otelbpf profiles diff: the {'base' if not base else 'new'} selection has no samples of type {sample_type!r}", file=sys.stderr)
        return 1
    written = write_diff(args.out, base, new, base_label=f"{args.base} ({base_selection.describe()})",
                         new_label=f"{args.new} ({new_selection.describe()})", sample_type=sample_type)  # fmt: skip
    print(f"otelbpf profiles diff: {len(base)} base and {len(new)} new {sample_type} samples -> "
          + ", ".join(str(path) for path in written))  # fmt: skip
    return 0
