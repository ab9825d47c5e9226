"""This repository and the checkouts an agent under test comes from.

A report records which commit it measured (and whether the tree was modified), so two reports
can be compared knowing what each one ran; the results go under bench/results/ (gitignored).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"


def git_state(path: Path) -> dict[str, Any]:
    """Commit and dirtiness of the checkout at ``path`` (read-only git commands)."""
    def git(*cmd: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(path), *cmd], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "commit_subject": git("log", "-1", "--format=%s") if commit else "", "modified_files": len(status.splitlines()) if commit else None}


def read_commit() -> str:
    """HEAD's commit as recorded in .git (read, not by running git); the work tree may differ."""
    git = ROOT / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).exists():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return ""
