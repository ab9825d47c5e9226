"""The profile types otelbpf produces, spelled as the backends expect them.

A backend recognises a profile by its sample type and period type, not by a
name, so these follow the OpenTelemetry eBPF profiler (whose output Grafana
Pyroscope and the Collector already understand):

* on-CPU: sample type ``samples``/``count``, period type ``cpu``/``nanoseconds``
  with the sampling interval as period. Pyroscope shows exactly this as
  process CPU (``process_cpu:cpu:nanoseconds:cpu:nanoseconds``);
* off-CPU: sample type ``off_cpu``/``nanoseconds``, not periodic: each
  sample's value is the time the thread was blocked (the eBPF profiler's
  ``ProfileTypeOffCPU``, ``ReportValues: true``).

The GPU types are pprof's memory-profile names (``alloc_*``, ``inuse_*``)
plus copies, waits and launches, so ``go tool pprof -sample_index`` and
Pyroscope's memory views read them without a mapping table. OTLP v1.10 has
one sample type per Profile, so the encoder writes one Profile per sample
type of a multi-value type; pprof keeps them in one file.

Which kind of sample makes which of them is said by the table of profile kinds
(otelbpf/profiles/kinds.py, each entry's ``types``).
"""

from __future__ import annotations

from otelbpf.profiles.model import ProfileType

#: The sampling frequency the on-CPU sampler uses unless told otherwise (a prime, off the timer ticks).
DEFAULT_CPU_HZ = 49


def cpu_type(frequency_hz: int = DEFAULT_CPU_HZ) -> ProfileType:
    """The on-CPU type for a sampler at ``frequency_hz``: the period is the sampling interval in ns."""
    if frequency_hz <= 0:
        raise ValueError(f"sampling frequency must be positive, got {frequency_hz!r}")
    return ProfileType("cpu", (("samples", "count"),), ("cpu", "nanoseconds"), round(1e9 / frequency_hz))


CPU = cpu_type()
OFF_CPU = ProfileType("offcpu", (("off_cpu", "nanoseconds"),))

# --- GPU host side (otelbpf/profiles/gpu.py, docs/gpu.md "GPU profiles") ---------------------------
#: Device memory allocated in the interval, by allocating stack: objects and bytes (pprof's heap
#: order). One object is one CUDA allocation call: with PyTorch's caching allocator a *segment*
#: holding many tensors, not a tensor (sample attribute otelbpf.gpu.memory.granularity).
GPU_ALLOC = ProfileType("gpu_alloc", (("alloc_objects", "count"), ("alloc_space", "bytes")))
#: Device memory still allocated (not freed) at the end of the interval, by the stack that allocated it.
GPU_INUSE = ProfileType("gpu_inuse", (("inuse_objects", "count"), ("inuse_space", "bytes")))
#: Pinned (page-locked) host memory pinned in the interval (cudaHostAlloc, cuMemHostAlloc, cudaHostRegister...).
GPU_PINNED_ALLOC = ProfileType("gpu_pinned_alloc", (("pinned_alloc_objects", "count"), ("pinned_alloc_space", "bytes")))
#: Pinned host memory still pinned at the end of the interval, by the stack that pinned it.
GPU_PINNED = ProfileType("gpu_pinned", (("pinned_objects", "count"), ("pinned_space", "bytes")))
#: Host<->device copies, by bytes moved (direction and pageable as sample attributes).
GPU_COPY = ProfileType("gpu_copy", (("copy", "bytes"),))
#: Time the host thread spent inside synchronising calls (synchronize, blocking copies, collectives).
GPU_WAIT = ProfileType("gpu_wait", (("gpu_wait", "nanoseconds"),))
#: Kernel launches: 1 launch in N per thread takes a stack, weighted N.
GPU_LAUNCH = ProfileType("gpu_launch", (("launches", "count"),))
