"""What the agent gives back after its BPF compile (otelbpf/sources/memory.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from otelbpf.sources.memory import read_only_file_mappings

ROOT = Path(__file__).resolve().parents[1]

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 08:01 11 /usr/lib/libLLVM-16.so.1
Rss:                 512 kB
Anonymous:             0 kB
7f0000100000-7f0000200000 r-xp 00100000 08:01 11 /usr/lib/libLLVM-16.so.1
Size:               1024 kB
Rss:                 900 kB
Anonymous:             0 kB
7f0000200000-7f0000210000 r--p 00200000 08:01 11 /usr/lib/libLLVM-16.so.1
Rss:                  64 kB
Anonymous:            64 kB
7f0000210000-7f0000220000 rw-p 00210000 08:01 11 /usr/lib/libLLVM-16.so.1
Rss:                  64 kB
Anonymous:            64 kB
7f0000300000-7f0000400000 r-xp 00000000 08:01 12 /usr/lib/libssl.so.3
Rss:                 100 kB
Anonymous:             0 kB
7f0000400000-7f0000410000 r--p 00000000 08:01 13 /usr/lib/libclang-cpp.so.16
Rss:                   0 kB
Anonymous:             0 kB
"""


def test_only_clean_read_only_pages_of_the_compiler_are_chosen(tmp_path: Path) -> None:
    """Not the relocated read-only segment (anonymous pages), not the writable one, not
    other libraries, not what holds no resident page."""
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert read_only_file_mappings(("libLLVM", "libclang"), str(smaps)) == [
        (0x7F0000000000, 0x7F0000100000, 512),
        (0x7F0000100000, 0x7F0000200000, 900),
    ]
    assert read_only_file_mappings(("libLLVM",), str(tmp_path / "missing")) == []


PROGRAM = """
import bcc
from otelbpf.sources.memory import release_compiler_memory

def rss_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

first = bcc.BPF(text="int first(void *ctx) { return 0; }")
before = rss_kb()
dropped = release_compiler_memory()
after = rss_kb()
second = bcc.BPF(text="int second(void *ctx) { return 1; }")  # LLVM still works
second.load_func("second", bcc.BPF.SOCKET_FILTER)
print(before, dropped, after)
"""


@pytest.mark.ebpf
def test_a_compile_leaves_less_behind_and_the_next_compile_still_works() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, dropped, after = (int(x) for x in out.stdout.split())
    assert dropped > 20_000, out.stdout  # tens of MB of libLLVM/libclang pages
    assert after < before - 20_000, out.stdout
