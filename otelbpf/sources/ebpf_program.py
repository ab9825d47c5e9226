"""Which eBPF program to build, and with which options.

Everything decided before BCC compiles bpf/capture.c, kept apart from the
running source (otelbpf.sources.ebpf) so it can be read, tested and checked
by `otelbpf doctor` without loading anything:

* :class:`CaptureConfig`: what to trace and capture, as the command line
  gave it, and its validation;
* :func:`program_text`: capture.c with the probe-family files it includes
  pasted in; :func:`compile_flags`: the -D options from the configuration;
* :func:`plan_sock_capture`: whether socket payloads are captured at raw
  tracepoints (struct sock offsets from the kernel's BTF) or classic ones
  (:class:`SockCapture`);
* :func:`plan_rank_clocks`: whether the threads that issue NCCL collectives
  get off-CPU clocks (bpf/ranks.c: task_struct's pid offset from BTF), as
  :class:`RankClocks`;
* the environment's say: OTELBPF_SOCK_TRACEPOINTS, OTELBPF_REGS_READ
  (:func:`regs_read_choice`), OTELBPF_WHOLE_CAPTURE
  (:func:`whole_capture_wanted`), OTELBPF_LOADER_WATCH (:func:`loader_watch_wanted`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from otelbpf import bundled
from otelbpf.sources import btf

#: bpf/*.c: the checkout's, the installed wheel's, or OTELBPF_BPF_DIR (otelbpf/bundled.py).
BPF_DIR = bundled.BPF.locate()

MIN_CAPTURE_BYTES = 64
#: Records are built in per-CPU scratch space twice the capture size (the
#: verifier's bound for gathered iovecs), and a per-CPU map value is at most
#: 32 KiB: 8 KiB of payload per syscall is the most that fits.
MAX_CAPTURE_BYTES = 8192
#: bpf/common.h's TRACE_MODE: the processes listed in the filter map, or all but the agent.
MODE_LISTED = 0
MODE_ALL = 1


class CaptureError(RuntimeError):
    """The probes could not be compiled or attached; the message says why."""


class SampledProbes(Protocol):
    """Probes compiled into the capture program that fill a ring of their own: the
    profiles' stack sampler (``otelbpf.profiles.sampler.ProfileConfig``). The source
    compiles them in with their flags, starts them once the program is loaded, and
    drains their ring beside its own; the layer that reads the samples supplies them,
    so sources import nothing of it."""

    @property
    def enabled(self) -> bool: ...

    def validate(self) -> None: ...

    def describe_unsupported(self) -> str | None: ...

    def cflags(self) -> list[str]: ...

    def start(self, bpf, clock_offset_ns: int):
        """Attach to the loaded program; the running sampler (``watch``, ``forget``,
        ``rescan``, ``drain``, ``ring_fd``, ``unread_limit_s``, ``close``)."""
        ...


@dataclass
class CaptureConfig:
    """What to trace and capture, as the command line gives it; :meth:`validate` says what is wrong."""

    pids: list[int] = field(default_factory=list)
    comms: list[str] = field(default_factory=list)
    trace_all: bool = False
    capture_bytes: int = 4096
    ring_buffer_mb: int = 16
    capture_unix: bool = True
    #: Probe CPython's asyncio task steps in traced Python processes.
    python_tasks: bool = True
    #: Capture UDP datagrams (DDS/RTPS). Off by default: it needs per-syscall
    #: tracepoints (recv* exits, *mmsg enters), and enabling any syscalls:*
    #: tracepoint puts every syscall on the host on the kernel's slower path.
    capture_udp: bool = False
    #: Capture TLS plaintext with uprobes on OpenSSL (bpf/tls.c, otelbpf/sources/tls.py).
    capture_tls: bool = True
    #: Capture the big reads and writes of connections whose bodies are read (LLM
    #: calls) whole, up to 256 KiB a call (bpf/capture.h); off: the prefix only.
    #: OTELBPF_WHOLE_CAPTURE=off turns it off too (bench/llm_bursts.py compares).
    whole_capture: bool = True
    #: Probe CUDA runtime/driver and NCCL calls (bpf/gpu.c, otelbpf/sources/gpu.py).
    capture_gpu: bool = True
    #: Also time the GPU kernel launch calls (entry + return probes, ~4.5 us a launch; docs/gpu.md).
    gpu_launch_time: bool = False
    #: How often read() re-scans watched processes' maps for newly loaded libraries (0: never).
    rescan_interval_s: float = 5.0
    #: Probe the dynamic loader's debugger hook in traced processes (bpf/loader.c), so a GPU or
    #: TLS library loaded later is probed within milliseconds of its load, not at the re-scan.
    watch_loader: bool = True
    #: Never traced, dropped by the kernel filter (otelbpf.host.exclusions): comm
    #: patterns (NAME or NAME*) and pids (with their children).
    exclude_comms: list[str] = field(default_factory=list)
    exclude_pids: list[int] = field(default_factory=list)
    #: Stack samples for profiles (bpf/profile.c: otelbpf.profiles.sampler.ProfileConfig);
    #: None, or hz 0: none taken.
    profiles: "SampledProbes | None" = None
    #: Cross-node trace context on the wire (otelbpf.sources.crossnode.MODES; bpf/propagate.c):
    #: `otelbpf run` asks for its default, "tcp"; off here, for whoever builds a config otherwise.
    propagation: str = "off"
    #: The cgroup (v2) whose sockets the propagation's sock_ops program sees; None: the root (the host).
    propagation_cgroup: str | None = None

    def validate(self) -> None:
        if not (self.pids or self.comms or self.trace_all):
            raise ValueError("nothing to trace: give --pid, --comm or --all")
        if not MIN_CAPTURE_BYTES <= self.capture_bytes <= MAX_CAPTURE_BYTES:
            raise ValueError(
                f"--capture-bytes must be between {MIN_CAPTURE_BYTES} and {MAX_CAPTURE_BYTES}, got {self.capture_bytes}"
            )
        if self.ring_buffer_mb < 1 or self.ring_buffer_mb & (self.ring_buffer_mb - 1):
            raise ValueError(f"--ring-buffer-mb must be a power of two >= 1, got {self.ring_buffer_mb}")
        for comm in self.comms:
            if not comm or len(comm.encode()) > 15:
                raise ValueError(f"--comm {comm!r}: a process name is 1 to 15 bytes (the kernel's comm)")
        for pid in self.pids:
            if pid <= 0:
                raise ValueError(f"--pid {pid}: not a process id")
        from otelbpf.sources.crossnode import MODES

        if self.propagation not in MODES:
            raise ValueError(f"--propagation {self.propagation!r}: expected one of {', '.join(MODES)}")
        if self.profiles is not None:
            self.profiles.validate()


def program_text(path: Path | None = None, _seen: set[Path] | None = None) -> str:
    """bpf/capture.c with the local files it includes pasted in.

    BCC generates TRACEPOINT_PROBE argument structs and rewrites map calls
    (``map.lookup()``) only in the main file it compiles, so common.h and the
    probe-family files are inlined (with #line markers, so compiler messages
    name the right file). capture.h, the record ABI (plain structs, also
    compiled by tests/test_ebpf_record_abi.py), stays an ordinary include.
    """
    path = path or BPF_DIR / "capture.c"
    seen = _seen if _seen is not None else set()
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith('#include "') and stripped != '#include "capture.h"':
            included = path.parent / stripped.split('"')[1]
            if included not in seen:
                seen.add(included)
                out.append(f'#line 1 "{included}"')
                out.append(program_text(included, seen))
                out.append(f'#line {number + 1} "{path}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def compile_flags(config: CaptureConfig) -> list[str]:
    """The -D options that size the program and switch its parts on or off, from
    ``config`` and this host (page size, pid_max, the agent's own pid). The
    syscall-register offsets (ebpf_layout.regs_cflags), the socket capture's
    (:meth:`SockCapture.cflags`) and the register reading method are added
    when loading (otelbpf.sources.ebpf)."""
    pages = config.ring_buffer_mb * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    return [
        f"-I{BPF_DIR}",
        f"-DCAPTURE_BYTES={config.capture_bytes}",
        f"-DRINGBUF_PAGES={pages}",
        f"-DCAPTURE_UNIX={int(config.capture_unix)}",
        f"-DPID_MAX={pid_max()}",
        f"-DHAVE_SK_DATA_READY={int(Path('/sys/kernel/tracing/events/sock/sk_data_ready').is_dir())}",
        f"-DCAPTURE_UDP={int(config.capture_udp)}",
        f"-DCAPTURE_TLS={int(config.capture_tls)}",
        f"-DTRACE_MODE={MODE_ALL if config.trace_all else MODE_LISTED}",
        f"-DAGENT_TGID={os.getpid()}",
        f"-DEXCLUDES={int(bool(config.exclude_comms or config.exclude_pids))}",
        "-Wno-macro-redefined",
    ] + (config.profiles.cflags() if config.profiles is not None else [])


def pid_max() -> int:
    """The host's highest pid + 1 (sizes the in-kernel traced-process array)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4194304


#: "classic" forces payload capture onto the classic sock:sock_*_length
#: tracepoints (a comparison, a fallback); "auto" (default): raw tracepoints
#: when the kernel's BTF gives struct sock's offsets.
SOCK_TRACEPOINTS_ENV = "OTELBPF_SOCK_TRACEPOINTS"
#: How the probes read the saved syscall registers: "load" (default), plain
#: loads from the BTF-typed pointer bpf_task_pt_regs returns (the verifier
#: checks each offset); "probe", a bpf_probe_read_kernel call per register,
#: for a kernel whose verifier refuses those loads (`otelbpf doctor` says).
REGS_READ_ENV = "OTELBPF_REGS_READ"


#: "off" (or 0, no, false): no whole capture of connections whose bodies are read
#: (CaptureConfig.whole_capture); a comparison for benchmarks, and a way out.
WHOLE_CAPTURE_ENV = "OTELBPF_WHOLE_CAPTURE"


def whole_capture_wanted(config: "CaptureConfig") -> bool:
    """CaptureConfig.whole_capture, unless OTELBPF_WHOLE_CAPTURE turns it off."""
    setting = os.environ.get(WHOLE_CAPTURE_ENV, "").strip().lower()
    return config.whole_capture and setting not in ("off", "0", "no", "false")


#: "off" (or 0, no, false): no probe on the dynamic loader (CaptureConfig.watch_loader): libraries
#: loaded later are found by the re-scans only (bench/loader_watch.py --no-watch compares).
LOADER_WATCH_ENV = "OTELBPF_LOADER_WATCH"


def loader_watch_wanted(config: "CaptureConfig") -> bool:
    """CaptureConfig.watch_loader, with GPU or TLS probes to attach late, unless
    OTELBPF_LOADER_WATCH turns it off."""
    setting = os.environ.get(LOADER_WATCH_ENV, "").strip().lower()
    wanted = config.watch_loader and (config.capture_gpu or config.capture_tls)
    return wanted and setting not in ("off", "0", "no", "false")


def regs_read_choice() -> str | None:
    """OTELBPF_REGS_READ: "load", "probe", or None when unset (load, falling
    back to probe if the verifier refuses the loads)."""
    wanted = os.environ.get(REGS_READ_ENV, "").strip().lower()
    if not wanted:
        return None
    if wanted not in ("load", "probe"):
        raise CaptureError(f"{REGS_READ_ENV}={wanted!r}: expected load or probe")
    return wanted


#: bpf/socket.c's SK_CHECK_LEN: the start-up offset check sends datagrams of this + slot bytes.
SK_CHECK_LEN = 7919


@dataclass(frozen=True)
class SockCapture:
    """How bpf/socket.c hooks socket I/O: raw sock_{recv,send}_length
    tracepoints (sk_family/sk_protocol read at BTF offsets: untraced processes
    pay only the filter) or the classic ones (the kernel copies the arguments
    into a trace record first, for every socket call on the host)."""

    raw: bool
    #: why the classic tracepoints, or where the offsets came from
    reason: str
    family_offset: int = 0
    protocol_offset: int = 0
    protocol_size: int = 0

    def cflags(self) -> list[str]:
        if not self.raw:
            return ["-DSOCK_RAW_TP=0"]
        return [
            "-DSOCK_RAW_TP=1",
            f"-DSK_FAMILY_OFF={self.family_offset}",
            f"-DSK_PROTOCOL_OFF={self.protocol_offset}",
            f"-DSK_PROTOCOL_SIZE={self.protocol_size}",
            f"-DSK_CHECK_LEN={SK_CHECK_LEN}",
        ]

    def describe(self) -> str:
        if self.raw:
            return (
                f"raw tracepoints with BTF offsets (sock_recv_length/sock_send_length; struct sock: skc_family at"
                f" {self.family_offset}, sk_protocol at {self.protocol_offset}, {self.protocol_size} bytes)"
            )
        return f"classic tracepoints ({self.reason})"

    def classic(self, reason: str) -> "SockCapture":
        return SockCapture(False, reason)


#: TP_PROTO of sock:sock_recv_length and sock:sock_send_length (include/trace/events/sock.h).
SOCK_LENGTH_ARGS = ["struct sock *", "int", "int"]


def plan_sock_capture(btf_path: str = btf.VMLINUX) -> SockCapture:
    """Raw tracepoints when this kernel's BTF says where struct sock keeps its
    family and protocol and that the tracepoints take (struct sock *, int ret,
    int flags); the classic tracepoints (with the reason) otherwise."""
    wanted = os.environ.get(SOCK_TRACEPOINTS_ENV, "auto").strip().lower() or "auto"
    if wanted == "classic":
        return SockCapture(False, f"{SOCK_TRACEPOINTS_ENV}=classic")
    if wanted not in ("auto", "raw"):
        return SockCapture(False, f"{SOCK_TRACEPOINTS_ENV}={wanted!r} is not auto, raw or classic")
    try:
        types = btf.load(btf_path)
        for tracepoint in ("sock_recv_length", "sock_send_length"):
            args = types.raw_tracepoint_args(tracepoint)
            if args != SOCK_LENGTH_ARGS:
                raise btf.BtfError(
                    f"raw tracepoint {tracepoint} takes ({', '.join(args)}), not ({', '.join(SOCK_LENGTH_ARGS)})"
                )
        family_offset, family_size = types.member("sock", "__sk_common.skc_family").byte_field()
        protocol_offset, protocol_size = types.member("sock", "sk_protocol").byte_field()
    except btf.BtfError as exc:
        return SockCapture(False, f"no BTF offsets: {exc}")
    if family_size != 2:
        return SockCapture(False, f"struct sock's skc_family is {family_size} bytes, not 2")
    if protocol_size not in (1, 2):
        return SockCapture(False, f"struct sock's sk_protocol is {protocol_size} bytes, not 1 or 2")
    return SockCapture(True, f"from {btf_path}", family_offset, protocol_offset, protocol_size)


#: TP_PROTO of the sched_switch raw tracepoint (include/trace/events/sched.h, Linux >= 5.18).
SCHED_SWITCH_ARGS = ["bool", "struct task_struct *", "struct task_struct *", "unsigned int"]


@dataclass(frozen=True)
class RankClocks:
    """Whether bpf/ranks.c is compiled in: the off-CPU clocks of the threads that issue NCCL
    collectives, kept by a raw sched_switch tracepoint that reads the switching-in task's
    pid at its BTF offset. Without them the time between a rank's collectives is split into
    GPU waits and the rest, not on-CPU and off-CPU (docs/gpu.md)."""

    enabled: bool
    #: why not, or where the offset came from
    reason: str
    task_pid_offset: int = 0

    def cflags(self) -> list[str]:
        if not self.enabled:
            return ["-DRANK_CLOCKS=0"]
        return ["-DRANK_CLOCKS=1", f"-DTASK_PID_OFF={self.task_pid_offset}"]


def plan_rank_clocks(config: CaptureConfig, btf_path: str = btf.VMLINUX) -> RankClocks:
    """Rank clocks when GPU calls are probed and this kernel's BTF gives sched_switch's
    prototype and task_struct's pid (a 4-byte pid_t)."""
    if not config.capture_gpu:
        return RankClocks(False, "GPU calls are not probed (--no-gpu)")
    try:
        types = btf.load(btf_path)
        args = types.raw_tracepoint_args("sched_switch")
        if args != SCHED_SWITCH_ARGS:
            raise btf.BtfError(f"raw tracepoint sched_switch takes ({', '.join(args)})")
        offset, size = types.member("task_struct", "pid").byte_field()
    except btf.BtfError as exc:
        return RankClocks(False, f"no BTF offsets: {exc}")
    if size != 4:
        return RankClocks(False, f"task_struct's pid is {size} bytes, not 4")
    return RankClocks(True, f"from {btf_path}", offset)
