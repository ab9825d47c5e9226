"""The machine a run measures: whether it can run the bench at all, and what it is, for the report.

``preflight`` fails early with a message saying what to install or how to run, rather than
half-way through a run; ``machine_info`` goes into every report, so figures from different
machines are not compared unknowingly.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .agent import AgentCommand
from .checkout import ROOT, read_commit
from .console import BenchError, say


def preflight(args: argparse.Namespace) -> None:
    if os.geteuid() != 0:
        raise BenchError("run as root (the agent loads eBPF programs): sudo .venv/bin/python bench/nginx_wrk.py")
    for tool, package in (("nginx", "nginx-light"), ("wrk", "wrk"), ("taskset", "util-linux")):
        if shutil.which(tool) is None:
            raise BenchError(f"{tool} not found in PATH: apt-get install {package} (scripts/install.sh does it)")
    check = subprocess.run([sys.executable, "-c", "import bcc"], capture_output=True, text=True, cwd=ROOT)
    if check.returncode != 0:
        raise BenchError(
            f"{sys.executable} cannot import bcc: run with the project's venv (make bench, or .venv/bin/python)\n{check.stderr.strip()[-600:]}"
        )
    command = AgentCommand.from_args(args)
    check = subprocess.run([*command.argv, "run", "--help"], capture_output=True, text=True, cwd=command.cwd)
    if check.returncode != 0:
        raise BenchError(f"the agent under test does not start: {' '.join(command.argv)} run --help (in {command.cwd}) exited {check.returncode}\n{(check.stderr or check.stdout).strip()[-900:]}")
    if command.argv[1:3] == ["-m", "otelbpf"]:
        where = subprocess.run([command.argv[0], "-c", "import otelbpf; print(otelbpf.__file__)"], capture_output=True, text=True, cwd=command.cwd).stdout.strip()
        if where and not Path(where).resolve().is_relative_to(command.cwd):
            say(f"WARNING: {command.argv[0]} -m otelbpf in {command.cwd} imports {where}, not that checkout's code")


def machine_info() -> dict[str, Any]:
    def run(cmd: list[str]) -> str:
        """First line of a version command's output (nginx and wrk print it to stderr)."""
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return out.strip().splitlines()[0] if out.strip() else ""

    model = ""
    try:
        model = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except StopIteration:
        pass
    mem_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    try:
        import bcc  # noqa: F401

        bcc_version = getattr(bcc, "__version__", "")
    except Exception:  # noqa: BLE001
        bcc_version = ""
    info = {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": mem_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "bcc": bcc_version,
        "nginx": run(["nginx", "-v"]).replace("nginx version: ", ""),
        "wrk": run(["wrk", "-v"]),
        "commit": read_commit(),
    }
    info["summary"] = f"{info['cpus']} vCPU, {mem_gb} GB, kernel {info['kernel']}, {info['nginx']}, Python {info['python']}, BCC {bcc_version}"
    return info
