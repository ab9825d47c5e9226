"""`otelbpf doctor`'s profile checks against this host and real interpreters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otelbpf.cli.doctor import INFO, OK, run_checks
from otelbpf.profiles import checks

PYENV = "/root/.pyenv/versions"


def _sleeper(python: str) -> subprocess.Popen:
    proc = subprocess.Popen([python, "-c", "import sys, time; print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


@pytest.mark.skipif(os.geteuid() != 0, reason="perf events and /proc/PID/mem need root")
def test_host_can_sample_and_unwind():
    assert checks.check_perf_events().status == OK
    assert checks.check_proc_mem().status == OK
    assert checks.check_native_unwinder().status == OK


def test_each_python_process_says_its_version_and_whether_frames_are_readable():
    known = _sleeper("/usr/bin/python3")
    old = f"{PYENV}/3.9.18/bin/python3.9"
    unknown = _sleeper(old) if os.path.exists(old) else None
    try:
        found = {c.name: c for c in checks.check_python_processes([known.pid] + ([unknown.pid] if unknown else []) + [os.getppid()])}
        assert found[f"profiles: pid {known.pid}"].status == INFO
        assert found[f"profiles: pid {known.pid}"].detail.startswith("CPython 3.11 (offsets known)")
        assert "; thread states from TLS: pthread key" in found[f"profiles: pid {known.pid}"].detail
        if unknown is not None:
            detail = found[f"profiles: pid {unknown.pid}"].detail
            assert "3.9" in detail and "native" in detail, detail
    finally:
        known.kill()
        if unknown is not None:
            unknown.kill()


def test_the_doctor_report_lists_the_profile_checks():
    names = [c.name for c in run_checks()]
    for name in ("profiles: perf events", "profiles: /proc/PID/mem", "profiles: native unwinder"):
        assert name in names
