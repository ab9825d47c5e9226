"""`otelbpf doctor`: can this host trace? Every check says what it found and,
when something is missing, what to do about it.

`otelbpf run` runs the same checks and refuses to start on a failure, so a
missing piece is reported once, clearly, instead of as a BCC traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import os
import platform
import subprocess
import sys
import threading
from pathlib import Path

from otelbpf import bundled
from otelbpf.host import procfs
from otelbpf.host.checks import FAIL, INFO, OK, WARN, Check, effective_capabilities
from otelbpf.profiles import checks as profiles_checks
from otelbpf.sources import crossnode
from otelbpf.sources.ebpf_layout import regs_cflags
from otelbpf.sources.ebpf_program import (
    BPF_DIR,
    REGS_READ_ENV,
    SOCK_TRACEPOINTS_ENV,
    CaptureError,
    plan_sock_capture,
    regs_read_choice,
)
from otelbpf.sources.tls import NOT_COVERED, REQUIRED, TLS_FUNCTIONS, flavour, system_libssl_paths
from otelbpf.sources.uprobes import resolve_symbols

TRACEFS = Path("/sys/kernel/tracing")

#: Per-syscall tracepoints bpf/socket.c attaches for UDP capture (`run --udp`) only.
SYSCALL_TRACEPOINTS = [
    "syscalls/sys_enter_sendmmsg",
    "syscalls/sys_enter_recvmmsg",
    "syscalls/sys_exit_recvfrom",
    "syscalls/sys_exit_recvmsg",
    "syscalls/sys_exit_recvmmsg",
]
#: Tracepoints the capture program attaches (bpf/capture.c and its families).
REQUIRED_TRACEPOINTS = (
    ["sock/sock_recv_length", "sock/sock_send_length", "sock/inet_sock_set_state"]
    + ["sched/sched_process_fork", "sched/sched_process_exec", "sched/sched_process_exit"]
)
#: The syscall numbers and register layout bpf/capture.c is written for.
SUPPORTED_MACHINES = ("x86_64", "aarch64")

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
BPF_MAP_CREATE = 0
BPF_MAP_TYPE_RINGBUF = 27
SYS_BPF = {"x86_64": 321, "aarch64": 280}


def _is_dir(path: Path) -> bool:
    """Like Path.is_dir, but False (not an exception) when we may not look."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False


def kernel_version() -> tuple[int, int]:
    release = platform.release()
    parts = release.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


def check_kernel() -> Check:
    release = platform.release()
    major_minor = kernel_version()
    if major_minor < (6, 3):
        return Check(
            "kernel",
            FAIL,
            f"{release}: otelbpf needs Linux >= 6.3 (sock:sock_recv_length/sock_send_length tracepoints)",
            "run on a newer kernel",
        )
    return Check("kernel", OK, release)


def check_privileges() -> Check:
    caps = effective_capabilities()
    if os.geteuid() == 0 and caps & (1 << CAP_SYS_ADMIN):
        return Check("privileges", OK, "root with CAP_SYS_ADMIN")
    if caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON):
        return Check("privileges", OK, "CAP_BPF and CAP_PERFMON")
    return Check(
        "privileges",
        FAIL,
        "not root and missing CAP_BPF/CAP_PERFMON",
        "run as root (sudo), or in a privileged container / DaemonSet with CAP_BPF, CAP_PERFMON, CAP_SYS_RESOURCE",
    )


#: Reading another user's /proc/PID/environ needs the file mode overridden
#: (DAC_READ_SEARCH, or DAC_OVERRIDE); /proc/PID/exe passes the ptrace read check
#: (SYS_PTRACE). Root without them still traces, but not who is who.
IDENTITY_READS = (
    ("environ", "OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES", "DAC_READ_SEARCH"),
    ("exe", "process.executable.path", "SYS_PTRACE"),
)


def _other_users_process(me: int) -> tuple[int, int] | None:
    """(pid, uid) of a user-space process owned by another user, if any."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
            if uid != me and Path(f"/proc/{entry}/cmdline").read_bytes():  # kernel threads have none
                return int(entry), uid
        except OSError:
            continue
    return None


def _read_proc(pid: int, what: str) -> None:
    if what == "exe":
        os.readlink(f"/proc/{pid}/exe")
    else:
        Path(f"/proc/{pid}/{what}").read_bytes()


def check_process_identity(sample: tuple[int, int] | None = None) -> Check:
    """Resources need each traced process's environment and executable:
    reading them for processes of other users is what a capability-mode
    DaemonSet most often lacks, while tracing still works."""
    name = "process identity"
    sample = sample or _other_users_process(os.geteuid())
    if sample is None:
        return Check(name, INFO, "no process of another user to try")
    pid, uid = sample
    lost, missing = [], []
    for what, gives, capability in IDENTITY_READS:
        try:
            _read_proc(pid, what)
        except FileNotFoundError:
            return Check(name, INFO, f"pid {pid} exited while checking")
        except OSError:
            lost.append(f"/proc/PID/{what} ({gives})")
            missing.append(capability)
    if not lost:
        return Check(name, OK, f"reads other users' /proc/PID/environ and /exe (tried pid {pid}, uid {uid})")
    return Check(
        name,
        WARN,
        f"cannot read other users' {' and '.join(lost)}: tried pid {pid}, uid {uid}",
        f"missing capability {', '.join(missing)}: add it (the Helm chart's capability mode does), or run privileged",
    )


def check_bpf_sources() -> Check:
    """BCC compiles bpf/*.c at start-up: the checkout's, or those an installed wheel
    put under <prefix>/share/otelbpf/bpf (otelbpf/bundled.py), or OTELBPF_BPF_DIR's."""

    if _exists(BPF_DIR / "capture.c"):
        return Check("probe sources", OK, str(BPF_DIR))
    return Check("probe sources", FAIL, f"{BPF_DIR / 'capture.c'} missing: nothing to compile", bundled.BPF.hint())


def check_fast_path() -> Check:
    """The compiled HTTP/1 fast path: built and matching the modules imported. Without it
    every request goes through the reference parsers, at several times the CPU."""
    from otelbpf import fastpath

    if fastpath.available():
        return Check("fast path", OK, "HTTP/1 " + fastpath.describe())
    return Check("fast path", WARN, "HTTP/1 " + fastpath.describe(), "make install (rebuilds the compiled modules)")


def check_btf() -> Check:
    if _exists(Path("/sys/kernel/btf/vmlinux")):
        return Check("btf", OK, "/sys/kernel/btf/vmlinux present")
    return Check(
        "btf",
        FAIL,
        "no /sys/kernel/btf/vmlinux: bpf_get_current_task_btf() (socket capture) needs kernel BTF",
        "a kernel built with CONFIG_DEBUG_INFO_BTF=y",
    )


def ensure_tracefs() -> Check:
    if _is_dir(TRACEFS / "events"):
        return Check("tracefs", OK, f"mounted at {TRACEFS}")
    if os.path.ismount(TRACEFS):
        return Check("tracefs", FAIL, f"mounted at {TRACEFS} but not readable by this user", "run as root")
    try:
        TRACEFS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tracefs", "tracefs", str(TRACEFS)], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("tracefs", FAIL, f"not mounted and mounting failed: {exc}", f"mount -t tracefs tracefs {TRACEFS}")
    if _is_dir(TRACEFS / "events"):
        return Check("tracefs", OK, f"was not mounted: mounted it at {TRACEFS}")
    return Check("tracefs", FAIL, "mounted but has no events/", "check CONFIG_FTRACE / CONFIG_TRACEPOINTS")


def check_tracepoints() -> list[Check]:
    missing = [tp for tp in REQUIRED_TRACEPOINTS if not _is_dir(TRACEFS / "events" / tp)]
    checks = []
    if platform.machine() not in SUPPORTED_MACHINES:
        checks.append(
            Check("syscall registers", FAIL, f"{platform.machine()}: syscall numbers not mapped", "run on x86_64 or aarch64")
        )
    if missing:
        checks.append(
            Check(
                "sock/sched tracepoints",
                FAIL,
                "missing: " + ", ".join(missing),
                "sock_recv_length/sock_send_length need Linux >= 6.3",
            )
        )
    else:
        checks.append(Check("sock/sched tracepoints", OK, "sock_recv_length, sock_send_length, inet_sock_set_state, sched_*"))
    udp_missing = [tp for tp in SYSCALL_TRACEPOINTS if not _is_dir(TRACEFS / "events" / tp)]
    if udp_missing:
        checks.append(
            Check(
                "UDP capture (--udp)",
                WARN,
                "missing: " + ", ".join(udp_missing),
                "the kernel needs CONFIG_FTRACE_SYSCALLS=y for --udp; TCP and Unix capture do not need it",
            )
        )
    else:
        checks.append(Check("UDP capture (--udp)", OK, "syscalls:sys_enter_*mmsg, sys_exit_recv* present"))
    return checks


#: Loaded (not attached) by check_task_regs: the helpers the socket capture
#: calls inside sock:sock_*_length to find the syscall's user registers, and
#: the register read it uses (bpf/common.h LOAD_REG64: a plain load from the
#: BTF-typed pointer, or a bpf_probe_read_kernel call with REGS_PROBE_READ=1).
TASK_REGS_PROBE = r"""
TRACEPOINT_PROBE(sock, sock_send_length)
{
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    void *regs = (void *)bpf_task_pt_regs(task);
#if REGS_PROBE_READ
    __u64 value = 0;
    bpf_probe_read_kernel(&value, sizeof(value), regs + REG_ARG0_OFF);
#else
    __u64 value = *(volatile __u64 *)(regs + REG_ARG0_OFF);
#endif
    return value == 1;
}
"""


def _load_task_regs_probe(probe_read: bool) -> str | None:
    """Load TASK_REGS_PROBE; None when it loads, else the error's first line."""
    from bcc import BPF  # here: bcc may be absent (check_bcc says so), and it loads LLVM

    cflags = regs_cflags(platform.machine()) + [f"-DREGS_PROBE_READ={int(probe_read)}"]
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            bpf = BPF(text=TASK_REGS_PROBE.encode(), cflags=cflags)
            bpf.load_func(b"tracepoint__sock__sock_send_length", BPF.TRACEPOINT)
            bpf.cleanup()
    except Exception as exc:  # noqa: BLE001 - BCC raises plain Exception
        return str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return None


def check_task_regs() -> Check:
    """Load a tiny sock_send_length program using bpf_get_current_task_btf()
    and bpf_task_pt_regs() and reading a register the way the capture does:
    the socket capture reads the syscall's fd and buffers through them. Needs
    root and BCC; skipped (info) otherwise."""

    name = "task pt_regs helpers"
    if not _is_dir(TRACEFS / "events/sock/sock_send_length"):
        return Check(name, FAIL, "no sock:sock_send_length tracepoint to use them from", "needs Linux >= 6.3")
    try:
        import bcc  # noqa: F401
    except ImportError:
        return Check(name, INFO, "not checked (bcc not importable)")
    if os.geteuid() != 0 and not effective_capabilities() & (1 << CAP_BPF):
        return Check(name, INFO, "not checked (needs BPF privileges)")
    try:
        plain = _load_task_regs_probe(probe_read=False)
        probe = _load_task_regs_probe(probe_read=True) if plain else None
    except ValueError as exc:  # no register layout for this machine
        return Check(name, FAIL, str(exc))
    try:
        chosen = regs_read_choice()  # the same reading `run` makes
    except CaptureError as exc:
        return Check(name, FAIL, str(exc), f"unset {REGS_READ_ENV}, or set it to load or probe")
    if plain is None:
        how = "registers read by plain loads (the verifier checks them against BTF)"
        if chosen == "probe":
            how = f"{REGS_READ_ENV}=probe: registers read by bpf_probe_read_kernel (plain loads would work, and cost less)"
        return Check(name, OK, f"bpf_get_current_task_btf + bpf_task_pt_regs load in a sock_send_length program; {how}")
    if probe is None:
        if chosen == "load":
            return Check(
                name,
                FAIL,
                f"{REGS_READ_ENV}=load, but this verifier refuses plain loads from bpf_task_pt_regs ({plain})",
                f"unset {REGS_READ_ENV} or set it to probe",
            )
        return Check(
            name,
            WARN,
            f"this verifier refuses plain loads from bpf_task_pt_regs ({plain}); `run` falls back to"
            " bpf_probe_read_kernel (one helper call per register read: a little more BPF time per socket event)",
            f"set {REGS_READ_ENV}=probe to skip the first try at start-up",
        )
    return Check(
        name,
        FAIL,
        f"bpf_get_current_task_btf()/bpf_task_pt_regs() unusable from a tracepoint program: {probe}",
        "needs Linux >= 5.15 with BTF (CONFIG_DEBUG_INFO_BTF=y, /sys/kernel/btf/vmlinux). No fallback in this"
        " version: without them the socket tracepoints cannot see the syscall's fd and buffers, so payloads"
        " cannot be captured (the older raw_syscalls sys_enter/sys_exit design could, at 0.68-0.87x throughput)",
    )


def check_unix_pairing() -> Check:
    if _is_dir(TRACEFS / "events/sock/sk_data_ready"):
        return Check("unix socket pairing", OK, "sock:sk_data_ready present")
    return Check(
        "unix socket pairing",
        WARN,
        "no sock:sk_data_ready tracepoint (Linux >= 6.6): Unix-socket client and server spans are not linked",
    )


def check_sock_capture() -> Check:
    """Which tracepoints payload capture will use: the raw sock_*_length ones
    (struct sock's family/protocol offsets from this kernel's BTF), or the
    classic ones, which cost every socket call on the host a trace record.
    `run` also checks the offsets on live sockets at start and falls back
    to the classic ones (logged) if they read wrong."""

    plan = plan_sock_capture()
    if plan.raw:
        return Check("socket capture path", OK, plan.describe())
    if plan.reason.startswith(SOCK_TRACEPOINTS_ENV):
        return Check("socket capture path", INFO, plan.describe())
    return Check(
        "socket capture path",
        WARN,
        plan.describe(),
        "works, but untraced processes pay for the classic tracepoints' records; a kernel with BTF"
        " (CONFIG_DEBUG_INFO_BTF=y) lets otelbpf use raw tracepoints",
    )


def check_uprobes() -> Check:
    if _exists(Path("/sys/bus/event_source/devices/uprobe")) or _exists(TRACEFS / "uprobe_events"):
        return Check("uprobes", OK, "available (TLS, CUDA and NCCL probes use them)")
    return Check("uprobes", WARN, "not available: TLS/CUDA/NCCL probes will be off", "CONFIG_UPROBE_EVENTS=y")


def check_tls() -> list[Check]:
    """Which TLS libraries `run` can take plaintext from (the host's libssl,
    probed once for every process; other copies are found per process), and
    which it cannot yet."""

    checks = []
    for path in system_libssl_paths():
        symbols = resolve_symbols(path, [name for name, _e, _r in TLS_FUNCTIONS if name != "SSL_free"])
        names = [name for symbol in symbols for name in symbol.names]
        if all(name in names for name in REQUIRED):
            detail = f"{os.path.basename(path)} ({flavour(path, dict.fromkeys(names))}) at {path}: probes {', '.join(names)}"
            checks.append(Check("TLS plaintext", OK, detail))
        else:
            checks.append(Check("TLS plaintext", WARN, f"{path} exports no SSL_read/SSL_write: not probed"))
    if not checks:
        checks.append(
            Check("TLS plaintext", INFO, "no libssl in the linker cache; a libssl a process maps from elsewhere is found per process")
        )
    checks.append(Check("TLS plaintext", INFO, "not covered yet: " + NOT_COVERED + _grpcio_boringssl()))
    return checks


def check_gpu(pids=None) -> list[Check]:
    """Which running processes map CUDA runtime/driver or NCCL libraries `run`
    would probe, per process and file (docs/gpu.md). Informational: a process
    that loads them later is found by `run` when it does."""
    from otelbpf.sources.gpu import LAUNCH_FUNCTIONS, survey  # here: it loads the GPU span semantics (~35 ms)

    found = survey(procfs.all_pids() if pids is None else pids)
    if not found:
        return [Check("GPU calls", INFO, "no running process maps libcudart, libcuda or libnccl (found per process by `run`)")]
    checks = []
    for pid, files in sorted(found.items()):
        for mapped, names in sorted(files.items()):
            launches = [n for n in names if n in LAUNCH_FUNCTIONS]
            detail = f"pid {pid} ({procfs.comm_of(pid) or '?'}): {mapped}: {len(names) - len(launches)} timeline calls"
            if launches:
                detail += f", kernel launches counted at {', '.join(launches)}"
            checks.append(Check("GPU calls", OK, detail))
    return checks


def _grpcio_boringssl() -> str:
    """Where grpcio's BoringSSL is, if grpcio is installed for this interpreter (it is not probed)."""

    try:
        spec = importlib.util.find_spec("grpc")
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    return f" (grpcio here: {next(iter(spec.submodule_search_locations))}/_cython)"


def check_kprobes() -> Check:
    if _exists(Path("/sys/bus/event_source/devices/kprobe")) or _exists(TRACEFS / "kprobe_events"):
        return Check("kprobes", INFO, "available (not used: otelbpf relies on tracepoints and uprobes only)")
    return Check("kprobes", INFO, "not available on this kernel: not needed, otelbpf uses tracepoints and uprobes only")


def _bpf_syscall(cmd: int, attr: ctypes.Array) -> int:
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        return -1
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))


def check_ringbuf() -> Check:
    """Create (and close) a BPF ring buffer map: proves both BPF and ringbuf work."""
    attr = (ctypes.c_uint32 * 32)()
    attr[0] = BPF_MAP_TYPE_RINGBUF  # map_type
    attr[1] = 0  # key_size
    attr[2] = 0  # value_size
    attr[3] = os.sysconf("SC_PAGE_SIZE") * 4  # max_entries: ring size
    fd = _bpf_syscall(BPF_MAP_CREATE, attr)
    if fd < 0:
        err = ctypes.get_errno()
        return Check(
            "ring buffer",
            FAIL,
            f"cannot create a BPF ring buffer map: {os.strerror(err)}",
            "needs Linux >= 5.8 and BPF privileges (root / CAP_BPF)",
        )
    os.close(fd)
    return Check("ring buffer", OK, "BPF_MAP_TYPE_RINGBUF works")


def check_bcc() -> Check:
    try:
        import bcc  # noqa: F401
    except ImportError:
        return Check(
            "bcc",
            FAIL,
            "python module bcc not importable",
            "run scripts/install.sh (Debian python3-bpfcc + a venv with --system-site-packages)",
        )
    version = getattr(bcc, "__version__", "") or "?"
    return Check("bcc", OK, f"bcc {version}")


def check_kernel_headers() -> Check:
    build = Path(f"/lib/modules/{platform.release()}/build")
    uts = build / "include/generated/utsrelease.h"
    if not _exists(build):
        return Check(
            "kernel headers",
            FAIL,
            f"{build} missing: BCC cannot compile the probes",
            "run scripts/install.sh (installs linux-headers-amd64 and links it as a fallback)",
        )
    try:
        text = uts.read_text()
        headers_release = text.split('"')[1]
    except (OSError, IndexError):
        headers_release = "?"
    if headers_release == platform.release():
        return Check("kernel headers", OK, f"exact ({headers_release})")
    return Check(
        "kernel headers",
        OK,
        f"fallback {headers_release} for {platform.release()} (safe: the probes never read kernel structs by header layout)",
    )


#: Shared-memory segments of DDS transports in /dev/shm, by name prefix.
DDS_SHM_PREFIXES = {
    "fastrtps_": "Fast DDS shared-memory transport",
    "fast_datasharing_": "Fast DDS data sharing",
    "iceoryx_": "iceoryx (Cyclone DDS shared memory)",
    "iox_": "iceoryx (Cyclone DDS shared memory)",
}


def check_dds_shared_memory(shm_dir: str = "/dev/shm") -> Check:
    """DDS samples that move through shared memory never cross a socket: say
    so before the user wonders where their ROS 2 topics went (docs/ros2-dds.md)."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return Check("dds shared memory", INFO, f"{shm_dir} not readable")
    found = sorted({label for name in names for prefix, label in DDS_SHM_PREFIXES.items() if name.startswith(prefix)})
    if not found:
        return Check("dds shared memory", OK, "no DDS shared-memory segments: DDS samples cross sockets (trace with --udp)")
    return Check(
        "dds shared memory",
        WARN,
        f"in use on this host: {', '.join(found)}; samples between local processes bypass sockets and are not traced",
        "configure DDS for UDP transport (docs/ros2-dds.md)",
    )


def run_checks() -> list[Check]:
    checks = [check_kernel(), check_privileges(), check_btf(), ensure_tracefs()]
    if checks[-1].status != FAIL:
        checks += check_tracepoints()
        checks += [check_task_regs(), check_sock_capture(), check_unix_pairing(), check_uprobes(), check_kprobes()]
        checks += check_tls()
        checks += check_gpu()
        checks += profiles_checks.run_checks()
        checks += crossnode.checks()
    checks += [check_ringbuf(), check_bcc(), check_bpf_sources(), check_kernel_headers(), check_fast_path()]
    checks += [check_process_identity(), check_dds_shared_memory()]
    return checks


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL]


def format_report(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"  [{c.status:>4}] {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in (FAIL, WARN):
            lines.append(f"         {'':<{width}}  -> {c.fix}")
    verdict = "tracing can work on this host" if not failures(checks) else "tracing cannot work until the FAIL items are fixed"
    return "otelbpf doctor\n" + "\n".join(lines) + f"\n{verdict}"


def preflight() -> bool:
    """The doctor's checks, silently when all pass; the report when one fails.

    They run in a child process when this one has a single thread (as at start-up): a
    test BPF compile and a search of every mapped library raise the memory high-water
    mark by ~60 MB that the agent would otherwise keep as its peak RSS for life
    (bench/README.md, "Agent memory"). What the checks change on the host (tracefs
    mounted) outlives the child."""
    if threading.active_count() > 1 or not hasattr(os, "fork"):
        return _preflight_here()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: report, and exit without running the parent's exit handlers
        ok = False
        try:
            ok = _preflight_here()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if ok else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _preflight_here() -> bool:
    checks = run_checks()
    if failures(checks):
        print(format_report(checks), file=sys.stderr)
        print("otelbpf: refusing to start (see above)", file=sys.stderr)
        return False
    return True
