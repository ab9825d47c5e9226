"""Cross-node trace context, the kernel side's user-space half (docs/cross-node.md).

bpf/propagate.c fixes the ids of each request at the moment it is read or
written and puts them on the wire; this module decides whether it runs and
how, and does what only user space can:

* :data:`MODES` and :func:`plan`: ``off``, ``tcp`` (the default: a TCP option
  on each request's first segment, OBI's layout), ``headers`` (a
  ``traceparent`` header added to plaintext HTTP/1 requests) or ``all``,
  against what this kernel offers; :class:`PropagationPlan` carries the
  answer, the -D flags (struct tcp_sock's offsets from BTF) and, for a mode
  asked for and not possible, why;
* :class:`KernelPropagation`: attaches the cgroup sock_ops program through a
  BPF link (gone with the agent, however it ends), the header-scan program
  behind the socket receive tracepoint, and tells the kernel which endpoints
  traced processes listen on (their accepted sockets read options);
* :func:`checks`: what ``otelbpf doctor`` says about it.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from otelbpf.host import procfs
from otelbpf.host.checks import INFO, OK, WARN, Check
from otelbpf.sources import bpfsys, btf

log = logging.getLogger("otelbpf.propagation")

#: bpf/common.h's PROPAGATION bits.
PROP_TCP = 1
PROP_HEADERS = 2
#: bpf/common.h: a traced_tgids bit, the process has connected a TCP socket (it calls out).
USES_CALLS = 0x20
#: The modes, as ``--propagation`` and the Helm value take them, and what each turns on.
MODES = {"off": 0, "tcp": PROP_TCP, "headers": PROP_HEADERS, "all": PROP_TCP | PROP_HEADERS}
#: Only the kernel's own TCP header-option hooks touch the wire, and only on traced
#: processes' requests; headers need a sockmap (docs/cross-node.md, "Which mode").
DEFAULT_MODE = "tcp"
#: OTELBPF_PROPAGATION overrides the default (not an explicit --propagation); so does
#: OTELBPF_PROPAGATION_CGROUP for the cgroup (the DaemonSet's doctor init container reads both).
MODE_ENV = "OTELBPF_PROPAGATION"
CGROUP_ENV = "OTELBPF_PROPAGATION_CGROUP"

TRACEFS = Path("/sys/kernel/tracing")
#: The tracepoint a client's request start is taken at: before any byte of the send is queued.
SENDMSG_TRACEPOINT = "tcp/tcp_sendmsg_locked"
SENDMSG_ARGS = ["const struct sock *", "const struct msghdr *", "const struct sk_buff *", "int"]
#: bpf_get_current_pid_tgid() in sock_ops programs (the connecting process at TCP_CONNECT_CB).
MIN_KERNEL_PID_IN_SOCK_OPS = (6, 10)


def default_mode() -> str:
    wanted = os.environ.get(MODE_ENV, "").strip().lower()
    return wanted if wanted in MODES else DEFAULT_MODE


def _in_own_cgroup_namespace() -> bool:
    """Does this process see a cgroup namespace of its own (a container's), other than
    the host's? (/proc/1 is the host's init in a pod with hostPID.)"""
    try:
        return os.readlink("/proc/self/ns/cgroup") != os.readlink("/proc/1/ns/cgroup")
    except OSError:
        return False


def cgroup2_root(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or
    ``/sys/fs/cgroup/unified`` on hybrid hosts), or None."""
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            parts = left.split()
            if len(parts) > 4 and parts[3] == "/":
                return parts[4]
    return None


def _kernel_version() -> tuple[int, int]:
    release = os.uname().release.split(".")
    try:
        return int(release[0]), int("".join(ch for ch in release[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return 0, 0


@dataclass(frozen=True)
class PropagationPlan:
    """What runs: ``bits`` of PROP_TCP / PROP_HEADERS (0: nothing), against ``wanted``."""

    wanted: str
    bits: int
    #: why a part asked for is off (one line each)
    reasons: tuple[str, ...] = ()
    write_seq_offset: int = 0
    copied_seq_offset: int = 0
    #: the cgroup whose sockets the sock_ops program sees (the v2 root: every process)
    cgroup: str = ""

    @property
    def active(self) -> bool:
        return self.bits != 0

    @property
    def mode(self) -> str:
        return next(name for name, bits in MODES.items() if bits == self.bits)

    def cflags(self) -> list[str]:
        if not self.bits:
            return ["-DPROPAGATION=0"]
        return [
            f"-DPROPAGATION={self.bits}",
            f"-DTCP_WRITE_SEQ_OFF={self.write_seq_offset}",
            f"-DTCP_COPIED_SEQ_OFF={self.copied_seq_offset}",
        ]

    def describe(self) -> str:
        if self.wanted == "off":
            return "off (--propagation off): nothing is written to the wire"
        what = {
            "tcp": "a TCP option (kind 25, OBI's layout) on each traced request's first segment",
            "headers": "a traceparent header in plaintext HTTP/1 requests that carry none",
            "all": "a traceparent header in plaintext HTTP/1 requests and a TCP option (kind 25) on every request",
        }
        text = f"{self.mode}: {what[self.mode]}" if self.bits else "off"
        if self.bits:
            text += f"; sock_ops on cgroup {self.cgroup}"
        if self.reasons:
            text += f" ({self.wanted} asked: " + "; ".join(self.reasons) + ")"
        return text


def _tcp_unavailable(btf_path: str) -> tuple[str | None, int, int]:
    """Why the TCP option cannot run here (None: it can), and struct tcp_sock's offsets."""
    if _kernel_version() < MIN_KERNEL_PID_IN_SOCK_OPS:
        return (
            f"Linux {'.'.join(map(str, _kernel_version()))} < 6.10: a sock_ops program cannot tell the connecting"
            " process (bpf_get_current_pid_tgid), so it could not keep to traced processes",
            0,
            0,
        )
    if not (TRACEFS / "events" / SENDMSG_TRACEPOINT).is_dir():
        return f"no {SENDMSG_TRACEPOINT} tracepoint (Linux >= 6.11): a request's start cannot be seen before it is sent", 0, 0
    try:
        types = btf.load(btf_path)
        args = types.raw_tracepoint_args("tcp_sendmsg_locked")
        if args != SENDMSG_ARGS:
            return f"tcp_sendmsg_locked takes ({', '.join(args)}), not ({', '.join(SENDMSG_ARGS)})", 0, 0
        write_seq, write_size = types.member("tcp_sock", "write_seq").byte_field()
        copied_seq, copied_size = types.member("tcp_sock", "copied_seq").byte_field()
    except btf.BtfError as exc:
        return f"no BTF for it: {exc}", 0, 0
    if write_size != 4 or copied_size != 4:
        return "struct tcp_sock's write_seq/copied_seq are not 4 bytes", 0, 0
    return None, write_seq, copied_seq


def plan(wanted: str, cgroup: str | None = None, btf_path: str = btf.VMLINUX) -> PropagationPlan:
    """What ``wanted`` (a key of :data:`MODES`) becomes on this host."""
    if wanted not in MODES:
        raise ValueError(f"--propagation {wanted!r}: expected one of {', '.join(MODES)}")
    bits = MODES[wanted]
    if not bits:
        return PropagationPlan(wanted, 0)
    reasons = []
    cgroup = cgroup or os.environ.get(CGROUP_ENV) or None
    if cgroup is None and _in_own_cgroup_namespace():
        return PropagationPlan(wanted, 0, (
            "this agent sees its container's cgroup namespace, not the node's: mount the node's cgroup v2"
            " hierarchy and give --propagation-cgroup (the Helm chart does)",
        ))  # fmt: skip
    root = cgroup or cgroup2_root()
    if root is None or not os.path.isdir(root):
        return PropagationPlan(wanted, 0, (f"no cgroup v2 hierarchy at {cgroup or 'any mount'}: nowhere to attach sock_ops",))
    problem, write_seq, copied_seq = _tcp_unavailable(btf_path)
    if problem:  # the TCP option and the headers both take the request's ids there
        return PropagationPlan(wanted, 0, (problem,))
    if bits & PROP_HEADERS:
        bits &= ~PROP_HEADERS
        reasons.append(HEADERS_UNAVAILABLE)
    return PropagationPlan(wanted, bits, tuple(reasons), write_seq, copied_seq, root)


#: Why ``headers`` does not run (bpf/propagate.c writes no header yet).
HEADERS_UNAVAILABLE = "the traceparent header is not written by this build (needs an sk_msg program on a sockmap)"


@dataclass
class KernelPropagation:
    """The parts of propagation user space attaches once the capture program is
    loaded (:meth:`attach`), feeds while it runs (:meth:`watch`) and detaches
    (:meth:`close`)."""

    bpf: object
    plan: PropagationPlan
    #: the socket receive hook is a raw tracepoint (else the classic one)
    raw_receive: bool
    _links: list[int] = field(default_factory=list)

    def attach(self) -> None:
        from bcc import BPF

        # the header scan first: the receive tracepoint tail-calls it once the sock_ops program can act
        scan = self.bpf.load_func(b"prop_header_scan", BPF.RAW_TRACEPOINT if self.raw_receive else BPF.TRACEPOINT)
        self.bpf["prop_after_receive"][ctypes.c_int(0)] = ctypes.c_int(scan.fd)
        sock_ops = self.bpf.load_func(b"prop_sock_ops", BPF.SOCK_OPS)
        cgroup_fd = os.open(self.plan.cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._links.append(bpfsys.link_cgroup(sock_ops.fd, cgroup_fd))
        finally:
            os.close(cgroup_fd)

    def watch(self, pid: int) -> int:
        """What the kernel cannot see of a process older than the agent: the
        endpoints it listens on (the connections they accept read options; newer
        listeners the kernel sees itself), and whether it already calls out (its
        requests' headers are then read from the first: bpf/propagate.c,
        USES_CALLS). Returns how many listeners."""
        ends = procfs.tcp_ends(pid)
        table = self.bpf["prop_listeners"]
        for family, address, port in ends.listening:
            key = table.Key()
            key.family = family
            key.port = port
            ctypes.memmove(ctypes.addressof(key.addr), address, len(address))
            table[key] = ctypes.c_uint32(pid)
        if ends.outgoing:
            traced = self.bpf["traced_tgids"]
            try:
                bits = traced[ctypes.c_uint(pid)].value
                traced[ctypes.c_uint(pid)] = ctypes.c_ubyte(bits | USES_CALLS)
            except (KeyError, IndexError):  # a pid past the array: never traced
                pass
        return len(ends.listening)

    def close(self) -> None:
        links, self._links = self._links, []
        for link in links:
            try:
                os.close(link)
            except OSError:
                pass


def checks(wanted: str | None = None) -> list[Check]:
    """``otelbpf doctor``'s lines: what ``--propagation`` does on this node."""
    wanted = wanted or default_mode()
    result = plan(wanted)
    name = "cross-node context"
    if not result.active:
        status = INFO if wanted == "off" else WARN
        fix = "" if wanted == "off" else "traces stop at this node's edge; see docs/cross-node.md"
        return [Check(name, status, result.describe(), fix)]
    found = [Check(name, OK if not result.reasons else WARN, result.describe())]
    try:
        others = [p for p in bpfsys.cgroup_programs(result.cgroup) if p.name != "prop_sock_ops"]
    except OSError as exc:
        others = []
        found.append(Check("cgroup sock_ops", INFO, f"not checked ({exc})"))
    if others:
        names = ", ".join(p.name or f"#{p.id}" for p in others)
        found.append(Check(
            "cgroup sock_ops",
            WARN,
            f"other sock_ops programs on {result.cgroup}: {names}. Ours runs beside them; an OBI/Beyla agent writing"
            " the same option kind first makes ours count otelbpf.propagation.contexts.no_space",
            "run one propagating agent per node",
        ))
    found.append(_sockmap_check())
    return found


def _sockmap_check() -> Check:
    """Programs on sockmaps (Cilium's socket LB and L7 redirection, OBI's header injector): the
    TCP option needs none and leaves them be; a traceparent header would need one."""
    try:
        sockmap = bpfsys.loaded_programs((bpfsys.BPF_PROG_TYPE_SK_MSG, bpfsys.BPF_PROG_TYPE_SK_SKB))
    except OSError as exc:
        return Check("sockmap programs", INFO, f"not checked ({exc})")
    if not sockmap:
        return Check("sockmap programs", OK, "none loaded on this node")
    names = ", ".join(sorted({p.name or f"#{p.id}" for p in sockmap}))
    return Check(
        "sockmap programs",
        INFO,
        f"loaded by another tool (a CNI such as Cilium, or OBI): {names}. The TCP option uses no sockmap and does not"
        " touch them; this is why the traceparent header, which would need one, is not written",
    )
