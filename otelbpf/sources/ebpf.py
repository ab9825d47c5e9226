"""Live capture: loads the eBPF program, attaches it, drains its ring buffer.

What program, and with which options, is decided by
:mod:`otelbpf.sources.ebpf_program` (:class:`CaptureConfig`, the program
text, the -D flags, the socket-capture plan); :class:`EbpfSource` compiles it
with BCC (falling back where the kernel refuses a choice), fills the
traced-process filter and the exclusions, attaches the per-process probes and
turns the kernel's records into events.

bpf/capture.c includes one file per probe family (process lifecycle, socket
capture, asyncio task probes, generic call probes); the tracepoints attach
automatically on load, the uprobes per process through
:class:`otelbpf.sources.uprobes.UprobeAttacher`.

The kernel side submits records without waking us (BPF_RB_NO_WAKEUP), so the
agent calls :meth:`EbpfSource.read` on a timer (~10 ms): measured, that kept
the traced server at ~0.8x instead of ~0.57x with a wake-up per event
(docs/architecture.md, "Measured costs"). Records are drained from the mapped
ring by :mod:`otelbpf.sources.ringbuf` (no Python call per record; BCC's
callback is the fallback) and decoded in one batch by
:mod:`otelbpf.sources.ebpf_layout`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import select
import socket
import time

from otelbpf.core.events import ConnClose, ConnOpen, DatagramEvent, Event, LibraryLoad, ProcessStart, RoleHint, Source
from otelbpf.host import procfs
from otelbpf.host.exclusions import comm_matches, comm_prefix
from otelbpf.sources.early_tuples import EarlyTuples
from otelbpf.sources.ebpf_layout import (
    CONTEXT_STATS,
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
from otelbpf.sources.ebpf_program import (
    REGS_READ_ENV,
    SK_CHECK_LEN,
    CaptureConfig,
    CaptureError,
    SockCapture,
    RankClocks,
    compile_flags,
    plan_rank_clocks,
    loader_watch_wanted,
    plan_sock_capture,
    program_text,
    regs_read_choice,
    whole_capture_wanted,
)
from otelbpf.sources.loader import SPEC as LOADER_SPEC
from otelbpf.sources.memory import release_compiler_memory
from otelbpf.sources.crossnode import KernelPropagation, PropagationPlan
from otelbpf.sources.crossnode import plan as plan_propagation
from otelbpf.sources.python_tasks import SPEC as PYTHON_TASKS_SPEC
from otelbpf.sources.tls import TlsProbes
from otelbpf.sources.uprobes import Attachment, ProbeSpec, UprobeAttacher

log = logging.getLogger("otelbpf.ebpf")

#: Values of the kernel's traced-process filter (bpf/common.h): why a process is traced or never is.
TRACED_BY_PID = 1
TRACED_BY_COMM = 2
EXCLUDED_BY_COMM = 3  # never traced (otelbpf.host.exclusions)
EXCLUDED_BY_PID = 4


def _last_line(exc: BaseException) -> str:
    """The last line of a BCC load error (the verifier's or compiler's verdict)."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else repr(exc)


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
    """The live eBPF source. :meth:`start` compiles, loads and attaches the
    program; :meth:`read` drains what the kernel captured, as events. In
    between, the agent says which processes to watch for library probes
    (:meth:`watch_process`, :meth:`forget_process`) and which connections to
    mute or capture whole (:meth:`mute`, :meth:`capture_whole`)."""

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
        #: spec name -> (spec, library label, site flags, function -> more site flags)
        self._call_specs: dict[str, tuple[ProbeSpec, str, int, dict[str, int]]] = {}
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
        self.profiles = None  # otelbpf.profiles.sampler.ProfileSampler, started by config.profiles
        #: capture_whole marks connections (CaptureConfig.whole_capture, OTELBPF_WHOLE_CAPTURE)
        self.whole_capture = whole_capture_wanted(config)
        #: cross-node trace context: what runs (set by start()), and its attachments
        self.propagation_plan: PropagationPlan | None = None
        self.propagation: KernelPropagation | None = None
        #: off-CPU clocks of the threads issuing NCCL collectives (bpf/ranks.c; set by start())
        self.rank_clocks: RankClocks | None = None
        #: the clocks' sched_switch program is attached (once a process maps NCCL)
        self.rank_clocks_running = False

    # -- start-up ---------------------------------------------------------

    def start(self) -> int:
        """Compile, load, fill the filter maps, attach. Returns probes attached."""
        try:  # bcc here, not at the top: it may be absent (replays, tests) and it loads LLVM
            from bcc import BPF
        except ImportError as exc:  # pragma: no cover - depends on the host
            raise CaptureError(
                "cannot import bcc: install Debian's python3-bpfcc and run otelbpf from a venv made with "
                "--system-site-packages (scripts/install.sh does both)"
            ) from exc
        cflags = compile_flags(self.config)
        unsupported = self.config.profiles.describe_unsupported() if self.config.profiles is not None else None
        if unsupported:
            log.warning("%s", unsupported)
        regs_read_choice()  # a wrong OTELBPF_REGS_READ stops here, named
        try:
            cflags += regs_cflags(platform.machine())
        except ValueError as exc:
            raise CaptureError(str(exc)) from exc
        self.propagation_plan = plan_propagation(self.config.propagation, self.config.propagation_cgroup)
        if self.propagation_plan.reasons:
            log.warning("cross-node context: %s", self.propagation_plan.describe())
        cflags += self.propagation_plan.cflags()
        self.rank_clocks = plan_rank_clocks(self.config)
        cflags += self.rank_clocks.cflags()
        if self.config.capture_gpu and not self.rank_clocks.enabled:
            log.warning("NCCL ranks: no off-CPU clocks (%s): host time between collectives is not split", self.rank_clocks.reason)
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
        if self.propagation_plan.active:
            self.propagation = KernelPropagation(self._bpf, self.propagation_plan, plan.raw)
            try:
                self.propagation.attach()
            except OSError as exc:
                self.propagation.close()
                raise CaptureError(f"cross-node context: attaching failed: {exc} (--propagation off leaves it out)") from exc
            log.info("cross-node context: %s", self.propagation_plan.describe())
        try:  # the import inside the try: a reader that cannot be imported leaves BCC's callback too
            from otelbpf.sources.ringbuf import RingBufReader

            self._reader = RingBufReader(self._bpf["events"].map_fd)
        except Exception as exc:  # noqa: BLE001 - BCC's per-record callback still works
            log.warning("ring buffer: cannot map it (%s): using BCC's per-record callback", exc)
            self._callback = self._bpf["events"].open_ring_buffer(self._on_record)
        if self.config.profiles is not None and self.config.profiles.enabled:
            self.profiles = self.config.profiles.start(self._bpf, self.decoder.clock_offset_ns)
        self.probe_count = self._bpf.num_open_tracepoints() + len(self._bpf.raw_tracepoint_fds)
        specs = []
        if self.config.python_tasks:
            specs.append(PYTHON_TASKS_SPEC)
        if loader_watch_wanted(self.config):
            specs.append(LOADER_SPEC)  # libraries loaded later: probed at their load (bpf/loader.c)
        self.uprobes = UprobeAttacher(self._bpf, specs, on_attach=self._on_uprobe_attach, on_detach=self._on_uprobe_detach)
        if self.config.capture_gpu:
            from otelbpf.sources.gpu import GpuProbes  # only with GPU probes on: it imports the GPU span semantics

            self.gpu = GpuProbes(self, timed_launches=self.config.gpu_launch_time)
        if self.config.capture_tls:
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
        from bcc import BPF  # bcc here, as in start(): it may be absent
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

    def nccl_pids(self) -> list[int]:
        """The traced processes that map an NCCL library (read by the RAS poller's thread)."""
        return list(self.gpu.nccl_versions) if self.gpu is not None else []

    def event_time_ns(self, monotonic_ns: int) -> int:
        """A CLOCK_MONOTONIC time on the events' clock (what the records' times become)."""
        return monotonic_ns + self.decoder.clock_offset_ns

    def nccl_version(self, pid: int) -> tuple[int, int, int] | None:
        """The version of the NCCL library probed in ``pid`` (None: not known)."""
        return self.gpu.nccl_version(pid) if self.gpu is not None else None

    def start_rank_clocks(self) -> bool:
        """Attach bpf/ranks.c's sched_switch program (once): a process maps NCCL, so its
        collective-issuing threads get off-CPU clocks. Until then no context switch on the
        host runs it. True if the clocks run."""
        if self.rank_clocks_running or self._bpf is None or not (self.rank_clocks and self.rank_clocks.enabled):
            return self.rank_clocks_running
        try:
            self._bpf.attach_raw_tracepoint(tp=b"sched_switch", fn_name=b"rank_sched_switch")
        except Exception as exc:  # noqa: BLE001 - BCC raises plain Exception; the spans work without clocks
            log.warning("NCCL ranks: cannot attach the off-CPU clocks to sched_switch: %s", _last_line(exc))
            self.rank_clocks = RankClocks(False, f"sched_switch: {_last_line(exc)}")
            return False
        self.rank_clocks_running = True
        log.info("NCCL ranks: off-CPU clocks of collective-issuing threads on (sched_switch)")
        return True

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
        if self.propagation is not None:
            self.propagation.watch(pid)
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
        flags: int = 0, hint: bytes = b"", function_flags: dict[str, int] | None = None,
    ) -> None:
        """Probe ``symbols`` in every watched (and later watched) process mapping a
        file matching the regex ``library`` (or containing ``hint``): each call
        becomes a CallEvent whose ``library`` is ``label`` (default: the mapped
        file's name). ``flags``: bpf/calls.c's per-site CALL_* flags, with
        ``function_flags[function]`` added for that function's sites."""
        spec = ProbeSpec(name, library, tuple(symbols), entry="call_enter", ret="call_return" if returns else None, hint=hint)
        self._call_specs[name] = (spec, label, flags, dict(function_flags or {}))
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
        spec, label, flags, function_flags = known
        function = attachment.symbol.names[0].split("@", 1)[0]
        flags |= function_flags.get(function, 0)
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
        profiles = self.profiles
        if profiles is not None:
            reader = profiles.reader  # nothing pending and no kernel stack due: no call (most drains)
            if reader is None or reader.pending_bytes() or now >= profiles.release_due:
                samples = profiles.drain(consume=self._reader is not None)
                if samples:
                    events = events + samples if events else samples
        started = self._initial_process_starts() if self._announce_initial else None
        if self.config.rescan_interval_s and now - self._last_rescan > self.config.rescan_interval_s:
            self._last_rescan = now
            self.rescan_libraries()
        if not events:
            return started or []
        loaded = None
        for event in events:
            kind = type(event)
            if kind is LibraryLoad:
                loaded = loaded or set()
                loaded.add(event.pid)
            elif kind is ConnOpen:
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
        if loaded:
            self._libraries_loaded(loaded)
            events = [event for event in events if type(event) is not LibraryLoad]
        if started:
            return started + events
        return events

    def _libraries_loaded(self, pids: set[int]) -> None:
        """The loader of each of ``pids`` changed its link map (bpf/loader.c): read its maps
        now and probe what is new. The kernel's pending mark goes first, so a library loaded
        while this reads sends another event rather than none."""
        pending = self._bpf["lib_load_pending"]
        for pid in pids:
            pending.pop(ctypes.c_uint32(pid), None)
            if pid not in self._watched:
                continue
            started = time.monotonic()
            if self.tls is not None:
                self.tls.scan(pid)
            attached = self._report(pid, self.uprobes.rescan(pid))
            if attached:
                log.debug("loader: pid %d: %d probes attached in %.1f ms", pid, len(attached), (time.monotonic() - started) * 1e3)

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
        } | {name: int(table.sum(ctypes.c_int(index)).value) for name, index in CONTEXT_STATS.items()}

    def close(self) -> None:
        if self.propagation is not None:  # first: the sock_ops program leaves the cgroup at once
            self.propagation.close()
            self.propagation = None
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
