"""Live capture: compiles bpf/capture.c with BCC, attaches it, drains its ring buffer.

bpf/capture.c includes one file per probe family (process lifecycle, socket
capture, asyncio task probes, generic call probes); the tracepoints attach
automatically on load, the uprobes per process through
:class:`otelbpf.sources.uprobes.UprobeAttacher`.

The kernel side submits records without waking us (BPF_RB_NO_WAKEUP), so the
agent calls :meth:`EbpfSource.read` on a timer (~10 ms): measured, that kept
the traced server at ~0.8x instead of ~0.57x with a wake-up per event
(docs/architecture.md, "Measured costs"). Records are drained from the mapped
ring by :mod:`otelbpf.sources.ringbuf` (no Python call per record; BCC's
callback is the fallback) and decoded in one batch with ``struct``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import select
import time
from dataclasses import dataclass, field
from pathlib import Path

from otelbpf.host import procfs
from otelbpf.core.events import ConnClose, ConnOpen, DatagramEvent, Event, ProcessStart, RoleHint, Source
from otelbpf.sources.ebpf_layout import (
    STAT_CALL_DEPTH,
    STAT_IO_MAP_FULL,
    STAT_LOST,
    STAT_MMSG_UNKNOWN,
    STAT_NO_TUPLE,
    STAT_PROFILE_LOST,
    STAT_TLS_UNATTRIBUTED,
    RecordDecoder,
    regs_cflags,
)
from otelbpf.sources import btf
from otelbpf.sources.early_tuples import EarlyTuples
from otelbpf.sources.memory import release_compiler_memory
from otelbpf.sources.uprobes import Attachment, ProbeSpec, UprobeAttacher
from otelbpf.profiles.sampler import ProfileConfig, ProfileSampler

log = logging.getLogger("otelbpf.ebpf")

BPF_DIR = Path(os.environ.get("OTELBPF_BPF_DIR") or Path(__file__).resolve().parents[2] / "bpf")

MIN_CAPTURE_BYTES = 64
#: Records are built in per-CPU scratch space twice the capture size (the
#: verifier's bound for gathered iovecs), and a per-CPU map value is at most
#: 32 KiB: 8 KiB of payload per syscall is the most that fits.
MAX_CAPTURE_BYTES = 8192
TRACED_BY_PID = 1
TRACED_BY_COMM = 2
EXCLUDED_BY_COMM = 3  # bpf/common.h: never traced (otelbpf.host.exclusions)
EXCLUDED_BY_PID = 4
MODE_LISTED = 0
MODE_ALL = 1


def program_text(path: Path | None = None, _seen: set[Path] | None = None) -> str:
    """bpf/capture.c with the local files it includes pasted in.

    BCC generates TRACEPOINT_PROBE argument structs and rewrites map calls
    (``map.lookup()``) only in the main file it compiles, so common.h and the
    probe-family files are inlined (with #line markers, so compiler messages
    name the right file). capture.h, the record ABI (plain structs, also
    compiled by tests/test_ebpf_layout.py), stays an ordinary include.
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


class CaptureError(RuntimeError):
    """The probes could not be compiled or attached; the message says why."""


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


def regs_read_choice() -> str | None:
    """OTELBPF_REGS_READ: "load", "probe", or None when unset (load, falling
    back to probe if the verifier refuses the loads)."""
    wanted = os.environ.get(REGS_READ_ENV, "").strip().lower()
    if not wanted:
        return None
    if wanted not in ("load", "probe"):
        raise CaptureError(f"{REGS_READ_ENV}={wanted!r}: expected load or probe")
    return wanted


def _last_line(exc: BaseException) -> str:
    """The last line of a BCC load error (the verifier's or compiler's verdict)."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else repr(exc)


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


@dataclass
class CaptureConfig:
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
    #: Never traced, dropped by the kernel filter (otelbpf.host.exclusions): comm
    #: patterns (NAME or NAME*) and pids (with their children).
    exclude_comms: list[str] = field(default_factory=list)
    exclude_pids: list[int] = field(default_factory=list)
    #: Stack samples for profiles (bpf/profile.c, otelbpf/profiles); hz 0 turns them off.
    profiles: ProfileConfig = field(default_factory=lambda: ProfileConfig(hz=0))

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
        self.profiles.validate()


def pid_max() -> int:
    """The host's highest pid + 1 (sizes the in-kernel traced-process array)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4194304


def monotonic_to_realtime_offset() -> int:
    """Nanoseconds to add to CLOCK_MONOTONIC (bpf_ktime_get_ns) to get unix time."""
    best = None
    for _ in range(3):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    return best[1]


class EbpfSource:
    def __init__(self, config: CaptureConfig) -> None:
        config.validate()
        self.config = config
        self.decoder = RecordDecoder(monotonic_to_realtime_offset())
        self.probe_count = 0
        self._bpf = None
        self._raw: list[bytes] = []
        self._last_clock_sync = time.monotonic()
        self._last_rescan = time.monotonic()
        self._callback = None
        #: reads the ring buffer through its mapping (otelbpf.sources.ringbuf); None: BCC's callback
        self._reader = None
        #: epoll on the ring (and the caller's interrupt fd) for wait_for_records, made on first use
        self._sleeper: select.epoll | None = None
        self._sleeper_fds: set[int] = set()
        #: per-process uprobes (asyncio task probes, generic call probes)
        self.uprobes: UprobeAttacher | None = None
        self._watched: set[int] = set()
        #: (spec name, function) -> EV_CALL probe id
        self._probe_ids: dict[tuple[str, str], int] = {}
        self._call_specs: dict[str, tuple[ProbeSpec, str, int]] = {}  # spec name -> (spec, library label, site flags)
        #: GPU library probes (None: --no-gpu, or not started)
        self.gpu = None
        #: Processes traced from the start (--pid, --comm): probed eagerly.
        self._initial_pids: list[int] = []
        self._announce_initial = True
        #: conn_id -> (family, addr, port) of connected UDP sockets, from /proc
        self._udp_peers: dict[int, tuple[int, str, int]] = {}
        #: TCP tuples of sockets older than the agent (sources/early_tuples.py)
        self._early_tuples = EarlyTuples()
        #: TLS library probes (None: --no-tls, or not started)
        self.tls = None
        #: pid -> when its maps were last re-read for TLS libraries on a new connection
        self._tls_looked: dict[int, float] = {}
        #: how socket I/O is hooked (set by start())
        self.sock_capture: SockCapture | None = None
        #: how the probes read the syscall registers: "load" or "probe" (OTELBPF_REGS_READ)
        self.regs_read = ""
        #: stack samples for profiles (None: profiles off, or not started)
        self.profiles: ProfileSampler | None = None
        #: capture_whole marks connections (CaptureConfig.whole_capture, OTELBPF_WHOLE_CAPTURE)
        self.whole_capture = whole_capture_wanted(config)

    # -- start-up ---------------------------------------------------------

    def start(self) -> int:
        """Compile, load, fill the filter maps, attach. Returns probes attached."""
        try:
            from bcc import BPF
        except ImportError as exc:  # pragma: no cover - depends on the host
            raise CaptureError(
                "cannot import bcc: install Debian's python3-bpfcc and run otelbpf from a venv made with "
                "--system-site-packages (scripts/install.sh does both)"
            ) from exc
        pages = self.config.ring_buffer_mb * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
        cflags = [
            f"-I{BPF_DIR}",
            f"-DCAPTURE_BYTES={self.config.capture_bytes}",
            f"-DRINGBUF_PAGES={pages}",
            f"-DCAPTURE_UNIX={int(self.config.capture_unix)}",
            f"-DPID_MAX={pid_max()}",
            f"-DHAVE_SK_DATA_READY={int(Path('/sys/kernel/tracing/events/sock/sk_data_ready').is_dir())}",
            f"-DCAPTURE_UDP={int(self.config.capture_udp)}",
            f"-DCAPTURE_TLS={int(self.config.capture_tls)}",
            f"-DTRACE_MODE={MODE_ALL if self.config.trace_all else MODE_LISTED}",
            f"-DAGENT_TGID={os.getpid()}",
            f"-DEXCLUDES={int(bool(self.config.exclude_comms or self.config.exclude_pids))}",
            "-Wno-macro-redefined",
        ] + self.config.profiles.cflags()
        unsupported = self.config.profiles.describe_unsupported()
        if unsupported:
            log.warning("%s", unsupported)
        regs_read_choice()  # a wrong OTELBPF_REGS_READ stops here, named
        try:
            cflags += regs_cflags(platform.machine())
        except ValueError as exc:
            raise CaptureError(str(exc)) from exc
        plan = plan_sock_capture()
        if plan.raw:
            try:
                self._bpf = self._compile(BPF, cflags + plan.cflags())
                problem = self._check_sock_offsets()
            except Exception as exc:  # noqa: BLE001 - BCC raises plain Exception; the classic path may still work
                problem = f"raw tracepoints failed to load: {_last_line(exc)}"
            if problem:
                if self._bpf is not None:
                    self._bpf.cleanup()
                    self._bpf = None
                plan = plan.classic(problem)
        self.sock_capture = plan
        if plan.raw:
            log.info("socket capture: %s", plan.describe())
        else:
            log.warning("socket capture: %s", plan.describe())
        try:
            if self._bpf is None:
                self._bpf = self._compile(BPF, cflags + plan.cflags())
        except Exception as exc:
            hint = ""
            if "task_pt_regs" in str(exc) or "get_current_task_btf" in str(exc) or "unknown func" in str(exc):
                hint = (
                    " -- the socket capture needs bpf_get_current_task_btf() and bpf_task_pt_regs() in tracepoint"
                    " programs (Linux >= 5.15 with BTF, /sys/kernel/btf/vmlinux)"
                )
            raise CaptureError(f"loading the eBPF program failed: {exc}{hint} (run `otelbpf doctor`)") from exc
        # The compiler is idle from here on: give back its pages and malloc's free memory (~100 MB of RSS)
        log.debug("after the compile: %d kB of compiler pages dropped", release_compiler_memory())
        log.info(
            "syscall registers: read %s",
            "by plain loads from bpf_task_pt_regs" if self.regs_read == "load" else "with bpf_probe_read_kernel",
        )
        self._configure_filter()
        self._configure_exclusions()
        try:
            from otelbpf.sources.ringbuf import RingBufReader

            self._reader = RingBufReader(self._bpf["events"].map_fd)
        except Exception as exc:  # noqa: BLE001 - BCC's per-record callback still works
            log.warning("ring buffer: cannot map it (%s): using BCC's per-record callback", exc)
            self._callback = self._bpf["events"].open_ring_buffer(self._on_record)
        if self.config.profiles.enabled:
            self.profiles = ProfileSampler(self._bpf, self.config.profiles, self.decoder.clock_offset_ns)
            self.profiles.attach()
        self.probe_count = self._bpf.num_open_tracepoints() + len(self._bpf.raw_tracepoint_fds)
        specs = []
        if self.config.python_tasks:
            from otelbpf.sources.python_tasks import SPEC

            specs.append(SPEC)
        self.uprobes = UprobeAttacher(self._bpf, specs, on_attach=self._on_uprobe_attach, on_detach=self._on_uprobe_detach)
        if self.config.capture_gpu:
            from otelbpf.sources.gpu import GpuProbes

            self.gpu = GpuProbes(self, timed_launches=self.config.gpu_launch_time)
        if self.config.capture_tls:
            from otelbpf.sources.tls import TlsProbes

            # host-wide when processes started later are traced by name (cover them from their first call)
            self.tls = TlsProbes(self._bpf, host_wide=bool(self.config.comms or self.config.trace_all))
            self.tls.attach_system()
        for pid in self._initial_pids:
            # attach the per-process probes before the first request, not at first sight
            self.watch_process(pid)
        # after the probes: a connection opened from now on has its tuple from the kernel
        self._early_tuples.snapshot(procfs.all_pids() if self.config.trace_all else self._initial_pids)
        return self.probe_count

    def _check_sock_offsets(self) -> str | None:
        """Prove the BTF offsets on live sockets: attach bpf/socket.c's
        sk_offsets_check to sock_send_length for a moment, send a datagram of
        a known length on sockets of known family and protocol (Unix datagram,
        UDP, TCP over loopback, UDP over IPv6 when there is one) and compare
        what the probe read. Returns what went wrong, or None. A few ms."""
        import socket

        from bcc import BPF
        from bcc.libbcc import lib

        fn = self._bpf.load_func(b"sk_offsets_check", BPF.RAW_TRACEPOINT)
        link = lib.bpf_attach_raw_tracepoint(fn.fd, b"sock_send_length")
        if link < 0:
            return "the offset check could not attach to sock_send_length"
        expected: dict[int, tuple[int, int, str]] = {}
        opened: list[socket.socket] = []

        def sock(*args) -> socket.socket:
            s = socket.socket(*args)
            opened.append(s)
            return s

        try:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            opened += [a, b]
            a.send(b"u" * SK_CHECK_LEN)
            expected[0] = (socket.AF_UNIX, 0, "a Unix datagram socket")
            rx = sock(socket.AF_INET, socket.SOCK_DGRAM)
            rx.bind(("127.0.0.1", 0))
            sock(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"d" * (SK_CHECK_LEN + 1), rx.getsockname())
            expected[1] = (socket.AF_INET, socket.IPPROTO_UDP, "a UDP socket")
            listener = sock(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            client = sock(socket.AF_INET, socket.SOCK_STREAM)
            client.settimeout(2)
            client.connect(listener.getsockname())
            opened.append(listener.accept()[0])
            client.sendall(b"t" * (SK_CHECK_LEN + 2))
            expected[2] = (socket.AF_INET, socket.IPPROTO_TCP, "a TCP socket")
            try:
                rx6 = sock(socket.AF_INET6, socket.SOCK_DGRAM)
                rx6.bind(("::1", 0))
                sock(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"6" * (SK_CHECK_LEN + 3), rx6.getsockname()[:2])
                expected[3] = (socket.AF_INET6, socket.IPPROTO_UDP, "a UDP/IPv6 socket")
            except OSError:
                pass  # no IPv6 here: three sockets are proof enough
        except OSError as exc:
            return f"the offset check could not use sockets: {exc}"
        finally:
            os.close(link)
            for s in opened:
                s.close()
        table = self._bpf["sk_check"]
        for slot, (family, protocol, what) in expected.items():
            seen = int(table[ctypes.c_int(slot)].value)
            if seen != (family << 16 | protocol):
                return (
                    f"the BTF offsets read {what} as family {seen >> 16}, protocol {seen & 0xFFFF}"
                    f" (expected {family}, {protocol})" if seen else f"the offset check never saw {what}'s send"
                )
        return None

    def _compile(self, bpf_class, cflags: list[str]):
        """Compile and load the probes, reading registers by plain loads; if
        that fails and OTELBPF_REGS_READ does not pin a choice, try once more
        with bpf_probe_read_kernel (a verifier that refuses loads from the
        BTF pointer) and say so. The first error is the one raised when both
        fail."""
        choice = regs_read_choice()
        first = choice or "load"
        try:
            bpf = bpf_class(text=program_text().encode(), cflags=cflags + [f"-DREGS_PROBE_READ={int(first == 'probe')}"])
            self.regs_read = first
            return bpf
        except Exception as exc:
            if choice is not None:
                raise
            failure = exc
        try:
            bpf = bpf_class(text=program_text().encode(), cflags=cflags + ["-DREGS_PROBE_READ=1"])
        except Exception:
            raise failure from None
        log.warning(
            "syscall registers: plain loads from bpf_task_pt_regs refused (%s); reading them with"
            " bpf_probe_read_kernel (set %s=probe to skip the first try)",
            _last_line(failure),
            REGS_READ_ENV,
        )
        self.regs_read = "probe"
        return bpf

    def _configure_filter(self) -> None:
        bpf = self._bpf
        comms = bpf["traced_comms"]
        for name in self.config.comms:
            key = comms.Key()
            key.comm = name.encode()
            comms[key] = ctypes.c_ubyte(1)
        for pid in self.config.pids:
            if not procfs.process_exists(pid):
                raise CaptureError(f"--pid {pid}: no such process")
            for member in procfs.descendants(pid):
                self.trace_pid(member, TRACED_BY_PID)
                self._initial_pids.append(member)
        if self.config.comms:
            for pid in procfs.pids_with_comm(self.config.comms):
                if pid != os.getpid():
                    self.trace_pid(pid, TRACED_BY_COMM)
                    self._initial_pids.append(pid)

    def _configure_exclusions(self) -> None:
        """Fill the kernel's exclusion table and mark running processes that
        match (after the traced ones: an exclusion wins)."""
        from otelbpf.host.exclusions import comm_matches, comm_prefix

        table = self._bpf["excluded_comms"]
        for index, pattern in enumerate(self.config.exclude_comms):
            raw, length = comm_prefix(pattern)
            entry = table.Leaf()
            entry.len = length
            entry.comm = raw
            table[ctypes.c_int(index)] = entry
        excluded = set()
        for pid in self.config.exclude_pids:
            for member in procfs.descendants(pid):
                self.trace_pid(member, EXCLUDED_BY_PID)
                excluded.add(member)
        if self.config.exclude_comms:
            for pid in procfs.all_pids():
                comm = procfs.comm_of(pid) or ""
                if pid not in excluded and any(comm_matches(p, comm) for p in self.config.exclude_comms):
                    self.trace_pid(pid, EXCLUDED_BY_COMM)
                    excluded.add(pid)
        if excluded:
            self._initial_pids = [pid for pid in self._initial_pids if pid not in excluded]

    def table(self, name: str):
        """A map of the loaded program, by name (for families outside the source)."""
        return self._bpf[name]

    def trace_pid(self, pid: int, reason: int = TRACED_BY_PID) -> None:
        self._bpf["traced_tgids"][ctypes.c_uint(pid)] = ctypes.c_ubyte(reason)

    def watch_process(self, pid: int) -> bool:
        """A traced process was seen for the first time: attach the per-process
        uprobes whose libraries it maps (asyncio task probes if it is CPython
        >= 3.10, call probes). True if anything was attached."""
        if self._bpf is None or self.uprobes is None:
            return False
        self._watched.add(pid)
        if self.profiles is not None:
            self.profiles.watch(pid)
        tls = bool(self.tls.scan(pid)) if self.tls is not None else False
        return bool(self._report(pid, self.uprobes.scan(pid))) or tls

    def _report(self, pid: int, attached: list[Attachment]) -> list[Attachment]:
        if self.gpu is not None and attached:
            self.gpu.report(pid, attached)
        return attached

    def forget_process(self, pid: int) -> None:
        self._watched.discard(pid)
        self._early_tuples.forget(pid)
        self._tls_looked.pop(pid, None)
        if self.profiles is not None:
            self.profiles.forget(pid)
        if self.tls is not None:
            self.tls.forget(pid)
        if self.gpu is not None:
            self.gpu.forget(pid)
        if self.uprobes is not None:
            self.uprobes.forget(pid)

    def rescan_libraries(self) -> int:
        """Look again at every watched process's executable mappings and attach
        to libraries loaded since (dlopen). Cheap when nothing changed: one
        read of /proc/PID/maps per process. Returns the new attachments."""
        if self.uprobes is None:
            return 0
        count = 0
        for pid in list(self._watched):
            if not procfs.process_exists(pid):
                self.forget_process(pid)
                continue
            count += len(self._report(pid, self.uprobes.rescan(pid)))
            if self.tls is not None:
                count += len(self.tls.scan(pid))
        if self.profiles is not None:
            self.profiles.rescan()
        return count

    def _look_for_libraries_again(self, pid: int, now: float) -> None:
        """A traced process opened a connection: it may have loaded a TLS or GPU library
        since it was last scanned (dlopen, or CPython importing ssl late). Re-read
        its maps, at most once a second per process (one /proc read when nothing changed)."""
        if pid not in self._watched or now - self._tls_looked.get(pid, 0.0) < 1.0:
            return
        if len(self._tls_looked) > 65536:
            self._tls_looked.clear()
        self._tls_looked[pid] = now
        if self.tls is not None:
            self.tls.scan(pid)
        if self.uprobes is not None:  # e.g. a CUDA library imported late
            self._report(pid, self.uprobes.rescan(pid))

    def add_call_probe(
        self, name: str, library: str, symbols: tuple[str, ...], returns: bool = True, label: str = "",
        flags: int = 0, hint: bytes = b"",
    ) -> None:
        """Probe ``symbols`` in every watched (and later watched) process mapping a
        file matching the regex ``library`` (or containing ``hint``): each call
        becomes a CallEvent whose ``library`` is ``label`` (default: the mapped
        file's name). ``flags``: bpf/calls.c's per-site CALL_* flags."""
        spec = ProbeSpec(name, library, tuple(symbols), entry="call_enter", ret="call_return" if returns else None, hint=hint)
        self._call_specs[name] = (spec, label, flags)
        self.add_probe(spec)

    def add_probe(self, spec: ProbeSpec) -> None:
        """Attach ``spec`` (its own BPF programs) to every watched process mapping its library."""
        if self.uprobes is not None:
            self.uprobes.add_spec(spec)
            for pid in list(self._watched):
                self._report(pid, self.uprobes.scan(pid))

    def _on_uprobe_attach(self, attachment: Attachment) -> None:
        known = self._call_specs.get(attachment.spec.name)
        if known is None or not attachment.runtime_addr:
            return
        spec, label, flags = known
        function = attachment.symbol.names[0].split("@", 1)[0]
        probe_id = self._probe_ids.setdefault((spec.name, function), len(self._probe_ids) + 1)
        self.decoder.probe_names[probe_id] = (label or os.path.basename(attachment.mapped), function)
        table = self._bpf["call_sites"]
        key = table.Key()
        key.tgid = attachment.pid
        key.addr = attachment.runtime_addr
        leaf = table.Leaf()
        leaf.probe_id = probe_id
        leaf.flags = (1 if spec.ret else 0) | flags
        table[key] = leaf

    def _on_uprobe_detach(self, attachment: Attachment) -> None:
        if attachment.spec.name not in self._call_specs or not attachment.runtime_addr or self._bpf is None:
            return
        table = self._bpf["call_sites"]
        key = table.Key()
        key.tgid = attachment.pid
        key.addr = attachment.runtime_addr
        try:
            del table[key]
        except KeyError:
            pass

    def mute(self, pid: int, fd: int, conn_id: int, source: int = Source.SOCKET) -> None:
        """Stop copying a connection's payloads from one source (it carries no
        protocol we know): its later I/O costs the kernel a map lookup for that
        source and nothing else. Other sources (e.g. TLS plaintext) go on."""
        self._set_conn_bit(pid, fd, conn_id, "muted", 1 << int(source))

    def capture_whole(self, pid: int, fd: int, conn_id: int, source: int = Source.SOCKET) -> None:
        """Capture this connection's reads and writes from ``source`` (socket
        payloads or TLS plaintext) whole from now on, up to capture.h's
        WHOLE_CAPTURE_BYTES per call, in several records, instead of their first
        --capture-bytes: its bodies are read (an LLM call's stream). The server
        endpoint it talks to is remembered in the kernel (whole_endpoints,
        bpf/socket.c): the next connections to or from it are captured whole from
        their first byte, however late this agent gets to them. Nothing with
        OTELBPF_WHOLE_CAPTURE=off (CaptureConfig.whole_capture)."""
        if not self.whole_capture:
            return
        bit = 1 << int(source)
        entry = self._set_conn_bit(pid, fd, conn_id, "whole", bit)
        if entry is not None:
            self._remember_endpoint(entry.sk, bit)

    def _remember_endpoint(self, sk: int, bit: int) -> None:
        """Mark the server endpoint of the TCP socket ``sk`` (its tuple, from the
        kernel's sk_tuples) for whole capture of ``bit``'s source."""
        try:
            found = self._bpf["sk_tuples"][ctypes.c_ulonglong(sk)]
        except KeyError:  # not TCP, or older than the agent: no tuple, no endpoint
            return
        table = self._bpf["whole_endpoints"]
        key = table.Key()
        key.family = found.family
        if found.role == RoleHint.ACCEPTED:
            key.port, address = found.local_port, found.local_addr
        elif found.role == RoleHint.CONNECTED:
            key.port, address = found.peer_port, found.peer_addr
        else:
            return
        ctypes.memmove(ctypes.addressof(key.addr), ctypes.addressof(address), ctypes.sizeof(key.addr))
        try:
            bits = table[key].value
        except KeyError:
            bits = 0
        if not bits & bit:
            table[key] = ctypes.c_ubyte(bits | bit)

    def _set_conn_bit(self, pid: int, fd: int, conn_id: int, field: str, bit: int) -> object | None:
        """Set ``bit`` in a field of the kernel's entry for (pid, fd), if it is still
        the connection ``conn_id`` (the fd may have been reused since); returns the
        entry, or None when it is gone or another connection's."""
        table = self._bpf["conns"]
        key = table.Key(pid, fd)
        try:
            value = table[key]
        except KeyError:
            return None
        if value.conn_id != conn_id:
            return None
        if not getattr(value, field) & bit:
            setattr(value, field, getattr(value, field) | bit)
            table[key] = value
        return value

    # -- steady state ------------------------------------------------------

    def _on_record(self, _ctx, data, size) -> int:
        self._raw.append(ctypes.string_at(data, size))
        return 0  # returning None halves BCC's callback rate (docs/architecture.md, "Measured costs")

    def wait_for_records(self, timeout_s: float, interrupt_fd: int | None = None) -> bool:
        """Sleep until the kernel submits a record, ``interrupt_fd`` becomes readable or
        ``timeout_s`` passes; True when records may be waiting.

        For an agent that has caught up and found the ring empty for a while
        (otelbpf/runtime/agent.py, "Sleeping while idle"): it sleeps here instead of waking
        every drain interval. The probes ask the kernel to wake the ring's waiters only
        while this waits (``consumer_sleeping``, bpf/common.h), and then only for the
        first record since the ring emptied. A record submitted in the instant the flag
        is being set may go without a wake-up: it is read when the wait times out."""
        if self._bpf is None:
            time.sleep(timeout_s)
            return False
        if self.profiles is not None:  # on-CPU samples do not wake us: read them before the ring fills
            timeout_s = min(timeout_s, self.profiles.unread_limit_s)
        sleeping = self._bpf["consumer_sleeping"]
        sleeping[ctypes.c_int(0)] = ctypes.c_uint32(1)
        try:
            if self._reader is None:  # BCC's callback: its poll waits on the ring and consumes
                self._bpf.ring_buffer_poll(max(1, int(timeout_s * 1000)))
                return bool(self._raw)
            if self._reader.pending_bytes():  # submitted before the probes saw the flag
                return True
            ready = self._epoll(interrupt_fd).poll(timeout_s)
            return any(fd != interrupt_fd for fd, _ in ready)
        finally:
            sleeping[ctypes.c_int(0)] = ctypes.c_uint32(0)

    def _epoll(self, interrupt_fd: int | None) -> select.epoll:
        """The epoll set of the ring's map fd (readable once a record is submitted with a
        wake-up) and ``interrupt_fd``."""
        if self._sleeper is None:
            self._sleeper = select.epoll()
            self._sleeper.register(self._bpf["events"].map_fd, select.EPOLLIN)
            if self.profiles is not None:  # stack samples wake a sleeping agent too
                self._sleeper.register(self.profiles.ring_fd, select.EPOLLIN)
        if interrupt_fd is not None and interrupt_fd not in self._sleeper_fds:
            self._sleeper.register(interrupt_fd, select.EPOLLIN)
            self._sleeper_fds.add(interrupt_fd)
        return self._sleeper

    def discard(self) -> int:
        """Drain what the kernel submitted and drop it undecoded; how many records
        (``otelbpf run --discard-events``: the kernel capture's cost alone, with user
        space keeping up, for benchmarks)."""
        if self._reader is not None:
            return self._reader.skip()  # nothing copied: the kernel's cost stays what is measured
        self._bpf.ring_buffer_consume()
        dropped, self._raw = len(self._raw), []
        return dropped

    def read(self) -> list[Event]:
        """Drain what the kernel submitted since the last call; never blocks."""
        now = time.monotonic()
        if now - self._last_clock_sync > 10:
            self.decoder.clock_offset_ns = monotonic_to_realtime_offset()
            if self.profiles is not None:
                self.profiles.decoder.clock_offset_ns = self.decoder.clock_offset_ns
            self._last_clock_sync = now
        if self._reader is not None:
            events = self._reader.drain_decoded(self.decoder)  # decoded in the ring: no copy per record
        else:
            self._bpf.ring_buffer_consume()
            raw, self._raw = self._raw, []
            events = self.decoder.decode(raw) if raw else []
        if self.profiles is not None:
            samples = self.profiles.drain(consume=self._reader is not None)
            if samples:
                events = events + samples if events else samples
        started = self._initial_process_starts() if self._announce_initial else None
        if self.config.rescan_interval_s and now - self._last_rescan > self.config.rescan_interval_s:
            self._last_rescan = now
            self.rescan_libraries()
        if not events:
            return started or []
        for event in events:
            kind = type(event)
            if kind is ConnOpen:
                self._look_for_libraries_again(event.pid, now)
                if event.family == 0 and not procfs.fill_tuple_from_proc(event):
                    self._early_tuples.fill(event)  # its socket closed before we got here
                if event.protocol == procfs.IPPROTO_UDP and event.peer_port:
                    if len(self._udp_peers) > 65536:
                        self._udp_peers.clear()
                    self._udp_peers[event.conn_id] = (event.family, event.peer_addr, event.peer_port)
            elif kind is DatagramEvent:
                if event.family == 0:
                    peer = self._udp_peers.get(event.conn_id)
                    if peer is not None:  # a connected UDP socket: the kernel saw no address
                        event.family, event.peer_addr, event.peer_port = peer
            elif kind is ConnClose and self._udp_peers:
                self._udp_peers.pop(event.conn_id, None)
        if started:
            return started + events
        return events

    def _initial_process_starts(self) -> list[Event]:
        """ProcessStart for the processes traced from the start (--pid/--comm), once."""
        self._announce_initial = False
        ts = time.time_ns()
        return [ProcessStart(ts, pid, procfs.comm_of(pid) or "") for pid in self._initial_pids if procfs.process_exists(pid)]

    def kernel_stats(self) -> dict[str, int]:
        """Counters kept in the kernel (summed over CPUs)."""
        table = self._bpf["stats"]
        return {
            "lost": int(table.sum(ctypes.c_int(STAT_LOST)).value),
            "io_map_full": int(table.sum(ctypes.c_int(STAT_IO_MAP_FULL)).value),
            "no_tuple": int(table.sum(ctypes.c_int(STAT_NO_TUPLE)).value),
            "mmsg_unknown": int(table.sum(ctypes.c_int(STAT_MMSG_UNKNOWN)).value),
            "call_depth": int(table.sum(ctypes.c_int(STAT_CALL_DEPTH)).value),
            "tls_unattributed": int(table.sum(ctypes.c_int(STAT_TLS_UNATTRIBUTED)).value),
            "profile_lost": int(table.sum(ctypes.c_int(STAT_PROFILE_LOST)).value),
        }

    def close(self) -> None:
        if self.uprobes is not None:
            self.uprobes.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self.profiles is not None:
            self.profiles.close()
        if self._sleeper is not None:
            self._sleeper.close()
            self._sleeper = None
            self._sleeper_fds.clear()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
