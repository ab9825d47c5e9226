#!/usr/bin/env python3
"""Where the agent's memory goes: its RSS stage by stage, by mapping, and what trims it.

Starts nginx (or ``python3 -m http.server`` without nginx/wrk), an OTLP receiver, and
``otelbpf run`` tracing the server; drives the server at ``--rate`` req/s for
``--duration`` seconds and reports, per run ("variant"):

(a) stages: RSS (VmRSS), its growth, and the peak within each step (VmHWM, reset to RSS
    after each reading through /proc/PID/clear_refs) of the agent's life. The agent runs
    under a thin wrapper (this file with ``--agent-child``) that imports in stages and
    hooks the start-up, reading its own /proc/self/status: interpreter, ``import bcc``,
    protobuf, grpc + OpenTelemetry, the project's compiled extensions, libdw, the doctor's
    preflight, outputs, BPF compile + load, ring buffer mmaps, profile perf events,
    uprobes; then idle, under load (steady state), after the load; the peak is the
    highest step;
(b) at steady state, RSS by mapping from /proc/PID/smaps, grouped by file (libLLVM,
    libclang, libbcc, python, extensions, malloc heap, BPF ring buffer mmaps...), private
    vs shared, anonymous vs clean file pages; the malloc heap (glibc mallinfo2, arenas)
    and the Python heap (pymalloc arenas from sys._debugmallocstats, allocated blocks,
    gc objects), threads; and the kernel memory of the BPF maps (not in RSS);
(c) with ``--variants``, the same for each candidate reduction, and a table side by side.

Variants (``--variants a,b,...``; ``a+b`` combines two; ``--compare`` = each of them):

  default          the agent as shipped
  no-profiles      --no-profiles
  ring4            --ring-buffer-mb 4 (events ring 16 -> 4 MB)
  profile-ring4    the profile ring 16 -> 4 MB (ProfileConfig.ring_mb; no CLI flag yet)
  arena2           MALLOC_ARENA_MAX=2 (glibc: at most 2 malloc arenas, not 8 per core)
  trim             malloc_trim(0) right after the BPF compile and at the end of start-up
  free-bcc         BPF.free_bcc_memory() after start-up (bcc's own call: drops libbcc's .text)
  drop-llvm        madvise(MADV_DONTNEED) of the read-only, never-written mappings of
                   libLLVM, libclang-cpp and libbcc right after the compile (what
                   bcc_free_memory does for libbcc.so alone)
  drop-llvm-early  the same just before the compile (pages touched by the dynamic loader
                   and LLVM's static constructors at `import bcc`)
  skip-regs-check  `run`'s preflight without the doctor's task-regs probe compile
  fork-preflight   `run`'s preflight (the doctor's checks) in a forked child process
  chunked-search   otelbpf.sources.libraries.file_contains reading 1 MiB at a time
                   instead of searching an mmap of the whole file
  perf-ctx         bpf/profile.c without <uapi/linux/bpf_perf_event.h> (the context
                   struct defined locally)
  combined         what bench/README.md recommends: chunked-search + perf-ctx +
                   fork-preflight + drop-llvm-early + drop-llvm + trim + profile-ring4

The reductions are applied by the wrapper (monkeypatching, no change to the agent), so
they show what the same lines in the agent would do. Global toggles (``--no-profiles``,
``--ring-buffer-mb``, ``--agent-arg``, ``--env``, ``--fix``) apply to every run.

Run as root from the project's venv (the agent loads eBPF programs), nothing else heavy
running; numbers, no assertions:

    sudo .venv/bin/python bench/rss_breakdown.py                       # default agent, nginx at 10k req/s, 20 s
    sudo .venv/bin/python bench/rss_breakdown.py --compare --duration 12
    sudo .venv/bin/python bench/rss_breakdown.py --no-profiles --ring-buffer-mb 4
    sudo .venv/bin/python bench/rss_breakdown.py --agent-arg=--no-tls --fix trim
    sudo .venv/bin/python bench/rss_breakdown.py --server http.server --rate 1000

Any agent flag goes through ``--agent-arg`` (``--agent-arg=--no-tls``). The report is
also written as JSON (``bench/results/rss_breakdown-<UTC>.json``; ``--output``).

Caveats, printed with the report: file-backed pages of shared libraries (libLLVM's
text...) count in RSS but are clean, shared with every other process mapping the same
file, and reclaimable by the kernel at any time; the BPF ring buffers are kernel memory
(allocated once, charged to the cgroup) that the reader maps *twice* back to back (for
records that wrap), so each ring counts 2x its size in RSS. "events lost" depends on the
CPU the agent gets: on a busy machine it says more about the machine than the variant.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE_ENV = "RSSB_STAGE_FILE"
FIX_ENV = "RSSB_FIXES"
MB = 1024 * 1024


# ======================================================================================
# shared: /proc readers (kept import-light: the agent-side wrapper runs them too)
# ======================================================================================


def status_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem, Threads of a process (kB; Threads a count)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads", "VmSize"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def reset_peak(pid: int | str) -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/PID/clear_refs``, Linux >= 4.0): each
    stage then reads the peak of its own step; the process's peak is the maximum of them."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# ======================================================================================
# the agent side: `rss_breakdown.py --agent-child -- run ...` is `python -m otelbpf run ...`
# with its stages recorded and the chosen reductions applied
# ======================================================================================


class _Child:
    def __init__(self, stage_file: str, fixes: dict[str, str]) -> None:
        self.out = open(stage_file, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.fixes = fixes
        self._libc = None

    @property
    def libc(self):
        if self._libc is None:
            import ctypes

            self._libc = ctypes.CDLL(None, use_errno=True)
        return self._libc

    def write(self, record: dict) -> None:
        self.out.write(json.dumps(record) + "\n")

    def stage(self, name: str, group: str = "") -> None:
        """Record RSS now and the peak since the previous stage (VmHWM, then reset to RSS)."""
        st = status_kb()
        reset_peak("self")
        self.write({"kind": "stage", "name": name, "group": group, "t": time.monotonic(), **st})

    # -- the reductions ---------------------------------------------------------------

    def malloc_trim(self, where: str) -> None:
        before = status_kb()["VmRSS"]
        self.libc.malloc_trim(0)
        self.write({"kind": "fix", "name": f"malloc_trim(0) {where}", "freed_kb": before - status_kb()["VmRSS"]})

    def drop_llvm(self, where: str) -> None:
        """MADV_DONTNEED on the mappings of LLVM/clang/libbcc that are not writable and hold
        no anonymous (copy-on-write) page: their pages are the file's, dropping them only
        unmaps them here (they come back from the page cache if ever touched again). The
        RELRO part (r--p with anonymous pages: relocated, then made read-only) is left alone:
        dropping it would lose the relocations."""
        import ctypes

        libc = self.libc
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        before = status_kb()["VmRSS"]
        dropped = 0
        for vma in read_smaps("self"):
            path = vma["path"]
            if not any(lib in path for lib in ("libLLVM", "libclang", "libbcc.so")):
                continue
            if "w" in vma["perms"] or vma.get("Anonymous", 0) or not vma.get("Rss", 0):
                continue
            if libc.madvise(vma["start"], vma["end"] - vma["start"], 4) == 0:  # MADV_DONTNEED
                dropped += vma["Rss"]
        self.write({"kind": "fix", "name": f"madvise(DONTNEED) LLVM/clang/bcc read-only mappings {where}",
                    "freed_kb": before - status_kb()["VmRSS"], "mapped_rss_kb": dropped})

    def free_bcc(self, where: str) -> None:
        from bcc.libbcc import lib

        before = status_kb()["VmRSS"]
        rc = lib.bcc_free_memory()
        self.write({"kind": "fix", "name": f"BPF.free_bcc_memory() {where} (rc {rc})", "freed_kb": before - status_kb()["VmRSS"]})

    # -- heap statistics on SIGUSR2 ---------------------------------------------------------

    def heap_stats(self, *_args) -> None:
        import gc
        import threading

        record: dict = {"kind": "heap", "t": time.monotonic()}
        record["status"] = status_kb()
        record["malloc"] = mallinfo2(self.libc)
        record["malloc_arenas"] = malloc_arena_sizes(self.libc)
        record["pymalloc"] = pymalloc_stats()
        record["allocated_blocks"] = sys.getallocatedblocks()
        record["gc_objects"] = len(gc.get_objects())
        record["gc_frozen"] = gc.get_freeze_count()
        record["threads"] = sorted(t.name for t in threading.enumerate())
        record["modules"] = len(sys.modules)
        self.write(record)


def mallinfo2(libc) -> dict[str, int]:
    """glibc's mallinfo2 (bytes), over every arena."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc.mallinfo2.restype = Mallinfo2
        info = libc.mallinfo2()
    except AttributeError:  # glibc < 2.33
        return {}
    return {
        "heap_bytes": info.arena,  # obtained with brk/arena heaps (not mmap'd chunks)
        "in_use_bytes": info.uordblks,
        "free_bytes": info.fordblks,  # free inside the heaps: what malloc_trim may give back
        "mmapped_bytes": info.hblkhd,  # big allocations served by mmap
        "mmapped_chunks": info.hblks,
        "top_releasable_bytes": info.keepcost,
    }


def malloc_arena_sizes(libc) -> list[dict[str, int]]:
    """Per malloc arena (malloc_info's <heap nr=...>): its current size and free bytes."""
    import ctypes
    import re
    import tempfile

    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as tmp:
        fp = libc.fopen(tmp.name.encode(), b"w")
        if not fp:
            return []
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        text = open(tmp.name).read()
    arenas = []
    for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', text, re.S):
        current = re.search(r'<system type="current" size="(\d+)"', body)
        free = re.search(r'<total type="fast" count="\d+" size="(\d+)"/>\s*<total type="rest" count="\d+" size="(\d+)"', body)
        arenas.append({
            "nr": int(nr),
            "size": int(current.group(1)) if current else 0,
            "free": (int(free.group(1)) + int(free.group(2))) if free else 0,
        })
    return arenas


def pymalloc_stats() -> dict[str, int]:
    """From sys._debugmallocstats (written on the C stderr: caught with dup2)."""
    import re
    import tempfile

    with tempfile.TemporaryFile("w+") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()

    def number(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1).replace(",", "")) if m else 0

    return {
        "arenas": number(r"# arenas allocated current\s*=\s*([\d,]+)"),
        "arenas_highwater": number(r"# arenas highwater mark\s*=\s*([\d,]+)"),
        "arena_bytes": number(r"arenas \* [\d,]+ bytes/arena\s*=\s*([\d,]+)"),
        "allocated_block_bytes": number(r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
        "available_block_bytes": number(r"# bytes in available blocks\s*=\s*([\d,]+)"),
        "total_bytes": number(r"\nTotal\s*=\s*([\d,]+)"),
    }


def chunked_file_contains(libraries):
    """otelbpf.sources.libraries.file_contains reading 1 MiB at a time instead of searching an
    mmap of the whole file (whose pages, up to MAX_SEARCHED_BYTES per file, count in RSS while
    mapped). Same answers, same cache."""

    def file_contains(path: str, hint: bytes, max_bytes: int = libraries.MAX_SEARCHED_BYTES) -> bool:
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                key = (st.st_dev, st.st_ino, st.st_mtime_ns, hint)
                if key in libraries._searched:
                    return libraries._searched[key]
                found = False
                if 0 < st.st_size <= max_bytes:
                    tail = b""
                    while not found:
                        chunk = f.read(1 << 20)
                        if not chunk:
                            break
                        found = (tail + chunk).find(hint) >= 0
                        tail = chunk[-(len(hint) - 1):] if len(hint) > 1 else b""
        except (OSError, ValueError):
            return False
        if len(libraries._searched) > 4096:
            libraries._searched.clear()
        libraries._searched[key] = found
        return found

    return file_contains


PERF_EVENT_INCLUDE = "#include <uapi/linux/bpf_perf_event.h>"
#: The context of perf-event programs as the kernel lays it out (include/uapi/linux/bpf_perf_event.h;
#: bpf_user_pt_regs_t is struct pt_regs on x86-64), without the header: with BCC's kernel include
#: paths it pulls linux/ptrace.h -> linux/sched/signal.h -> most of the scheduler's headers.
LOCAL_PERF_EVENT_DATA = (
    "struct bpf_perf_event_data { struct pt_regs regs; __u64 sample_period; __u64 addr; };"
)


def local_perf_ctx(program_text):
    """bpf/profile.c with LOCAL_PERF_EVENT_DATA instead of PERF_EVENT_INCLUDE."""

    def text(*args, **kwargs):
        return program_text(*args, **kwargs).replace(PERF_EVENT_INCLUDE, LOCAL_PERF_EVENT_DATA)

    return text


def agent_child(argv: list[str]) -> int:
    """``--agent-child -- run ...``: otelbpf's ``main(["run", ...])`` with stages and fixes."""
    child = _Child(os.environ[STAGE_ENV], dict(f.partition("=")[::2] for f in os.environ.get(FIX_ENV, "").split(",") if f))
    child.stage("interpreter (python3 + site)", "start")
    fixes = child.fixes
    import signal

    signal.signal(signal.SIGUSR2, child.heap_stats)
    sys.path.insert(0, ROOT)
    otlp = any(a.startswith(("--otlp-endpoint", "--otlp-protocol")) for a in argv)

    import bcc  # noqa: F401 - libbcc + libLLVM + libclang-cpp

    child.stage("import bcc (libbcc, libLLVM, libclang-cpp)", "imports")
    if "chunked_search" in fixes:
        import otelbpf.sources.libraries as libraries

        libraries.file_contains = chunked_file_contains(libraries)
    if "local_perf_ctx" in fixes:
        import otelbpf.sources.ebpf as ebpf

        ebpf.program_text = local_perf_ctx(ebpf.program_text)
    import google.protobuf.message  # noqa: F401
    import opentelemetry.proto.trace.v1.trace_pb2  # noqa: F401

    child.stage("import protobuf (upb) + OTLP protos", "imports")
    if otlp:
        import grpc  # noqa: F401

        child.stage("import grpc (cygrpc)", "imports")
        import otelbpf.otlp.transport  # noqa: F401 - the OpenTelemetry SDK and exporters

        child.stage("import OpenTelemetry SDK + OTLP exporters", "imports")
    import importlib

    names = []
    for directory, _dirs, files in os.walk(os.path.join(ROOT, "otelbpf")):
        for name in files:
            if name.endswith(".so") and "_dwunwind" not in name:
                rel = os.path.relpath(os.path.join(directory, name.split(".")[0]), ROOT)
                names.append(rel.replace(os.sep, "."))
    for name in sorted(names):
        importlib.import_module(name)
    child.stage(f"import otelbpf's compiled extensions ({len(names)} Cython modules)", "imports")
    try:
        import otelbpf.profiles.native.unwinder  # noqa: F401 - _dwunwind, libdw, libelf

        child.stage("import the native unwinder (libdw)", "imports")
    except ImportError:
        pass
    import otelbpf.cli.doctor as doctor
    import otelbpf.cli.main as cli
    import otelbpf.cli.outputs as outputs
    import otelbpf.profiles.profiler  # noqa: F401
    import otelbpf.runtime.agent  # noqa: F401
    import otelbpf.runtime.gctune as gctune
    import otelbpf.sources.ringbuf as ringbuf
    from otelbpf.profiles.sampler import ProfileSampler
    from otelbpf.sources.ebpf import EbpfSource

    child.stage("import the rest of otelbpf (cli, agent, sources, profiles)", "imports")

    if "profile_ring_mb" in fixes:
        original_profile_config = outputs.profile_config

        def profile_config(args):
            config = original_profile_config(args)
            config.ring_mb = int(fixes["profile_ring_mb"])
            return config

        outputs.profile_config = profile_config

    original_preflight = doctor.preflight

    def preflight():
        child.stage("options checked", "start-up")
        if "skip_regs_check" in fixes:  # the check `run`'s own compile repeats, with its fallback
            doctor.check_task_regs = lambda: doctor.Check("task pt_regs helpers", doctor.OK, "skipped (rss_breakdown)")
        if "fork_preflight" in fixes:  # the doctor's checks in a child process: its compiles are not ours
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                ok = False
                try:
                    ok = original_preflight()
                finally:
                    os._exit(0 if ok else 1)
            ok = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        else:
            ok = original_preflight()
        how = " (in a forked child)" if "fork_preflight" in fixes else " (no task-regs compile)" if "skip_regs_check" in fixes else ""
        child.stage(f"preflight: the doctor's checks{how}", "start-up")
        return ok

    doctor.preflight = preflight
    original_build_consumer = outputs.build_consumer

    def build_consumer(*args, **kwargs):
        made = original_build_consumer(*args, **kwargs)
        child.stage("outputs built (sinks, exporters, their threads)", "start-up")
        return made

    outputs.build_consumer = build_consumer
    compiles = [0]
    original_compile = EbpfSource._compile

    def compile_(self, bpf_class, cflags):
        compiles[0] += 1
        if "drop_llvm_early" in fixes:  # the pages the dynamic loader and static constructors touched
            child.drop_llvm("before the compile")
        try:
            return original_compile(self, bpf_class, cflags)
        finally:
            child.stage(f"BPF compile + load #{compiles[0]} (clang/LLVM, verifier, maps)", "start-up")
            if "drop_llvm" in fixes:
                child.drop_llvm("after the compile")
            if "trim" in fixes:
                child.malloc_trim("after the compile")

    EbpfSource._compile = compile_
    rings = [0]
    original_reader = ringbuf.RingBufReader

    def reader(*args, **kwargs):
        made = original_reader(*args, **kwargs)
        rings[0] += 1
        label = {1: "events ring mmap'd (RingBufReader)", 2: "profile ring mmap'd"}.get(rings[0], f"ring #{rings[0]} mmap'd")
        child.stage(label, "start-up")
        return made

    ringbuf.RingBufReader = reader
    original_attach = ProfileSampler.attach

    def attach(self, *args, **kwargs):
        result = original_attach(self, *args, **kwargs)
        child.stage("profiles: perf events attached", "start-up")
        return result

    ProfileSampler.attach = attach
    original_start = EbpfSource.start

    def start(self):
        probes = original_start(self)
        child.stage("probes attached (uprobes, TLS, early tuples)", "start-up")
        if "free_bcc" in fixes:
            child.free_bcc("after start-up")
        return probes

    EbpfSource.start = start
    original_tune = gctune.tune

    def tune():
        result = original_tune()
        if "trim" in fixes:
            child.malloc_trim("at the end of start-up")
        child.stage("start-up over (profiler attached, gc.freeze)", "start-up")
        return result

    gctune.tune = tune
    return cli.main(argv)


# ======================================================================================
# the bench side
# ======================================================================================

VARIANTS: dict[str, dict] = {
    "default": {},
    "no-profiles": {"args": ["--no-profiles"]},
    "ring4": {"args": ["--ring-buffer-mb", "4"]},
    "profile-ring4": {"fixes": {"profile_ring_mb": "4"}},
    "arena2": {"env": {"MALLOC_ARENA_MAX": "2"}},
    "trim": {"fixes": {"trim": ""}},
    "free-bcc": {"fixes": {"free_bcc": ""}},
    "drop-llvm": {"fixes": {"drop_llvm": ""}},
    "skip-regs-check": {"fixes": {"skip_regs_check": ""}},
    "fork-preflight": {"fixes": {"fork_preflight": ""}},
    "chunked-search": {"fixes": {"chunked_search": ""}},
    "drop-llvm-early": {"fixes": {"drop_llvm_early": ""}},
    "perf-ctx": {"fixes": {"local_perf_ctx": ""}},
    # what bench/README.md recommends, together
    # (the events ring stays 16 MB: 4 MB drops events sooner when the agent is starved of CPU)
    "combined": {
        "fixes": {"chunked_search": "", "local_perf_ctx": "", "fork_preflight": "", "drop_llvm_early": "", "drop_llvm": "",
                  "trim": "", "profile_ring_mb": "4"},
    },
}


def merged_variant(name: str) -> dict:
    """``a+b+c``: the variants' arguments, environments and fixes together."""
    spec: dict = {"args": [], "env": {}, "fixes": {}}
    for part in name.split("+"):
        spec["args"] += VARIANTS[part].get("args", [])
        spec["env"].update(VARIANTS[part].get("env", {}))
        spec["fixes"].update(VARIANTS[part].get("fixes", {}))
    return spec


def read_smaps(pid: int | str) -> list[dict]:
    """Every mapping of /proc/PID/smaps: start, end, perms, path and its kB fields."""
    vmas: list[dict] = []
    current: dict | None = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split(None, 5)
                start, end = (int(x, 16) for x in parts[0].split("-"))
                current = {"start": start, "end": end, "perms": parts[1], "path": parts[5].strip() if len(parts) > 5 else ""}
                vmas.append(current)
            elif current is not None and first.endswith(":"):
                fields = line.split()
                if len(fields) >= 2 and fields[1].isdigit():
                    current[first[:-1]] = int(fields[1])
    return vmas


def smaps_rollup(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 2 and fields[0].endswith(":") and fields[1].isdigit():
                    out[fields[0][:-1]] = int(fields[1])
    except OSError:
        pass
    return out


ARENA_ALIGN = 64 * MB  # glibc's HEAP_MAX_SIZE on 64-bit: thread arenas' heaps are aligned to it

GROUPS = [  # (label, test on the path); first match wins
    ("BPF ring buffers (mmap of kernel memory, x2)", lambda p: p.startswith("anon_inode:bpf")),
    ("libLLVM-14", lambda p: "libLLVM" in p),
    ("libclang-cpp", lambda p: "libclang" in p),
    ("libbcc", lambda p: "libbcc" in p),
    ("python3.11 binary", lambda p: os.path.basename(p).startswith("python3")),
    ("grpc (cygrpc)", lambda p: "/grpc/" in p),
    ("protobuf (upb)", lambda p: "/google/_upb/" in p or "protobuf" in p),
    ("otelbpf extensions (Cython)", lambda p: "/otelbpf/" in p and ".so" in p),
    ("libdw/libelf (profiles)", lambda p: os.path.basename(p).startswith(("libdw", "libelf"))),
    ("other Python extensions", lambda p: ".cpython-" in p or "/lib-dynload/" in p or ".abi3.so" in p),
    ("LLVM's deps (z3, xml2, icu, stdc++, edit)", lambda p: any(x in os.path.basename(p) for x in ("libz3", "libxml2", "libicu", "libstdc++", "libedit"))),
    ("other shared libraries (libc, ssl, ...)", lambda p: p.startswith("/") and (".so" in p)),
    ("other files", lambda p: p.startswith("/")),
]


def group_of(vma: dict) -> str:
    path = vma["path"]
    if path == "[heap]":
        return "malloc heap (brk: main arena)"
    if path in ("[stack]", "[vdso]", "[vvar]", "[vsyscall]") or path.startswith("[vvar"):
        return "stack, vdso"
    if not path or path.startswith("[anon"):
        if vma["start"] % ARENA_ALIGN == 0 and vma["end"] - vma["start"] <= ARENA_ALIGN:
            return "malloc arenas of threads (64 MB-aligned heaps)"
        return "other anonymous (pymalloc arenas, big mallocs, thread stacks)"
    for label, test in GROUPS:
        if test(path):
            return label
    return "other: " + path


def smaps_groups(pid: int) -> dict[str, dict[str, int]]:
    groups: dict[str, dict[str, int]] = {}
    for vma in read_smaps(pid):
        if not vma.get("Rss"):
            continue
        g = groups.setdefault(group_of(vma), {"rss": 0, "pss": 0, "private": 0, "shared": 0, "anon": 0, "clean_file": 0, "vmas": 0})
        g["rss"] += vma.get("Rss", 0)
        g["pss"] += vma.get("Pss", 0)
        g["private"] += vma.get("Private_Clean", 0) + vma.get("Private_Dirty", 0)
        g["shared"] += vma.get("Shared_Clean", 0) + vma.get("Shared_Dirty", 0)
        g["anon"] += vma.get("Anonymous", 0)
        if vma["path"].startswith("/"):  # clean pages of a real file: reclaimable (re-read from the file)
            g["clean_file"] += vma.get("Private_Clean", 0) + vma.get("Shared_Clean", 0)
        g["vmas"] += 1
    return groups


def bpf_kernel_memory(pid: int) -> dict[str, int]:
    """memlock (kernel memory) of the process's BPF maps and programs, from fdinfo: not in RSS."""
    out = {"maps": 0, "map_bytes": 0, "ringbuf_bytes": 0, "progs": 0, "prog_bytes": 0}
    fd_dir = f"/proc/{pid}/fdinfo"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in fds:
        info: dict[str, str] = {}
        try:
            with open(f"{fd_dir}/{fd}") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    info[key.strip()] = value.strip()
        except OSError:
            continue
        memlock = int(info.get("memlock", "0") or 0)
        if "map_type" in info:
            out["maps"] += 1
            out["map_bytes"] += memlock
            if info["map_type"] == "27":
                out["ringbuf_bytes"] += memlock
        elif "prog_type" in info:
            out["progs"] += 1
            out["prog_bytes"] += memlock
    return out


def thread_names(pid: int) -> dict[str, int]:
    names: dict[str, int] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                continue
            names[name] = names.get(name, 0) + 1
    except OSError:
        pass
    return names


class Sampler:
    """VmRSS of a process every ``interval_s`` in a thread: the timeline and its maximum."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        import threading

        self.pid = pid
        self.interval_s = interval_s
        self.points: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = status_kb(self.pid).get("VmRSS")
            if rss is None:
                return
            self.points.append((time.monotonic(), rss))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def max_between(self, t0: float, t1: float) -> int:
        return max((rss for t, rss in self.points if t0 <= t <= t1), default=0)


def read_and_reset(pid: int) -> dict[str, int]:
    st = status_kb(pid)
    reset_peak(pid)
    return st


def fmt_mb(kb: int | float | None, sign: bool = False) -> str:
    if kb is None:
        return "-"
    return f"{kb / 1024:+.1f}" if sign else f"{kb / 1024:.1f}"


def table(headers: list[str], rows: list[list], indent: str = "  ") -> str:
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(indent + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Server:
    """The traced process and its load: nginx + wrk (bench/nginx_wrk.py's drivers, in bench/wrkbench/), or http.server + a Python loop."""

    def __init__(self, kind: str, children, workdir, rate: int) -> None:
        from wrkbench.nginx import DEFAULT_PATHS, Nginx
        from wrkbench.processes import free_port
        from wrkbench.wrk import Wrk

        self.kind = kind
        self.children = children
        self.rate = rate
        if kind == "nginx":
            self.nginx = Nginx(children, workdir, free_port(), workers=1, sendfile=False, cpus=None)
            self.nginx.start()
            self.wrk = Wrk(children, workdir, self.nginx.url, None, list(DEFAULT_PATHS))
            self.pids = self.nginx.all_pids()
        else:
            import subprocess

            self.port = free_port()
            www = workdir / "www"
            www.mkdir()
            (www / "index.html").write_text("hello\n")
            self.proc = children.start(
                "http.server", ["python3", "-m", "http.server", "--bind", "127.0.0.1", str(self.port)],
                cwd=www, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not self._answers():
                time.sleep(0.05)
            self.pids = [self.proc.pid]

    def _answers(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2) as r:
                r.read()
            return True
        except OSError:
            return False

    def load(self, duration_s: int) -> dict:
        """Drive the server for ``duration_s`` (blocks): requests served and the rate."""
        if self.kind == "nginx":
            result = self.wrk.fixed_rate(self.rate, duration_s, 1, 300)
            return {"requests": result.requests, "rps": round(result.rps), "errors": sum(result.errors.values())}
        import http.client

        sent = errors = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < duration_s:
            due = t0 + sent / self.rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/index.html")
                conn.getresponse().read()
                conn.close()
            except OSError:
                errors += 1
            sent += 1
        elapsed = time.monotonic() - t0
        return {"requests": sent, "rps": round(sent / elapsed), "errors": errors}


def run_variant(name: str, spec: dict, args, server: Server, children, workdir) -> dict:
    import signal
    import threading

    from wrkbench import checkout
    from wrkbench.agent import AgentCommand, AgentLauncher
    from wrkbench.console import say

    tag = f"{name}-{time.monotonic_ns()}"  # a variant may run more than once
    stage_file = workdir / f"stages-{tag}.jsonl"
    argv = [sys.executable, os.path.abspath(__file__), "--agent-child", "--"]
    launcher = AgentLauncher(children, None, [*args.agent_arg, *spec.get("args", [])], AgentCommand(argv, checkout.ROOT))
    fixes = {**dict(f.partition("=")[::2] for f in args.fix), **spec.get("fixes", {})}
    launcher.env[STAGE_ENV] = str(stage_file)
    launcher.env[FIX_ENV] = ",".join(f"{k}={v}" if v else k for k, v in fixes.items())
    for item in [*args.env, *(f"{k}={v}" for k, v in spec.get("env", {}).items())]:
        key, _, value = item.partition("=")
        launcher.env[key] = value
    targets = [x for pid in server.pids for x in ("--pid", str(pid))]
    if args.sink == "otlp-grpc":
        outputs = ["--otlp-endpoint", server.receiver.grpc_endpoint]
    else:
        outputs = ["--json-file", str(workdir / f"spans-{tag}.json")]
    say(f"\n== {name}: agent args {' '.join([*launcher.extra_args]) or '(none)'}"
           f"{'; env ' + ' '.join(f'{k}={v}' for k, v in spec.get('env', {}).items()) if spec.get('env') else ''}"
           f"{'; fixes ' + launcher.env[FIX_ENV] if launcher.env[FIX_ENV] else ''}")
    t_exec = time.monotonic()
    run = launcher.start(targets, outputs, timeout=120)
    sampler = Sampler(run.pid)
    result: dict = {"variant": name, "agent_args": launcher.extra_args, "env": spec.get("env", {}), "fixes": fixes}
    try:
        time.sleep(args.settle)
        t_idle = time.monotonic()
        idle = read_and_reset(run.pid)
        os.kill(run.pid, signal.SIGUSR2)  # heap statistics, idle
        time.sleep(0.5)
        load_result: dict = {}

        def drive() -> None:
            load_result.update(server.load(args.duration))

        loader = threading.Thread(target=drive, daemon=True)
        t_load = time.monotonic()
        loader.start()
        time.sleep(args.duration * 2 / 3)
        steady = read_and_reset(run.pid)
        groups = smaps_groups(run.pid)
        rollup = smaps_rollup(run.pid)
        os.kill(run.pid, signal.SIGUSR2)
        threads = thread_names(run.pid)
        kernel = bpf_kernel_memory(run.pid)
        loader.join(args.duration + 60)
        t_end = time.monotonic()
        end = read_and_reset(run.pid)
        waited = AgentLauncher.wait_idle(run)
        after = read_and_reset(run.pid)
        sampler.stop()
    finally:
        sampler.stop()
        stopped = launcher.stop(run)
    records = [json.loads(line) for line in stage_file.read_text().splitlines() if line.strip()]
    stages = [r for r in records if r["kind"] == "stage"]
    heaps = [r for r in records if r["kind"] == "heap"]
    idle_heap = heaps[0] if len(heaps) > 1 else None
    heap = heaps[-1] if heaps else None
    stages += [
        {"name": f"attached, idle {args.settle:g} s", "group": "run", "t": t_idle, **idle},
        {"name": f"under load ({load_result.get('rps', 0):,} req/s), {args.duration * 2 / 3:.0f} s in", "group": "run", "t": t_load + args.duration * 2 / 3, **steady},
        {"name": "end of load", "group": "run", "t": t_end, **end},
        {"name": f"caught up ({waited:g} s later)", "group": "run", "t": time.monotonic(), **after},
    ]
    # each stage's VmHWM is the peak of its own step (reset after each reading): the peak is their maximum
    peak = max(s.get("VmHWM", 0) for s in stages)
    peak_at = next((s["name"] for s in stages if s.get("VmHWM", 0) >= peak), "?")
    result.update(
        stages=stages,
        exec_to_tracing_s=round(run.attached_after_s or 0, 2),
        load=load_result,
        peak_kb=peak,
        peak_reached_at=peak_at,
        startup_max_kb=max((s.get("VmHWM", 0) for s in stages if s["group"] in ("start", "imports", "start-up")), default=0),
        steady_max_rss_kb=sampler.max_between(t_load, t_end),
        steady=steady,
        rollup=rollup,
        groups=groups,
        heap=heap,
        idle_heap=idle_heap,
        fix_records=[r for r in records if r["kind"] == "fix"],
        threads=threads,
        bpf_kernel=kernel,
        stats={k: v for k, v in (stopped.get("stats") or {}).items() if k.startswith(("otelbpf.events", "otelbpf.spans", "otelbpf.profile"))},
        timeline=[(round(t - t_exec, 2), kb) for t, kb in sampler.points[:: max(1, len(sampler.points) // 400)]],
    )
    return result


def report_variant(r: dict, top: int) -> str:
    out = [f"\n### {r['variant']}: peak RSS (VmHWM) {fmt_mb(r['peak_kb'])} MB, reached at: {r['peak_reached_at']}"]
    out.append(f"  start-up peak {fmt_mb(r['startup_max_kb'])} MB; highest VmRSS under load {fmt_mb(r['steady_max_rss_kb'])} MB;"
               f" load {r['load'].get('rps', 0):,} req/s ({r['load'].get('requests', 0):,} requests)")
    st = r["stats"]
    out.append(f"  function: {st.get('otelbpf.spans.created', 0):,} spans, {st.get('otelbpf.events.lost', 0):,} events lost,"
               f" {sum(v for k, v in st.items() if k.startswith('otelbpf.profiles.samples')):,} profile samples,"
               f" {st.get('otelbpf.profiles.lost', 0):,} lost; exec -> tracing {r['exec_to_tracing_s']} s")
    rows = []
    prev = 0
    for s in r["stages"]:
        rss = s.get("VmRSS", 0)
        rows.append([s["name"], fmt_mb(rss), fmt_mb(rss - prev, sign=True) if prev else "", fmt_mb(s.get("RssAnon")),
                     fmt_mb(s.get("RssFile", 0) + s.get("RssShmem", 0)), fmt_mb(s.get("VmHWM"))])
        prev = rss
    out.append("\n  (a) stage by stage (MB; 'peak in step': VmHWM since the stage above)\n"
               + table(["stage", "VmRSS", "growth", "anon", "file+shmem", "peak in step"], rows, "  "))
    for fix in r["fix_records"]:
        out.append(f"    fix: {fix['name']}: RSS -{fmt_mb(fix['freed_kb'])} MB")
    groups = sorted(r["groups"].items(), key=lambda kv: -kv[1]["rss"])
    total = {k: sum(g[k] for _, g in groups) for k in ("rss", "pss", "private", "shared", "anon", "clean_file")}
    rows = [[name, fmt_mb(g["rss"]), fmt_mb(g["private"]), fmt_mb(g["shared"]), fmt_mb(g["anon"]), fmt_mb(g["clean_file"]), fmt_mb(g["pss"])]
            for name, g in groups[:top]]
    rest = groups[top:]
    if rest:
        rows.append([f"({len(rest)} more groups)"] + [fmt_mb(sum(g[k] for _, g in rest)) for k in ("rss", "private", "shared", "anon", "clean_file", "pss")])
    rows.append(["total"] + [fmt_mb(total[k]) for k in ("rss", "private", "shared", "anon", "clean_file", "pss")])
    out.append("\n  (b) steady state by mapping (MB; /proc/PID/smaps)\n"
               + table(["mapping group", "RSS", "private", "shared", "anon", "clean file", "PSS"], rows, "  "))
    ro = r["rollup"]
    if ro:
        out.append(f"  smaps_rollup: Rss {fmt_mb(ro.get('Rss'))}, Pss {fmt_mb(ro.get('Pss'))}, Private_Dirty {fmt_mb(ro.get('Private_Dirty'))},"
                   f" Private_Clean {fmt_mb(ro.get('Private_Clean'))}, Shared_Clean {fmt_mb(ro.get('Shared_Clean'))},"
                   f" Shared_Dirty {fmt_mb(ro.get('Shared_Dirty'))}, Anonymous {fmt_mb(ro.get('Anonymous'))} MB")
    for when, heap in (("idle", r.get("idle_heap")), ("under load", r.get("heap"))):
        if not heap:
            continue
        m = heap.get("malloc", {})
        py = heap.get("pymalloc", {})
        arenas = heap.get("malloc_arenas", [])
        out.append(
            f"  {when}: malloc (glibc, {len(arenas)} arenas: {', '.join(fmt_mb(a['size'] / 1024) for a in arenas[:4])}"
            f"{', ...' if len(arenas) > 4 else ''} MB): heaps {fmt_mb(m.get('heap_bytes', 0) / 1024)} MB ="
            f" in use {fmt_mb(m.get('in_use_bytes', 0) / 1024)} + free {fmt_mb(m.get('free_bytes', 0) / 1024)};"
            f" mmap'd chunks {fmt_mb(m.get('mmapped_bytes', 0) / 1024)} MB ({m.get('mmapped_chunks', 0)})"
        )
        out.append(
            f"  {when}: Python: pymalloc {py.get('arenas', 0)} arenas = {fmt_mb(py.get('arena_bytes', 0) / 1024)} MB"
            f" (blocks in use {fmt_mb(py.get('allocated_block_bytes', 0) / 1024)} MB, free {fmt_mb(py.get('available_block_bytes', 0) / 1024)} MB);"
            f" {heap.get('allocated_blocks', 0):,} allocated blocks; {heap.get('gc_objects', 0):,} gc objects"
            f" ({heap.get('gc_frozen', 0):,} frozen); {heap.get('modules', 0)} modules"
        )
    out.append(f"  threads ({sum(r['threads'].values())}): " + ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(r["threads"].items())))
    k = r["bpf_kernel"]
    out.append(f"  kernel memory, not in RSS: {k['maps']} BPF maps {fmt_mb(k['map_bytes'] / 1024)} MB (of which ring buffers"
               f" {fmt_mb(k['ringbuf_bytes'] / 1024)} MB), {k['progs']} programs {fmt_mb(k['prog_bytes'] / 1024)} MB")
    return "\n".join(out)


def report_comparison(results: list[dict]) -> str:
    base = results[0]
    rows = []
    for r in results:
        rows.append([
            r["variant"], fmt_mb(r["peak_kb"]), fmt_mb(r["peak_kb"] - base["peak_kb"], sign=True) if r is not base else "",
            fmt_mb(r["startup_max_kb"]), fmt_mb(r["steady"].get("VmRSS")),
            fmt_mb(r["steady"].get("VmRSS", 0) - base["steady"].get("VmRSS", 0), sign=True) if r is not base else "",
            fmt_mb(r["rollup"].get("Anonymous")), fmt_mb(r["rollup"].get("Pss")), r["peak_reached_at"][:40],
        ])
    return "\n## variants (MB)\n" + table(
        ["variant", "peak (VmHWM)", "vs first", "start-up peak", "RSS under load", "vs first", "anon", "PSS", "peak reached at"], rows
    )


NOTES = """
notes:
  * RSS counts clean file-backed pages of shared libraries (libLLVM's and libclang's text above all):
    they are shared with every process mapping the same file (PSS splits them), and reclaimable:
    the kernel drops them under memory pressure and re-reads them if touched. 'anon' is what only
    swap could take back; 'clean file' is reclaimable.
  * The BPF ring buffers are kernel memory (vmalloc, charged to the cgroup when created, listed under
    'kernel memory'); the reader maps each data area twice back to back (records that wrap stay
    contiguous), and every page is inserted at mmap time: each ring counts 2 x its size + 1 page in RSS.
  * VmHWM is the peak over the process's life: a reduction applied after the peak lowers VmRSS, not VmHWM."""


def main(argv: list[str] | None = None) -> int:
    import argparse
    import shutil
    import tempfile
    from pathlib import Path

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from wrkbench.checkout import RESULTS_DIR
    from wrkbench.console import BenchError, say
    from wrkbench.machine import machine_info
    from wrkbench.processes import Children
    from wrkbench.span_counting import CountingReceiver

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", choices=("nginx", "http.server"), help="the traced server (default nginx when nginx and wrk are installed)")
    p.add_argument("--rate", type=int, default=10000, help="requests per second (default 10000; http.server: best effort)")
    p.add_argument("--duration", type=int, default=20, help="seconds of load per run (default 20; steady state read 2/3 in)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle between attach and load (default 3)")
    p.add_argument("--sink", choices=("otlp-grpc", "jsonfile"), default="otlp-grpc", help="agent output (default otlp-grpc to a local receiver)")
    p.add_argument("--variants", default="default", help=f"comma-separated, from: {', '.join(VARIANTS)} (default: default)")
    p.add_argument("--compare", action="store_true", help="run every variant")
    p.add_argument("--no-profiles", action="store_true", help="pass --no-profiles to every run")
    p.add_argument("--ring-buffer-mb", type=int, help="pass --ring-buffer-mb N to every run")
    p.add_argument("--agent-arg", action="append", default=[], metavar="ARG", help="one more agent argument for every run (repeatable; --agent-arg=--no-tls)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="environment of every agent run (repeatable; e.g. MALLOC_ARENA_MAX=2)")
    p.add_argument("--fix", action="append", default=[], metavar="NAME[=V]",
                   help="a reduction in every run: trim, free_bcc, drop_llvm, profile_ring_mb=N (repeatable)")
    p.add_argument("--top", type=int, default=14, help="mapping groups shown (default 14)")
    p.add_argument("--output", help="JSON report path (default bench/results/rss_breakdown-<UTC>.json)")
    args = p.parse_args(argv)
    if args.no_profiles:
        args.agent_arg.append("--no-profiles")
    if args.ring_buffer_mb:
        args.agent_arg += ["--ring-buffer-mb", str(args.ring_buffer_mb)]
    names = list(VARIANTS) if args.compare else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [part for n in names for part in n.split("+") if part not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if os.geteuid() != 0:
        p.error("run as root: the agent loads eBPF programs")
    if args.server is None:
        args.server = "nginx" if shutil.which("nginx") and shutil.which("wrk") else "http.server"

    children = Children()
    workdir = Path(tempfile.mkdtemp(prefix="rss_breakdown-"))
    os.chmod(workdir, 0o755)
    results = []
    try:
        server = Server(args.server, children, workdir, args.rate)
        server.receiver = CountingReceiver(children, None) if args.sink == "otlp-grpc" else None
        say(f"server: {args.server} (pids {', '.join(map(str, server.pids))}), load {args.rate:,} req/s for {args.duration} s per run, sink {args.sink}")
        for name in names:
            results.append(run_variant(name, merged_variant(name), args, server, children, workdir))
            say(report_variant(results[-1], args.top))
        if len(results) > 1:
            say(report_comparison(results))
        say(NOTES)
    except BenchError as exc:
        say(f"error: {exc}")
        return 1
    finally:
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    output = Path(args.output) if args.output else RESULTS_DIR / f"rss_breakdown-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"args": vars(args), "machine": machine_info(), "results": results}, indent=1))
    say(f"\nreport: {output}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--agent-child" and sys.argv[2] == "--":
        sys.exit(agent_child(sys.argv[3:]))
    sys.exit(main())
