"""Profile kinds: one table entry per kind of stack sample the kernel takes.

A kind is what a sample's ``kind`` field says (``enum profile_kind`` in bpf/capture.h):
the CPU clock fired, a thread blocked, a GPU call was entered, a kernel launch was
sampled. Everything the agent does that depends on the kind is said by its
:class:`ProfileKind` in :data:`PROFILE_KINDS`:

- how it is compiled in and started: its ``-D`` flags for the one BPF compile
  (``cflags``) and what the sampler attaches once the program is loaded (``attach``;
  None where BCC attaches it at load, as a ``TRACEPOINT_PROBE``, or where the GPU
  call probes of otelbpf/sources/gpu.py take it);
- its records: the ``kind`` value it shares with the C enum (``record_kind``, named
  ``c_name`` there; tests/test_ebpf_record_abi.py checks every entry against bpf/capture.h
  and every enum member against the table), and the other events it sends
  (``events``: off-CPU's :class:`~otelbpf.profiles.records.OffCpuEnd`);
- what it produces: its profile types, each a sample type and unit (``types``);
- its ``otelbpf run`` switches (``settings``): each a ``ProfileConfig`` field with its
  default, switch and help text. ``ProfileConfig``'s fields (otelbpf/profiles/sampler.py)
  and the command line's profile options (otelbpf/cli/main.py) are built from them;
- how the profiler handles its samples (``handler``): the dispatch on ``event.kind``
  in :meth:`otelbpf.profiles.profiler.Profiler.on_sample`.

Adding a kind is its BPF code and one entry here, plus a handler where none of the
existing ones fits (DEVELOPERS.md, "Adding a profile kind").
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from otelbpf.durations import parse_duration_ns
from otelbpf.profiles.model import ProfileType
from otelbpf.profiles.records import (
    PROFILE_GPU_CALL,
    PROFILE_GPU_LAUNCH,
    PROFILE_OFF_CPU,
    PROFILE_ON_CPU,
    GpuKernelName,
    OffCpuEnd,
    StackSampleEvent,
)
from otelbpf.profiles.types import (
    CPU,
    GPU_ALLOC,
    GPU_COPY,
    GPU_INUSE,
    GPU_LAUNCH,
    GPU_PINNED,
    GPU_PINNED_ALLOC,
    GPU_WAIT,
    OFF_CPU,
)

#: On-CPU samples per second per thread unless told (--profile-hz), and the most allowed.
DEFAULT_HZ = 19
MAX_HZ = 1000
#: With off-CPU samples on, the ring is not left unread longer than this (ProfileSampler.unread_limit_s):
#: they come at every block of a traced thread, not at a rate.
OFF_CPU_UNREAD_LIMIT_S = 0.1

#: A handler factory: given the profiler (otelbpf/profiles/profiler.py, which imports this table),
#: the callable that takes each sample of a kind.
HandlerFactory = Callable[[object], Callable[[StackSampleEvent], None]]


class ProfileError(RuntimeError):
    """A kind's program cannot be attached here (the sampler cannot run); the message says
    why and what to do."""


@dataclass(frozen=True)
class Setting:
    """One ``ProfileConfig`` field a kind owns, and the ``otelbpf run`` switch that sets it."""

    #: the ProfileConfig field
    field: str
    #: the field's default, and the switch's where it takes a value
    default: object
    #: the switch: a flag without a value (``store_true``) when ``parse`` is None
    switch: str
    #: the switch's help text, with its default spelled as a user writes it
    help: str
    #: the switch's value from its text (argparse's ``type``: raises ArgumentTypeError or ValueError)
    parse: Callable[[str], object] | None = None
    metavar: str | None = None
    #: the field's value from the parsed command line; None: the switch's own value
    from_args: Callable[[argparse.Namespace], object] | None = None
    #: what is wrong with a value, said as the user's switch (ProfileConfig.validate), or None
    check: Callable[[object], str | None] | None = None

    @property
    def dest(self) -> str:
        """The switch's attribute on argparse's namespace."""
        return self.switch.lstrip("-").replace("-", "_")

    def add_to(self, group) -> None:
        """This switch, on an argparse parser or argument group."""
        if self.parse is None:
            group.add_argument(self.switch, action="store_true", help=self.help)
        else:
            group.add_argument(self.switch, type=self.parse, default=self.default, metavar=self.metavar, help=self.help)

    def value_from(self, args) -> object:
        """The field's value from argparse's namespace (a namespace without the switch: the
        switch's default)."""
        if self.from_args is not None:
            return self.from_args(args)
        return getattr(args, self.dest, False if self.parse is None else self.default)


def _always(_config) -> bool:
    return True


def _no_flags(_config) -> list[str]:
    return []


@dataclass(frozen=True)
class ProfileKind:
    """One kind of stack sample, from the BPF program that takes it to the profiles it makes."""

    #: short name (logs, docs, tests)
    name: str
    #: the value of the record's ``kind`` field: ``enum profile_kind`` in bpf/capture.h
    record_kind: int
    #: that enum member's name in C
    c_name: str
    #: the profile types its samples make (OTLP/pprof sample type and unit)
    types: tuple[ProfileType, ...]
    #: the profiler's handler of its samples (Profiler.on_sample dispatches on record_kind)
    handler: HandlerFactory
    #: its ProfileConfig fields and their ``otelbpf run`` switches
    settings: tuple[Setting, ...] = ()
    #: whether a configuration asks for it (profiles on, which is ``hz`` > 0, is a given)
    enabled: Callable[[object], bool] = _always
    #: the -D flags that compile it into bpf/profile.c (and the probe files that take it)
    cflags: Callable[[object], list[str]] = _no_flags
    #: attach its program to the loaded BPF object: (bpf, config); None: nothing to attach
    attach: Callable[[object, object], None] | None = None
    #: other events its programs send, each (event class, handler factory)
    events: tuple[tuple[type, Callable[[object], Callable]], ...] = ()
    #: while it is on, the ring is not left unread longer than this (None: no limit of its own)
    unread_limit_s: float | None = None


# -- how samples are weighed (values read from the record) ---------------------------------


def one_sample(_event: StackSampleEvent) -> tuple[int]:
    """On-CPU: each sample is one, its period (the sampling interval) is the profile's."""
    return (1,)


def launches(event: StackSampleEvent) -> tuple[int]:
    """A sampled kernel launch stands for the header's ``total_len`` launches (1 when unset)."""
    return (max(event.weight, 1),)


# -- switches' values and checks -----------------------------------------------------------


def _sampling_rate(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    if value > MAX_HZ:
        raise argparse.ArgumentTypeError(f"at most {MAX_HZ} samples per second, got {value}")
    return value


def _duration_ns(text: str) -> int:
    try:
        return parse_duration_ns(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_hz(hz) -> str | None:
    return None if 0 <= hz <= MAX_HZ else f"--profile-hz must be between 1 and {MAX_HZ}, got {hz}"


def _check_off_cpu_min(ns) -> str | None:
    return None if ns >= 0 else "--off-cpu-min must not be negative"


def _check_launch_every(every) -> str | None:
    return None if 0 <= every < 1 << 31 else f"--gpu-launch-sample-every must be >= 0, got {every}"


# -- what the sampler attaches -------------------------------------------------------------


def _attach_cpu_clock(bpf, config) -> None:
    """``profile_on_cpu`` on the software CPU-clock perf event of every CPU, at ``hz``: the
    hardware PMU is absent on most VMs and containers, the CPU clock is there everywhere."""
    from bcc import PerfSWConfig, PerfType

    try:
        bpf.attach_perf_event(
            ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK, fn_name="profile_on_cpu", sample_freq=config.hz, cpu=-1
        )
    except Exception as exc:  # BCC raises plain Exception
        raise ProfileError(
            f"cannot attach the CPU-clock perf event for profiles ({exc}): the kernel needs "
            "CONFIG_PERF_EVENTS and, outside root, CAP_PERFMON; run `otelbpf doctor`, or --no-profiles"
        ) from exc


# -- the table -----------------------------------------------------------------------------

ON_CPU_KIND = ProfileKind(
    name="cpu",
    record_kind=PROFILE_ON_CPU,
    c_name="PROFILE_ON_CPU",
    types=(CPU,),  # its period is the interval at the configured hz (Profiler.cpu)
    settings=(
        Setting(
            "hz", DEFAULT_HZ, "--profile-hz", parse=_sampling_rate, metavar="HZ", check=_check_hz,
            help=f"on-CPU stack samples per second per thread, 1..{MAX_HZ} (default {DEFAULT_HZ})",
            from_args=lambda args: 0 if getattr(args, "no_profiles", False) else args.profile_hz,
        ),
    ),  # fmt: skip
    attach=_attach_cpu_clock,  # profile_on_cpu is compiled in with PROFILES itself
    handler=lambda profiler: profiler.linked(profiler.cpu, one_sample),
)

OFF_CPU_KIND = ProfileKind(
    name="off_cpu",
    record_kind=PROFILE_OFF_CPU,
    c_name="PROFILE_OFF_CPU",
    types=(OFF_CPU,),
    settings=(
        Setting(
            "off_cpu", False, "--off-cpu",
            help="also profile time blocked (sched_switch: a stack copy each time a traced thread blocks)",
            from_args=lambda args: args.off_cpu and not getattr(args, "no_profiles", False),
        ),
        Setting(
            "off_cpu_min_ns", 1_000_000, "--off-cpu-min", parse=_duration_ns, metavar="DURATION", check=_check_off_cpu_min,
            help="with --off-cpu, blocks shorter than this are not reported (default 1ms)",
        ),
    ),  # fmt: skip
    enabled=lambda config: config.off_cpu,
    # sched_switch is a TRACEPOINT_PROBE, attached by BCC at load: it is compiled in only when asked,
    # as it runs at every context switch of the host
    cflags=lambda config: [f"-DOFF_CPU_SAMPLES={int(config.off_cpu)}", f"-DOFF_CPU_MIN_NS={config.off_cpu_min_ns}"],
    handler=lambda profiler: profiler.on_blocked,
    events=((OffCpuEnd, lambda profiler: profiler.on_offcpu_end),),
    unread_limit_s=OFF_CPU_UNREAD_LIMIT_S,
)

GPU_CALL_KIND = ProfileKind(
    name="gpu_call",
    record_kind=PROFILE_GPU_CALL,
    c_name="PROFILE_GPU_CALL",
    types=(GPU_ALLOC, GPU_INUSE, GPU_PINNED_ALLOC, GPU_PINNED, GPU_COPY, GPU_WAIT),
    settings=(
        Setting(
            "gpu", True, "--no-gpu-profiles",
            help="no GPU profiles: the GPU call probes take no stack (on by default with profiles: device memory "
            "allocated and in use, pinned memory, copies, waits and sampled launches by stack; docs/gpu.md)",
            from_args=lambda args: not (getattr(args, "no_gpu_profiles", False) or getattr(args, "no_gpu", False)),
        ),
    ),  # fmt: skip
    enabled=lambda config: config.gpu,
    # taken at the GPU call probes otelbpf/sources/gpu.py flags CALL_STACK when config.gpu is set
    cflags=lambda config: [f"-DGPU_PROFILES={int(config.gpu)}"],
    handler=lambda profiler: profiler.gpu.on_sample,
)

GPU_LAUNCH_KIND = ProfileKind(
    name="gpu_launch",
    record_kind=PROFILE_GPU_LAUNCH,
    c_name="PROFILE_GPU_LAUNCH",
    types=(GPU_LAUNCH,),
    settings=(
        Setting(
            "gpu_launch_every", 128, "--gpu-launch-sample-every", parse=int, metavar="N", check=_check_launch_every,
            help="GPU profiles: take a stack at 1 kernel launch in N per thread, weighted N (0: none; default 128)",
        ),
    ),  # fmt: skip
    enabled=lambda config: config.gpu and config.gpu_launch_every > 0,
    # taken in bpf/gpu.c's launch counter, compiled in with GPU_PROFILES; its kernel on top, named
    # from the names bpf/gpu_names.c sends (otelbpf/profiles/gpu_kernels.py)
    cflags=lambda config: [f"-DGPU_LAUNCH_EVERY={config.gpu_launch_every}"],
    handler=lambda profiler: profiler.linked(GPU_LAUNCH, launches, profiler.kernels.leaf),
    events=((GpuKernelName, lambda profiler: profiler.kernels.on_name),),
)

#: Every kind the agent knows, in the order of its switches in ``otelbpf run --help``.
PROFILE_KINDS: tuple[ProfileKind, ...] = (ON_CPU_KIND, OFF_CPU_KIND, GPU_CALL_KIND, GPU_LAUNCH_KIND)


def add_switches(group, kinds: tuple[ProfileKind, ...] = PROFILE_KINDS) -> None:
    """Every kind's switches, in table order, on an argparse parser or argument group."""
    for kind in kinds:
        for setting in kind.settings:
            setting.add_to(group)
