"""GPU probes: find the CUDA runtime, the CUDA driver and NCCL in traced
processes and attach bpf/gpu.c and bpf/calls.c to them (docs/gpu.md).

Which files: every executable mapping whose name looks like the library
(``libcudart.so.12``, ``libcuda.so.1``, ``libnccl.so.2``) or that contains
one of its exported names (a copy bundled in a framework, renamed), confirmed
by its ``.dynsym`` (otelbpf.sources.libraries, otelbpf.sources.uprobes:
versioned names such as ``cudaMalloc@@libcudart.so.12`` match, and aliases
at one address, like NCCL's ``ncclAllReduce``/``pncclAllReduce``, are
attached once). Attached per process; libraries loaded later (dlopen, an
import of torch after start) are found when the process opens a connection
(at most once a second) and by the periodic re-scan (5 s).

What, with the facts measured on a real H100 (docs/gpu.md, "What is probed, and why so"):

* kernel launches: entry-only probes on the driver's launch functions (the
  runtime's ``cudaLaunchKernel`` misses cuBLAS's ``cuLaunchKernelEx`` and
  every Triton kernel), counted per thread and per process in the kernel
  (entry + return with ``--gpu-launch-time``, which sums the time inside
  them too); the per-process totals are read at each metrics collection and
  at the process's exit (:meth:`GpuProbes.launch_totals`);
* timeline calls: entry + return probes (``call_enter``/``call_return``) on
  copies, synchronisations, allocations, pinning and NCCL calls, reported
  only when no other probed call is in progress on the thread
  (CALL_OUTERMOST_ONLY: ``cudaMemcpy`` and the ``cuMemcpyHtoD_v2`` it makes
  are one operation), carrying the thread's launch count;
* never ``cudaGetDevice``/``cuCtxGetDevice`` (called ~13 times per launch);
* with GPU profiles' launch samples, what names the launched kernels (:data:`NAME_SPECS`: module
  and library loads, the runtime's registration, what the runtime's launch calls were given).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from otelbpf import semconv as sc
from otelbpf.host.procfs import executable_mappings
from otelbpf.semantics.gpu_functions import (
    CUDA_FUNCTIONS,
    CUDA_OUT_POINTER_FUNCTIONS,
    CUDA_STACK_FUNCTIONS,
    NCCL_COLLECTIVES,
    NCCL_FUNCTION_INDEX,
    NCCL_FUNCTIONS,
    NCCL_OUT_POINTER_FUNCTIONS,
    NCCL_STACK_FUNCTIONS,
    nccl_abi,
)
from otelbpf.sources.uprobes import Attachment, ProbeSpec, resolve_symbols

log = logging.getLogger("otelbpf.gpu")

#: bpf/calls.c per-site flags
CALL_OUTERMOST_ONLY = 2
CALL_TAKES_LAUNCHES = 4
CALL_READS_OUT0 = 8
CALL_READS_STACK_ARG = 16
CALL_READS_ARG2_POINTEE = 32
#: GPU profiles: an outermost call takes a stack sample at entry (bpf/profile.c gpu_stack_sample)
CALL_STACK = 64
#: bpf/ranks.c: a collective clocks its thread's time off the CPU from then on (CALL_RANK_CLOCK);
#: a call of a clocked thread reads that clock at entry and return (CALL_CLOCKED)
CALL_RANK_CLOCK = 128
CALL_CLOCKED = 256
#: bpf/calls.c comm_seqs: a collective takes the next number of its (handle, function), the handle
#: in argument CALL_COMM_ARG, the counter CALL_COMM_FUNC; set-up and destruction start a handle over
CALL_COMM_SEQ = 512
CALL_COMM_RESET = 1024


def comm_seq_flags(function: str) -> int:
    """The site flags that count ``function``'s calls per communicator handle (0: not counted:
    its handle is not in a register, as ncclReduce's)."""
    comm_index = NCCL_COLLECTIVES[function][4]
    if comm_index is None:
        return 0
    return CALL_COMM_SEQ | comm_index << 16 | NCCL_FUNCTION_INDEX[function] << 20


#: function -> its own site flags, beside its spec's
FUNCTION_FLAGS = {name: comm_seq_flags(name) for name in NCCL_COLLECTIVES}
FUNCTION_FLAGS.update({name: CALL_COMM_RESET for name in NCCL_OUT_POINTER_FUNCTIONS + ("ncclCommDestroy",)})
#: The functions that do (allocations, pinning, copies, synchronisations, collectives).
STACK_FUNCTIONS = CUDA_STACK_FUNCTIONS | NCCL_STACK_FUNCTIONS
#: How ncclCommInitRank(comm*, nranks, ncclUniqueId id, rank) receives its 128-byte id, per
#: machine, as the bpf/calls.c flag that reads its first 16 bytes into args[4..5]:
#: x86-64 (System V): a struct over 16 bytes is copied onto the stack (read at sp + 8 at entry);
#: arm64 (AAPCS64): a composite over 16 bytes is passed by reference to a caller's copy, the
#: pointer taking the argument's register (x2). The rank register follows
#: (otelbpf.semantics.gpu_functions.NCCL_RANK_REGISTERS).
NCCL_ID_FLAGS = {"x86_64": CALL_READS_STACK_ARG, "aarch64": CALL_READS_ARG2_POINTEE}


def nccl_id_flag(machine: str | None = None) -> int:
    """The flag that reads the ncclUniqueId on ``machine`` (default: :func:`nccl_abi`; 0: not known)."""
    return NCCL_ID_FLAGS.get(machine or nccl_abi(), 0)

CUDART = r"/libcudart[^/]*\.so"
CUDA_DRIVER = r"/libcuda\.so"
NCCL = r"/libnccl[^/]*\.so"

#: The driver's launch entry points (``_ptsz``: the per-thread default stream variants), by where
#: the launched handle is (bpf/gpu.c has an entry program per shape: a sampled launch carries it):
#: (spec name, functions, entry program): the first argument (cuLaunchKernel(f, ...),
#: cuLaunchCooperativeKernel(f, ...)), the second (cuLaunchKernelEx(config, f, ...)), a graph's.
LAUNCH_SHAPES = (
    ("gpu.launches", ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"),
     "gpu_launch_enter"),
    ("gpu.launches.ex", ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"), "gpu_launch_ex_enter"),
    ("gpu.launches.graph", ("cuGraphLaunch", "cuGraphLaunch_ptsz"), "gpu_graph_launch_enter"),
)  # fmt: skip
LAUNCH_FUNCTIONS = tuple(name for _spec, functions, _entry in LAUNCH_SHAPES for name in functions)
LAUNCH_SPECS = tuple(
    ProbeSpec(name, CUDA_DRIVER, functions, entry=entry, hint=b"cuLaunchKernel") for name, functions, entry in LAUNCH_SHAPES
)
#: --gpu-launch-time: entry + return, summing the time inside launch calls (~4.5 us a launch on an H100).
TIMED_LAUNCH_SPECS = tuple(
    ProbeSpec(name, CUDA_DRIVER, functions, entry=f"{entry}_timed", ret="gpu_launch_return", hint=b"cuLaunchKernel")
    for name, functions, entry in LAUNCH_SHAPES
)

#: GPU profiles with launch samples: what names the kernels of their kernel frames (bpf/gpu_names.c,
#: otelbpf/profiles/gpu_kernels.py) and what a launch through the runtime was given (bpf/gpu.c).
#: None of these runs per launch but the runtime's launch functions (an entry-only probe that
#: notes the function for the driver launch it makes, in a per-CPU slot).
NAME_SPECS = (
    ProbeSpec("gpu.names.module", CUDA_DRIVER, ("cuModuleGetFunction",), entry="gpu_name_module_enter", ret="gpu_name_return",
              hint=b"cuMemcpyHtoDAsync"),
    ProbeSpec("gpu.names.library", CUDA_DRIVER, ("cuLibraryGetKernel",), entry="gpu_name_library_enter", ret="gpu_name_return",
              hint=b"cuMemcpyHtoDAsync"),
    ProbeSpec("gpu.names.kernel_function", CUDA_DRIVER, ("cuKernelGetFunction",), entry="gpu_name_kernel_function_enter",
              ret="gpu_name_return", hint=b"cuMemcpyHtoDAsync"),
    ProbeSpec("gpu.names.registered", CUDART, ("__cudaRegisterFunction",), entry="gpu_name_registered_enter", hint=b"cudaMemcpyAsync"),
    ProbeSpec("gpu.names.runtime_kernel", CUDART, ("__cudaGetKernel",), entry="gpu_name_runtime_kernel_enter",
              ret="gpu_name_return", hint=b"cudaMemcpyAsync"),
    ProbeSpec("gpu.launches.runtime", CUDART, ("cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchCooperativeKernel",
              "cudaLaunchCooperativeKernel_ptsz"), entry="gpu_runtime_launch_enter", hint=b"cudaMemcpyAsync"),
    ProbeSpec("gpu.launches.runtime.ex", CUDART, ("cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz"),
              entry="gpu_runtime_launch_ex_enter", hint=b"cudaMemcpyAsync"),
)  # fmt: skip
#: The runtime's launch functions (noted, not counted: the driver call they make counts).
RUNTIME_LAUNCH_FUNCTIONS = frozenset(name for spec in NAME_SPECS if spec.name.startswith("gpu.launches") for name in spec.symbols)

_runtime = tuple(f for f in CUDA_FUNCTIONS if f.startswith("cuda"))
_driver = tuple(f for f in CUDA_FUNCTIONS if not f.startswith("cuda"))
_TIMELINE = CALL_OUTERMOST_ONLY | CALL_TAKES_LAUNCHES | CALL_CLOCKED
_collectives = tuple(NCCL_COLLECTIVES)

#: (spec name, library regex, hint, functions, flags, label)
CALL_PROBES = (
    ("gpu.cudart", CUDART, b"cudaMemcpyAsync", tuple(f for f in _runtime if f not in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.cudart.alloc", CUDART, b"cudaMemcpyAsync", tuple(f for f in _runtime if f in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE | CALL_READS_OUT0, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.cuda", CUDA_DRIVER, b"cuMemcpyHtoDAsync", tuple(f for f in _driver if f not in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.cuda.alloc", CUDA_DRIVER, b"cuMemcpyHtoDAsync", tuple(f for f in _driver if f in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE | CALL_READS_OUT0, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.nccl", NCCL, b"ncclAllReduce", _collectives, _TIMELINE | CALL_RANK_CLOCK, sc.OTELBPF_SCOPE_NCCL),
    ("gpu.nccl.comm", NCCL, b"ncclAllReduce", tuple(f for f in NCCL_FUNCTIONS if f not in NCCL_OUT_POINTER_FUNCTIONS + _collectives), _TIMELINE, sc.OTELBPF_SCOPE_NCCL),
    ("gpu.nccl.init", NCCL, b"ncclAllReduce", NCCL_OUT_POINTER_FUNCTIONS, _TIMELINE | CALL_READS_OUT0 | nccl_id_flag(), sc.OTELBPF_SCOPE_NCCL),
)


#: What NAME_SPECS probe, to say so apart from the timeline calls in the log.
_NAMING = frozenset(name for spec in NAME_SPECS for name in spec.symbols)

#: Exited processes whose final launch totals wait for the next metrics read, at most.
MAX_EXITED_TOTALS = 4096


@dataclass
class GpuProbes:
    """Registers the GPU probe specs with an ``EbpfSource`` and says, per
    process and file, what was found and probed (start-up log, doctor)."""

    source: object
    #: --gpu-launch-time: entry + return probes on the launch functions
    timed_launches: bool = False
    #: pid -> mapped file -> probed functions (launch counters included)
    probed: dict[int, dict[str, set[str]]] = field(default_factory=dict)
    #: pid -> the version of the NCCL library probed in it (None: no version string found)
    nccl_versions: dict[int, tuple[int, int, int] | None] = field(default_factory=dict)
    #: final launch totals of processes that exited, until the next read: pid -> (launches, ns)
    _exited_totals: dict[int, tuple[int, int]] = field(default_factory=dict, init=False, repr=False)
    #: the metrics thread reads the totals while the agent's thread forgets exited processes
    _totals_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    #: GPU profiles: the calls of STACK_FUNCTIONS take a stack (None: as the source's profile
    #: configuration says: on when profiles are on and --no-gpu-profiles is not given)
    stacks: bool | None = None
    #: GPU profiles' launch samples: the probes that name their kernels (NAME_SPECS; None: on
    #: with stacks when --gpu-launch-sample-every is not 0)
    kernel_names: bool | None = None

    def __post_init__(self) -> None:
        profiles = getattr(getattr(self.source, "config", None), "profiles", None)
        if self.stacks is None:
            self.stacks = bool(profiles is not None and profiles.enabled and getattr(profiles, "gpu", False))
        if self.kernel_names is None:
            self.kernel_names = bool(self.stacks and getattr(profiles, "gpu_launch_every", 0) > 0)
        for name, library, hint, functions, flags, label in CALL_PROBES:
            stacked = tuple(f for f in functions if f in STACK_FUNCTIONS) if self.stacks else ()
            plain = tuple(f for f in functions if f not in stacked)
            if plain:
                self.source.add_call_probe(name, library, plain, returns=True, label=label, flags=flags, hint=hint,
                                           function_flags=FUNCTION_FLAGS)  # fmt: skip
            if stacked:
                self.source.add_call_probe(
                    f"{name}.stack", library, stacked, returns=True, label=label, flags=flags | CALL_STACK, hint=hint,
                    function_flags=FUNCTION_FLAGS,
                )
        for spec in TIMED_LAUNCH_SPECS if self.timed_launches else LAUNCH_SPECS:
            self.source.add_probe(spec)
        if self.kernel_names:
            for spec in NAME_SPECS:
                self.source.add_probe(spec)

    def report(self, pid: int, attached: list[Attachment]) -> None:
        """Log, once per process and file, the GPU functions just probed there. A process
        mapping NCCL has its library's version read (which commHash it computes) and starts
        the rank clocks (bpf/ranks.c)."""
        new: dict[str, set[str]] = {}
        for attachment in attached:
            if not attachment.spec.name.startswith("gpu."):
                continue
            if attachment.spec.name.startswith("gpu.nccl") and pid not in self.nccl_versions:
                self._found_nccl(pid, attachment.mapped)
            names = {n.split("@", 1)[0] for n in attachment.symbol.names}
            new.setdefault(attachment.mapped, set()).update(names)
        files = self.probed.setdefault(pid, {})
        for mapped, names in sorted(new.items()):
            first = mapped not in files
            files.setdefault(mapped, set()).update(names)
            launches = sorted(names & set(LAUNCH_FUNCTIONS))
            naming = sorted(names & _NAMING)
            calls = sorted(names - set(LAUNCH_FUNCTIONS) - _NAMING)
            log.info(
                "GPU: pid %d: %s %s (%s%s%s)", pid, "probing" if first else "more probes in", mapped,
                f"{len(calls)} timeline calls" if calls else "no timeline calls",
                f", launches counted at {', '.join(launches)}" if launches else "",
                f", kernel names from {', '.join(naming)}" if naming else "",
            )

    def _found_nccl(self, pid: int, mapped: str) -> None:
        version = nccl_library_version(f"/proc/{pid}/root{mapped}")
        if len(self.nccl_versions) < MAX_EXITED_TOTALS * 4:
            self.nccl_versions[pid] = version
        start_clocks = getattr(self.source, "start_rank_clocks", None)
        if start_clocks is not None:
            start_clocks()
        log.info("GPU: pid %d: NCCL %s", pid, ".".join(map(str, version)) if version else "of unknown version")

    def nccl_version(self, pid: int) -> tuple[int, int, int] | None:
        """The version of the NCCL library probed in ``pid`` (None: none, or no version string)."""
        return self.nccl_versions.get(pid)

    def forget(self, pid: int) -> None:
        """The process exited: keep its final launch totals for the next read, free its BPF entries."""
        self.probed.pop(pid, None)
        if self.nccl_versions.pop(pid, "none") != "none":
            self._forget_communicators(pid)
        table = self._totals_table()
        if table is None:
            return
        with self._totals_lock:
            key = table.Key(pid)
            try:
                leaf = table[key]
            except KeyError:
                return
            if len(self._exited_totals) < MAX_EXITED_TOTALS:
                self._exited_totals[pid] = (int(leaf.count), int(leaf.time_ns))
            try:
                del table[key]
            except KeyError:
                pass

    def _forget_communicators(self, pid: int) -> None:
        """Delete the exited process's collective counters (bpf/calls.c comm_seqs: not an LRU)."""
        bpf = getattr(self.source, "_bpf", None)
        if bpf is None:
            return
        table = bpf["comm_seqs"]
        for key in [key for key in table.keys() if key.tgid == pid]:
            try:
                del table[key]
            except KeyError:
                pass

    def launch_totals(self) -> dict[int, tuple[int, int]]:
        """pid -> (kernel launches, ns inside launch calls) since the agent started, read from the
        BPF per-process totals (bpf/gpu.c): the live processes', and once more the final ones of
        processes that exited since the previous read. Never one event per launch."""
        table = self._totals_table()
        with self._totals_lock:
            out, self._exited_totals = self._exited_totals, {}
            if table is not None:
                for key, leaf in table.items():
                    out[int(key.value)] = (int(leaf.count), int(leaf.time_ns))
        return out

    def _totals_table(self):
        bpf = getattr(self.source, "_bpf", None)
        return bpf["gpu_launch_totals"] if bpf is not None else None

    def describe(self) -> list[str]:
        """One line per process and file probed (doctor, health)."""
        return [
            f"pid {pid}: {os.path.basename(mapped)} ({len(names)} functions)"
            for pid, files in sorted(self.probed.items())
            for mapped, names in sorted(files.items())
        ]


#: NCCL's version banner, kept whole in .rodata so that `strings` finds it (src/init.cc VERSION_STRING).
_NCCL_VERSION = re.compile(rb"NCCL version (\d+)\.(\d+)\.(\d+)")
#: (device, inode, mtime) -> version found in that file
_versions: dict[tuple[int, int, int], tuple[int, int, int] | None] = {}


def nccl_library_version(path: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) from an NCCL library's version banner in its read-only data
    (None: unreadable, or no banner). Read once per file (device, inode, mtime)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    if key in _versions:
        return _versions[key]
    found = None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for name in (".rodata", ".rodata.str1.1", ".rodata.str1.8"):
                section = elf.get_section_by_name(name)
                match = _NCCL_VERSION.search(section.data()) if section is not None else None
                if match:
                    found = (int(match[1]), int(match[2]), int(match[3]))
                    break
    except (OSError, ELFError, ValueError):
        found = None
    if len(_versions) > 256:
        _versions.clear()
    _versions[key] = found
    return found


def launch_sums(source) -> dict[int, list[tuple[str, str, str, int | float]]]:
    """pid -> its launch Sums for the metrics exporter (``MetricsExporter.add_process_sums``):
    ``otelbpf.gpu.kernel.launches``, and with --gpu-launch-time ``otelbpf.gpu.kernel.launch.time``
    (s). ``source``: the EbpfSource (its probes exist once it started)."""
    probes = getattr(source, "gpu", None)
    if probes is None:
        return {}
    out = {}
    for pid, (launches, spent_ns) in probes.launch_totals().items():
        sums: list[tuple[str, str, str, int | float]] = [
            (sc.OTELBPF_GPU_KERNEL_LAUNCHES_METRIC, "GPU kernel launches made by the process (driver launch calls"
             " since the agent started; a CUDA-graph replay counts once)", "{launch}", launches),
        ]  # fmt: skip
        if probes.timed_launches:
            sums.append((sc.OTELBPF_GPU_KERNEL_LAUNCH_TIME_METRIC, "Time the process spent inside kernel launch"
                         " calls (--gpu-launch-time)", "s", spent_ns / 1e9))  # fmt: skip
        out[pid] = sums
    return out


def survey(pids) -> dict[int, dict[str, list[str]]]:
    """What `run` would probe in each of ``pids`` now: pid -> mapped file ->
    GPU functions it exports (no BPF needed: the doctor). Processes mapping none are left out."""
    specs = [ProbeSpec(name, library, functions, hint=hint) for name, library, hint, functions, _f, _l in CALL_PROBES]
    specs.extend(LAUNCH_SPECS)
    found: dict[int, dict[str, list[str]]] = {}
    for pid in pids:
        for mapped in dict.fromkeys(m.path for m in executable_mappings(pid)):
            path = f"/proc/{pid}/root{mapped}"
            names: list[str] = []
            for spec in specs:
                if spec.matches(mapped, path):
                    names += [n.split("@", 1)[0] for symbol in resolve_symbols(path, spec.symbols) for n in symbol.names]
            if names:
                found.setdefault(pid, {})[mapped] = sorted(set(names))
    return found
