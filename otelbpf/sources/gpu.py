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
  every Triton kernel), counted per thread in the kernel;
* timeline calls: entry + return probes (``call_enter``/``call_return``) on
  copies, synchronisations, allocations, pinning and NCCL calls, reported
  only when no other probed call is in progress on the thread
  (CALL_OUTERMOST_ONLY: ``cudaMemcpy`` and the ``cuMemcpyHtoD_v2`` it makes
  are one operation), carrying the thread's launch count;
* never ``cudaGetDevice``/``cuCtxGetDevice`` (called ~13 times per launch).
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass, field

from otelbpf import semconv as sc
from otelbpf.semantics.gpu import CUDA_FUNCTIONS, CUDA_OUT_POINTER_FUNCTIONS, NCCL_FUNCTIONS, NCCL_OUT_POINTER_FUNCTIONS
from otelbpf.sources.uprobes import Attachment, ProbeSpec

log = logging.getLogger("otelbpf.gpu")

#: bpf/calls.c per-site flags
CALL_OUTERMOST_ONLY = 2
CALL_TAKES_LAUNCHES = 4
CALL_READS_OUT0 = 8
CALL_READS_STACK_ARG = 16
#: ncclCommInitRank's ncclUniqueId is read from the stack on x86-64 (on arm64 it goes by reference).
_STACK_ID = CALL_READS_STACK_ARG if platform.machine() == "x86_64" else 0

CUDART = r"/libcudart[^/]*\.so"
CUDA_DRIVER = r"/libcuda\.so"
NCCL = r"/libnccl[^/]*\.so"

#: The driver's launch entry points (``_ptsz``: the per-thread default stream variants).
LAUNCH_FUNCTIONS = (
    "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
)
LAUNCH_SPEC = ProbeSpec("gpu.launches", CUDA_DRIVER, LAUNCH_FUNCTIONS, entry="gpu_launch_enter", hint=b"cuLaunchKernel")

_runtime = tuple(f for f in CUDA_FUNCTIONS if f.startswith("cuda"))
_driver = tuple(f for f in CUDA_FUNCTIONS if not f.startswith("cuda"))
_TIMELINE = CALL_OUTERMOST_ONLY | CALL_TAKES_LAUNCHES

#: (spec name, library regex, hint, functions, flags, label)
CALL_PROBES = (
    ("gpu.cudart", CUDART, b"cudaMemcpyAsync", tuple(f for f in _runtime if f not in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.cudart.alloc", CUDART, b"cudaMemcpyAsync", tuple(f for f in _runtime if f in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE | CALL_READS_OUT0, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.cuda", CUDA_DRIVER, b"cuMemcpyHtoDAsync", tuple(f for f in _driver if f not in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.cuda.alloc", CUDA_DRIVER, b"cuMemcpyHtoDAsync", tuple(f for f in _driver if f in CUDA_OUT_POINTER_FUNCTIONS), _TIMELINE | CALL_READS_OUT0, sc.OTELBPF_SCOPE_CUDA),
    ("gpu.nccl", NCCL, b"ncclAllReduce", tuple(f for f in NCCL_FUNCTIONS if f not in NCCL_OUT_POINTER_FUNCTIONS), _TIMELINE, sc.OTELBPF_SCOPE_NCCL),
    ("gpu.nccl.init", NCCL, b"ncclAllReduce", NCCL_OUT_POINTER_FUNCTIONS, _TIMELINE | CALL_READS_OUT0 | _STACK_ID, sc.OTELBPF_SCOPE_NCCL),
)


@dataclass
class GpuProbes:
    """Registers the GPU probe specs with an ``EbpfSource`` and says, per
    process and file, what was found and probed (start-up log, doctor)."""

    source: object
    #: pid -> mapped file -> probed functions (launch counters included)
    probed: dict[int, dict[str, set[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, library, hint, functions, flags, label in CALL_PROBES:
            self.source.add_call_probe(name, library, functions, returns=True, label=label, flags=flags, hint=hint)
        self.source.add_probe(LAUNCH_SPEC)

    def report(self, pid: int, attached: list[Attachment]) -> None:
        """Log, once per process and file, the GPU functions just probed there."""
        new: dict[str, set[str]] = {}
        for attachment in attached:
            if not attachment.spec.name.startswith("gpu."):
                continue
            names = {n.split("@", 1)[0] for n in attachment.symbol.names}
            new.setdefault(attachment.mapped, set()).update(names)
        files = self.probed.setdefault(pid, {})
        for mapped, names in sorted(new.items()):
            first = mapped not in files
            files.setdefault(mapped, set()).update(names)
            launches = sorted(names & set(LAUNCH_FUNCTIONS))
            calls = sorted(names - set(LAUNCH_FUNCTIONS))
            log.info(
                "GPU: pid %d: %s %s (%s%s)", pid, "probing" if first else "more probes in", mapped,
                f"{len(calls)} timeline calls" if calls else "no timeline calls",
                f", launches counted at {', '.join(launches)}" if launches else "",
            )

    def forget(self, pid: int) -> None:
        self.probed.pop(pid, None)

    def describe(self) -> list[str]:
        """One line per process and file probed (doctor, health)."""
        return [
            f"pid {pid}: {os.path.basename(mapped)} ({len(names)} functions)"
            for pid, files in sorted(self.probed.items())
            for mapped, names in sorted(files.items())
        ]


def survey(pids) -> dict[int, dict[str, list[str]]]:
    """What `run` would probe in each of ``pids`` now: pid -> mapped file ->
    GPU functions it exports (no BPF needed: the doctor). Processes mapping none are left out."""
    from otelbpf.sources.uprobes import executable_mappings, resolve_symbols

    specs = [ProbeSpec(name, library, functions, hint=hint) for name, library, hint, functions, _f, _l in CALL_PROBES]
    specs.append(LAUNCH_SPEC)
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
