#!/usr/bin/env python3
"""Before -> after: the headline figures of two (or more) nginx_wrk.py reports side by side.

    .venv/bin/python bench/compare.py bench/results/before.json bench/results/after.json [--markdown]

Each report carries its own untraced baseline (alternated in the same run), so ratios and
per-request figures compare across runs; raw req/s do not (the machine drifts between runs).
The last column is after / before for the first and last report; an arrow says whether that
moved the right way (figures marked 'better: higher/lower' in the report).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(path: Path) -> dict:
    data = json.loads(path.read_text())
    if "headline" not in data:
        raise SystemExit(f"{path}: no 'headline' (a report from an older nginx_wrk.py?)")
    return data


def show(value, unit: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) < 10:
        text = f"{value:.3f}"
    elif isinstance(value, (int, float)):
        text = f"{value:,.0f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip() if unit not in ("", "x") else text + ("x" if unit == "x" else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path, help="JSON reports, oldest (before) first")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (for a PR or bench/README.md)")
    args = p.parse_args()
    if len(args.reports) < 2:
        p.error("give at least two reports")
    reports = [load(r) for r in args.reports]
    keys: list[str] = []
    for r in reports:
        keys += [k for k in r["headline"] if k not in keys]
    names = [r.get("label") or path.stem for r, path in zip(reports, args.reports)]
    head = ["figure", *names, "after/before"]
    rows = []
    for k in keys:
        entries = [r["headline"].get(k) for r in reports]
        first = next(e for e in entries if e)
        values = [e["value"] if e else None for e in entries]
        change = ""
        a, b = values[0], values[-1]
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
            ratio = b / a
            good = (ratio > 1) == (first.get("better") == "higher") if ratio != 1 else None
            change = f"{ratio:.2f}x" + ("" if good is None else " better" if good else " worse")
        rows.append([first["label"], *[show(v, first["unit"]) for v in values], change])
    for r, path, name in zip(reports, args.reports, names):
        au = r.get("agent_under_test", {})
        print(f"{name}: {path}  (commit {au.get('commit', '')[:12]} {au.get('commit_subject', '')[:50]!r}, {au.get('modified_files')} modified files; {r.get('machine', {}).get('summary', '')}; started {r.get('started')})")
    print()
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
        for n, row in enumerate([head, *rows]):
            print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
            if n == 0:
                print("  ".join("-" * w for w in widths))
    targets = reports[-1].get("targets", [])
    if targets:
        print("\nthe issue's targets, last report (reference only):")
        for t in targets:
            print(f"  [{'MET' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
