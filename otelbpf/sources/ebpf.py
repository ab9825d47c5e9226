"""Live capture: compiles bpf/capture.c with BCC, attaches it, drains its ring buffer.

The kernel side submits records without waking us (BPF_RB_NO_WAKEUP), so the
agent calls :meth:`EbpfSource.read` on a timer (~10 ms): per DESIGN.md's
measurements that keeps the traced server at ~0.8x instead of ~0.57x with a
wake-up per event. Records are copied out in the BCC callback and decoded in
one batch with ``struct`` (faster than BCC's ctypes ``.event()``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from otelbpf import procfs
from otelbpf.events import ConnOpen, Event
from otelbpf.sources.ebpf_layout import STAT_IO_MAP_FULL, STAT_LOST, STAT_NO_TUPLE, RecordDecoder

log = logging.getLogger("otelbpf.ebpf")

BPF_DIR = Path(os.environ.get("OTELBPF_BPF_DIR") or Path(__file__).resolve().parents[2] / "bpf")

MIN_CAPTURE_BYTES = 64
MAX_CAPTURE_BYTES = 65536
TRACED_BY_PID = 1
TRACED_BY_COMM = 2
MODE_LISTED = 0
MODE_ALL = 1


class CaptureError(RuntimeError):
    """The probes could not be compiled or attached; the message says why."""


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
        self._callback = None
        #: pid -> file path the asyncio task probes are attached to.
        self._python_probes: dict[int, str] = {}
        #: Processes traced from the start (--pid, --comm): probed eagerly.
        self._initial_pids: list[int] = []

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
            
            "-Wno-macro-redefined",
        ]
        try:
            self._bpf = BPF(src_file=str(BPF_DIR / "capture.c").encode(), cflags=cflags)
        except Exception as exc:
            raise CaptureError(f"loading the eBPF program failed: {exc} (run `otelbpf doctor`)") from exc
        self._configure_filter()
        self._callback = self._bpf["events"].open_ring_buffer(self._on_record)
        self.probe_count = self._bpf.num_open_tracepoints() + len(self._bpf.raw_tracepoint_fds)
        for pid in self._initial_pids:
            # attach the asyncio probes before the first request, not at first sight
            self.watch_process(pid)
        return self.probe_count

    def _configure_filter(self) -> None:
        bpf = self._bpf
        cfg_table = bpf["config_map"]
        cfg = cfg_table.Leaf()
        cfg.mode = MODE_ALL if self.config.trace_all else MODE_LISTED
        cfg.agent_tgid = os.getpid()
        cfg_table[ctypes.c_int(0)] = cfg
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

    def trace_pid(self, pid: int, reason: int = TRACED_BY_PID) -> None:
        self._bpf["traced_tgids"][ctypes.c_uint(pid)] = ctypes.c_ubyte(reason)

    def watch_process(self, pid: int) -> bool:
        """A traced process was seen for the first time: if it is CPython
        >= 3.10, attach the asyncio task probes to it (by pid)."""
        if not self.config.python_tasks or pid in self._python_probes or self._bpf is None:
            return False
        from otelbpf.sources.python_tasks import SYMBOL, python_with_tasks

        path = python_with_tasks(pid)
        if path is None:
            return False
        try:
            self._bpf.attach_uprobe(name=path, sym=SYMBOL, fn_name="py_send_enter", pid=pid)
            self._bpf.attach_uretprobe(name=path, sym=SYMBOL, fn_name="py_send_return", pid=pid)
        except Exception as exc:  # the process may be gone already
            log.debug("asyncio task probes not attached to pid %d: %s", pid, exc)
            self._detach_python(pid, path)
            return False
        self._python_probes[pid] = path
        return True

    def forget_process(self, pid: int) -> None:
        path = self._python_probes.pop(pid, None)
        if path is not None:
            self._detach_python(pid, path)

    def _detach_python(self, pid: int, path: str) -> None:
        from otelbpf.sources.python_tasks import SYMBOL

        for detach in (self._bpf.detach_uprobe, self._bpf.detach_uretprobe):
            try:
                detach(name=path, sym=SYMBOL, pid=pid)
            except Exception:  # noqa: BLE001 - not attached, or already gone with the process
                pass

    def mute(self, pid: int, fd: int, conn_id: int) -> None:
        """Stop copying a connection's payloads (it carries no protocol we know):
        its later syscalls cost the kernel a map lookup and nothing else."""
        table = self._bpf["conns"]
        key = table.Key(pid, fd)
        try:
            value = table[key]
        except KeyError:
            return
        if value.conn_id == conn_id:
            value.muted = 1
            table[key] = value

    # -- steady state ------------------------------------------------------

    def _on_record(self, _ctx, data, size) -> int:
        self._raw.append(ctypes.string_at(data, size))
        return 0  # returning None halves BCC's callback rate (DESIGN.md)

    def read(self) -> list[Event]:
        """Drain what the kernel submitted since the last call; never blocks."""
        self._bpf.ring_buffer_consume()
        if not self._raw:
            return []
        raw, self._raw = self._raw, []
        now = time.monotonic()
        if now - self._last_clock_sync > 10:
            self.decoder.clock_offset_ns = monotonic_to_realtime_offset()
            self._last_clock_sync = now
        events = self.decoder.decode(raw)
        for event in events:
            if type(event) is ConnOpen and event.family == 0:
                procfs.fill_tuple_from_proc(event)
        return events

    def kernel_stats(self) -> dict[str, int]:
        """Counters kept in the kernel (summed over CPUs)."""
        table = self._bpf["stats"]
        return {
            "lost": int(table.sum(ctypes.c_int(STAT_LOST)).value),
            "io_map_full": int(table.sum(ctypes.c_int(STAT_IO_MAP_FULL)).value),
            "no_tuple": int(table.sum(ctypes.c_int(STAT_NO_TUPLE)).value),
        }

    def close(self) -> None:
        for pid in list(self._python_probes):
            self.forget_process(pid)
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
