"""The kernel side of profiles, seen from user space: bpf/profile.c's
programs attached, its ring drained, its CPython maps kept filled.

The eBPF source (otelbpf/sources/ebpf.py) compiles bpf/profile.c into its one
BPF object with :meth:`ProfileConfig.cflags`, then hands the loaded object to
a :class:`ProfileSampler`. Both follow the table of profile kinds
(otelbpf/profiles/kinds.py): ``ProfileConfig`` has a field per kind setting,
its flags are each kind's, and the sampler

- attaches what each kind asked for needs attached: ``profile_on_cpu`` on the
  software CPU-clock perf event on every CPU at ``hz`` (the hardware PMU is
  absent on most VMs and containers; the CPU clock is what is there
  everywhere); ``sched_switch`` for off-CPU time is compiled in only when
  asked (it runs at every context switch of the host) and attached by BCC;
- tells the kernel, per traced CPython process, where its frames are
  (``py_procs``: offsets for its version) and where each thread's state is:
  in the thread's own TLS, once proven on the process's listed threads
  (otelbpf/profiles/python/thread_local.py: a thread's first sample then has its Python
  frames, a thread per request included), else from a tid map (``py_tstates``)
  filled from the interpreter's thread list, re-read when a sample reports a
  thread it does not know: at once for a thread not looked for yet, once a
  second for threads the interpreter did not list (native threads);
- drains ``profile_events`` into :class:`~otelbpf.profiles.records.StackSampleEvent`
  and :class:`~otelbpf.profiles.records.OffCpuEnd` events.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import time
from dataclasses import dataclass, field, make_dataclass
from typing import ClassVar

from otelbpf.profiles.kinds import PROFILE_KINDS, ProfileKind
from otelbpf.profiles.records import (
    PF_PY_NO_THREAD,
    PROFILE_INFO_SIZE,
    PROFILE_STACK_BYTES,
    ProfileRecordDecoder,
    StackSampleEvent,
)
from otelbpf.sources.ebpf_layout import HEADER

log = logging.getLogger("otelbpf.profiles")

#: The register copy (bpf/profile.c) and the unwinder's register table are x86-64's.
SUPPORTED = platform.machine() == "x86_64"
#: A thread list is re-read at most this often per process when samples name
#: threads the kernel has no state for (and at every library re-scan).
THREAD_RESCAN_S = 1.0
#: ... but a thread not looked for yet is looked for at once (at most this often per process).
NEW_THREAD_RESCAN_S = 0.005
#: Threads per process remembered as not listed by the interpreter (native threads).
MAX_UNLISTED_THREADS = 4096
#: A kernel stack is deleted from the stack map this many drains, and at least
#: KERNEL_STACK_HOLD_S seconds, after the last sample that named it.
KERNEL_STACK_HOLD_DRAINS = 3
KERNEL_STACK_HOLD_S = 1.0
#: No kernel stack read (a drain that found the ring empty).
NO_STACKS: dict[int, tuple[int, ...]] = {}
#: Where Python thread states are read from (tstate_choice).
TSTATE_ENV = "OTELBPF_PY_TSTATE"
#: A process whose TLS could not be proven (no thread listed yet: it was starting) is tried
#: again at its next thread-list reads, this many times.
TLS_ATTEMPTS = 8


@dataclass(kw_only=True)
class ProfileOptions:
    """What every profile kind shares. ``ProfileConfig`` adds one field per setting of each
    kind of the table (otelbpf/profiles/kinds.py): ``hz``, ``off_cpu``, ``gpu``... are
    declared there, with their defaults and switches."""

    #: Ring for stack samples, MiB (a power of two; --profile-ring-mb). 4: a sample takes at
    #: most ~34 KiB, so ~120 fit, seconds of two busy CPUs at 19 Hz; 16 cost 12 MB more RSS
    #: and saved no sample in bench/rss_breakdown.py's runs.
    ring_mb: int = 4
    #: Read CPython frames in the kernel.
    python: bool = True
    #: Publish thread -> span in the pinned traces_ctx_v1 map (bpf/tracectx.c).
    publish_trace_context: bool = False

    #: The kinds this configuration's class was built from (profile_config_class).
    KINDS: ClassVar[tuple[ProfileKind, ...]] = ()

    @classmethod
    def from_args(cls, args, **shared) -> "ProfileOptions":
        """The configuration the command line asks for: every kind's settings read from
        ``args`` (argparse's namespace), the shared fields given."""
        kinds = {setting.field: setting.value_from(args) for kind in cls.KINDS for setting in kind.settings}
        return cls(**shared, **kinds)

    def validate(self) -> None:
        for kind in self.KINDS:
            for setting in kind.settings:
                problem = setting.check(getattr(self, setting.field)) if setting.check is not None else None
                if problem:
                    raise ValueError(problem)
        if self.ring_mb < 1 or self.ring_mb & (self.ring_mb - 1):
            raise ValueError(f"--profile-ring-mb must be a power of two >= 1, got {self.ring_mb}")

    @property
    def enabled(self) -> bool:
        """Profiles on: the on-CPU sampler runs (``hz`` > 0), and every other kind rides on it."""
        return self.hz > 0 and SUPPORTED

    def kinds_on(self) -> tuple[ProfileKind, ...]:
        """The kinds this configuration asks for (none when profiles are off)."""
        if not self.enabled:
            return ()
        return tuple(kind for kind in self.KINDS if kind.enabled(self))

    def describe_unsupported(self) -> str | None:
        """Why profiles asked for are off on this machine, or None."""
        if self.hz > 0 and not SUPPORTED:
            return f"profiles: not supported on {platform.machine()} yet (x86-64 only): tracing without them"
        return None

    def cflags(self) -> list[str]:
        """The -D flags that compile bpf/profile.c in (nothing when profiles are off): the
        ring and scratch, then each kind's."""
        flags = ["-DPUBLISH_TRACE_CTX=1"] if self.publish_trace_context else []
        if not self.enabled:
            return flags
        pages = self.ring_mb * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
        flags += ["-DPROFILES=1", f"-DPROFILE_RING_PAGES={pages}", f"-DPROFILE_SLOTS={2 * _possible_cpus()}"]
        flags.append(f"-DTASK_FSBASE_OFFSET={task_fsbase_offset()}")
        for kind in self.KINDS:
            flags += kind.cflags(self)
        return flags

    def start(self, bpf, clock_offset_ns: int) -> "ProfileSampler":
        """The sampler, attached to the loaded capture program (sources.ebpf_program.SampledProbes)."""
        sampler = ProfileSampler(bpf, self, clock_offset_ns)
        sampler.attach()
        return sampler


def profile_config_class(kinds: tuple[ProfileKind, ...], name: str = "ProfileConfig") -> type:
    """A :class:`ProfileOptions` with one field per setting of ``kinds`` (keyword-only, with
    the setting's default), its ``KINDS`` the table it was built from."""
    fields = [(setting.field, type(setting.default), field(default=setting.default)) for kind in kinds for setting in kind.settings]
    declared = [field_name for field_name, _type, _default in fields]
    clashes = {n for n in declared if declared.count(n) > 1} | (set(declared) & set(ProfileOptions.__dataclass_fields__))
    if clashes:
        raise ValueError(f"profile kinds: settings {sorted(clashes)} are declared twice")
    doc = f"What profiles to take: the shared options and the settings of the kinds {[kind.name for kind in kinds]}."
    config = make_dataclass(name, fields, bases=(ProfileOptions,), kw_only=True, namespace={"KINDS": tuple(kinds), "__doc__": doc})
    config.__module__ = __name__
    return config


#: The agent's configuration: every kind of PROFILE_KINDS, e.g. ``ProfileConfig(hz=99, off_cpu=True)``.
ProfileConfig = profile_config_class(PROFILE_KINDS)


def task_fsbase_offset() -> int:
    """Where the kernel keeps a task's thread pointer (``task_struct.thread.fsbase``), from
    its BTF: BPF reads a thread's Python state from its TLS through it. -1 where unknown
    (no BTF): thread states then come from the interpreter's thread list only."""
    try:
        from otelbpf.sources import btf

        return btf.member_offset("task_struct", "thread.fsbase").offset
    except Exception as exc:  # noqa: BLE001 - BtfError, or no /sys/kernel/btf: the thread list still works
        log.info("profiles: no thread pointer offset (%s): Python threads are found from their interpreter's list", exc)
        return -1


def tstate_choice() -> tuple[bool, str | None]:
    """``OTELBPF_PY_TSTATE``: ``tls`` (the default: from the thread's TLS where it proves out),
    ``map`` (the interpreter's thread list only), or ``tls:VARIABLE`` (read that thread-local:
    tests use ``_Py_tss_tstate`` to drive the DTV path on 3.12/3.13). (use TLS, variable)."""
    value = os.environ.get(TSTATE_ENV, "tls").strip()
    if value == "map":
        return False, None
    if value.startswith("tls:"):
        return True, value[4:] or None
    return True, None


def _possible_cpus() -> int:
    """CPUs the kernel may bring up (the scratch slots are indexed by CPU id)."""
    try:
        text = open("/sys/devices/system/cpu/possible").read().strip()
    except OSError:
        return os.cpu_count() or 1
    highest = 0
    for part in text.split(","):
        highest = max(highest, int(part.split("-")[-1]))
    return highest + 1


class ProfileSampler:
    """Attached profile programs of one loaded BPF object."""

    def __init__(self, bpf, config: ProfileConfig, clock_offset_ns: int) -> None:
        self._bpf = bpf
        self.config = config
        self.decoder = ProfileRecordDecoder(clock_offset_ns)
        self._raw: list[bytes] = []
        #: reads the profile ring through its mapping (otelbpf.sources.ringbuf); None: BCC's callback
        #: (drain must then run at every agent drain)
        self.reader = None
        #: pid -> the CPython process description (runtime.PythonProcess), None when not Python / unknown
        self._python: dict[int, object] = {}
        #: pid -> tids whose thread state is in py_tstates
        self._tids: dict[int, set[int]] = {}
        self._thread_scan: dict[int, float] = {}
        #: pid -> tids a re-read looked for and did not find (native threads)
        self._unlisted: dict[int, set[int]] = {}
        #: pid -> where its threads' states are read from their TLS (otelbpf/profiles/python/thread_local.py);
        #: pid -> attempts left to find it
        self.tls: dict[int, object] = {}
        self._tls_attempts: dict[int, int] = {}
        self._use_tls, self._tls_variable = tstate_choice()
        #: kernel stacks read and not yet deleted from the stack map: id -> addresses,
        #: id -> (drain, monotonic time) it was last named
        self._held_stacks: dict[int, tuple[int, ...]] = {}
        self._stack_last_drain: dict[int, tuple[int, float]] = {}
        self._clock = time.monotonic
        self._drains = 0
        #: when the oldest held stack may be deleted (monotonic; inf: none held). EbpfSource.read
        #: calls drain only when the mapped ring holds something or this is due: a Python call
        #: per agent drain (~100 a second under traffic) cost ~3 us each on cold caches
        self.release_due = float("inf")
        #: this thread's CPU spent decoding samples (the profiler reports it: otelbpf.profiles.cpu_time)
        self.cpu_ns = 0
        #: CPUs that may fill the ring, read once: os.cpu_count() reads sysfs (~45 us) and
        #: unread_limit_s is asked before every sleep of the agent
        self._cpus = os.cpu_count() or 1
        #: the lowest unread limit of the kinds asked for (read before every sleep: computed once)
        self._kinds_limit_s = min(
            (kind.unread_limit_s for kind in config.kinds_on() if kind.unread_limit_s is not None),
            default=None,
        )
        self.counters = {"samples": 0, "malformed": 0, "python_processes": 0, "python_unknown_versions": 0, "thread_rescans": 0,
                         "python_tls_processes": 0}

    # -- start-up ---------------------------------------------------------

    def attach(self) -> None:
        """Each kind's program that is not attached at load (the table's ``attach``), then the ring."""
        for kind in self.config.kinds_on():
            if kind.attach is not None:
                kind.attach(self._bpf, self.config)
        try:  # the kernel's symbols, read once now rather than by the first sample taken in the kernel
            self.kernel_symbol(0)
        except Exception:  # noqa: BLE001 - no /proc/kallsyms: kernel frames are named by address
            pass
        self.reader = None
        try:  # the mapped ring: no Python call per record (BCC's callback is the fallback)
            from otelbpf.sources.ringbuf import RingBufReader

            self.reader = RingBufReader(self.ring_fd)
        except Exception as exc:  # noqa: BLE001
            log.warning("profiles: cannot map the profile ring (%s): using BCC's per-record callback", exc)
            self._bpf["profile_events"].open_ring_buffer(self._on_record)

    @property
    def ring_fd(self) -> int:
        return self._bpf["profile_events"].map_fd

    @property
    def unread_limit_s(self) -> float:
        """How long the agent may leave the ring unread (it sleeps while only on-CPU
        samples come, which never wake it: bpf/profile.c): half the time every CPU
        busy at ``hz`` with whole stack copies takes to fill it. 1.6 s for the default
        4 MiB at 19 Hz on 2 CPUs, 0.3 s at 99 Hz; 0.05 s at 19 Hz on 64. A kind whose
        samples come at no rate caps it (the table's ``unread_limit_s``: off-CPU samples
        come at every block)."""
        record = HEADER.size + PROFILE_INFO_SIZE + PROFILE_STACK_BYTES + 8  # + the ring's own header
        fill_s = self.config.ring_mb * 1024 * 1024 / (max(1, self.config.hz) * self._cpus * record)
        limit = fill_s / 2
        return limit if self._kinds_limit_s is None else min(limit, self._kinds_limit_s)

    # -- steady state -----------------------------------------------------

    def _on_record(self, _ctx, data, size) -> int:
        self._raw.append(ctypes.string_at(data, size))
        return 0

    def drain(self, consume: bool = True) -> list:
        """The records the kernel submitted since the last call, as events.
        ``consume=False`` when the caller already ran BCC's ring consumer."""
        if self.reader is not None:
            if not self.reader.pending_bytes():  # called for a held stack now due (EbpfSource.read)
                self._release_kernel_stacks(NO_STACKS)
                return []
            raw = self.reader.drain()
        else:
            if consume:
                self._bpf.ring_buffer_consume()
            raw, self._raw = self._raw, []
        started = time.thread_time_ns() if raw else 0  # most drains read none: no clock read then
        out = []
        decode = self.decoder.decode
        kernel_stacks: dict[int, tuple[int, ...]] = {}
        for record in raw:
            event = decode(record)
            if event is None:
                continue
            if type(event) is StackSampleEvent:
                self.counters["samples"] += 1
                if event.kernel_stack_id >= 0:
                    event.kernel_addrs = self._kernel_stack(event.kernel_stack_id, kernel_stacks)
                if event.pid not in self._python:
                    self.watch(event.pid)
                elif event.flags & PF_PY_NO_THREAD:
                    self._unknown_thread(event.pid, event.tid)
            out.append(event)
        self.counters["malformed"] = self.decoder.malformed
        self._release_kernel_stacks(kernel_stacks)
        if raw:
            self.cpu_ns += time.thread_time_ns() - started
        return out

    def _kernel_stack(self, stack_id: int, seen: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
        """A kernel stack's addresses, leaf first, read once while the stack map holds it."""
        addrs = seen.get(stack_id)
        if addrs is None:
            addrs = self._held_stacks.get(stack_id)
            if addrs is None:
                try:
                    table = self._bpf["kernel_stacks"]
                    ips = table[table.Key(stack_id)].ip[:]  # the whole array at once (BCC's walk: one Python step per frame)
                except (KeyError, OSError):
                    ips = []
                addrs = tuple(ips[: ips.index(0)] if 0 in ips else ips)
            seen[stack_id] = addrs
        return addrs

    def _release_kernel_stacks(self, seen: dict[int, tuple[int, ...]]) -> None:
        """The stack map is bounded: stacks read are deleted (a new sample of
        the same stack stores it again), but only when no sample named them
        for KERNEL_STACK_HOLD_DRAINS drains. A sample taken while a drain reads
        the stack gets the same id (same stack, same bucket) and arrives in a
        later drain: deleted at once, its kernel frames would be lost.

        The hold is in time too: an agent busy with traffic drains every few
        milliseconds, and a stack named by a thread that blocks again and again
        (a sleeper, a lock waiter) would otherwise expire between two of its
        samples and race the next one: taken before the delete, read after it."""
        self._drains += 1
        if not seen and not self._stack_last_drain:
            return  # nothing read, nothing held (most drains)
        now = self._clock()
        last_drain = self._stack_last_drain
        for stack_id, addrs in seen.items():
            if addrs:  # one that could not be read is not held: the next sample naming it reads again
                self._held_stacks[stack_id] = addrs
                last_drain.pop(stack_id, None)  # to the end: the dict stays ordered by last drain
                last_drain[stack_id] = (self._drains, now)
        if last_drain:
            self.release_due = next(iter(last_drain.values()))[1] + KERNEL_STACK_HOLD_S
            if now >= self.release_due:
                self._expire_kernel_stacks(now)

    def _expire_kernel_stacks(self, now: float) -> None:
        """Deletes the held stacks that are due (_release_kernel_stacks), oldest first, and
        sets when the next one may be: a drain before that reads no clock beyond one comparison
        (drains without samples skip the rest: an agent under traffic drains ~100 times a second)."""
        last_drain = self._stack_last_drain
        expired = []
        for stack_id, last in last_drain.items():
            if not self._due(last, now):
                break
            expired.append(stack_id)
        if expired:
            table = self._bpf["kernel_stacks"]
            for stack_id in expired:
                del last_drain[stack_id]
                del self._held_stacks[stack_id]
                table.pop(ctypes.c_int(stack_id), None)
        if not last_drain:
            self.release_due = float("inf")
        elif not expired:  # due by time, not yet by drains: looked at again on the next drain
            self.release_due = now
        else:
            self.release_due = next(iter(last_drain.values()))[1] + KERNEL_STACK_HOLD_S

    def _due(self, last: tuple[int, float], now: float) -> bool:
        """A held stack last named at ``last`` (drain, time) may be deleted."""
        return self._drains - last[0] >= KERNEL_STACK_HOLD_DRAINS and now - last[1] >= KERNEL_STACK_HOLD_S

    # -- CPython processes ------------------------------------------------

    def watch(self, pid: int) -> None:
        """First sight of a traced process: if it runs a CPython whose frames
        we know how to read, tell the kernel where they are."""
        if pid in self._python or not self.config.python:
            return
        self._python[pid] = None
        try:
            from otelbpf.profiles.python.interpreter import find_python

            proc = find_python(pid)
        except Exception as exc:  # noqa: BLE001 - a process we cannot read is profiled natively
            log.debug("profiles: pid %d: cannot inspect for CPython: %s", pid, exc)
            return
        if proc is None:
            return
        if proc.offsets is None:
            self.counters["python_unknown_versions"] += 1
            log.info("profiles: pid %d: %s: native frames only", pid, proc.reason)
            return
        self._python[pid] = proc
        self.counters["python_processes"] += 1
        self._set_offsets(pid, proc.offsets)
        if self._use_tls:
            self._tls_attempts[pid] = TLS_ATTEMPTS
        self.refresh_threads(pid, force=True)

    def _set_offsets(self, pid: int, offsets) -> None:
        table = self._bpf["py_procs"]
        table[ctypes.c_uint32(pid)] = table.Leaf.from_buffer_copy(offsets.to_bytes())

    def _find_tls(self, pid: int, proc) -> None:
        """Tell the kernel where ``pid``'s threads keep their state in their TLS, once it is
        proven on the threads the interpreter lists (a few tries while the process starts)."""
        from otelbpf.profiles.python.interpreter import ProcMem
        from otelbpf.profiles.python.threads import thread_pointers
        from otelbpf.profiles.python.thread_local import find_tstate_source

        self._tls_attempts[pid] -= 1
        mem = ProcMem(pid)
        try:
            found = find_tstate_source(proc, thread_pointers(proc, mem), mem, self._tls_variable)
        except Exception as exc:  # noqa: BLE001 - a process we cannot read keeps the thread list
            found = f"unreadable: {exc}"
        finally:
            mem.close()
        if isinstance(found, str):
            if self._tls_attempts[pid] <= 0:
                del self._tls_attempts[pid]
                log.info("profiles: pid %d: Python thread states from the thread list (TLS: %s)", pid, found)
            return
        del self._tls_attempts[pid]
        self.tls[pid] = found
        self.counters["python_tls_processes"] += 1
        self._set_offsets(pid, proc.offsets.with_tstate(found.mode, found.offset, found.module))
        log.info("profiles: pid %d: Python thread states from each thread's TLS: %s", pid, found.how)

    def python_process(self, pid: int):
        return self._python.get(pid)

    def _unknown_thread(self, pid: int, tid: int) -> None:
        """A sample of ``tid`` found no thread state in the kernel. A thread
        started since the last read is looked for at once: its later samples
        get Python frames (rate-limited by NEW_THREAD_RESCAN_S). One the
        interpreter did not list then waits for the once-a-second re-read."""
        if tid in self._tids.get(pid, ()) or pid in self.tls:  # listed since, or TLS has what a list would
            return
        unlisted = self._unlisted.setdefault(pid, set())
        if tid in unlisted:
            self.refresh_threads(pid)
            return
        if self.refresh_threads(pid, min_interval_s=NEW_THREAD_RESCAN_S) and tid not in self._tids.get(pid, ()):
            if len(unlisted) >= MAX_UNLISTED_THREADS:
                unlisted.clear()
            unlisted.add(tid)

    def refresh_threads(self, pid: int, force: bool = False, min_interval_s: float = THREAD_RESCAN_S) -> bool:
        """Re-read ``pid``'s interpreter thread list into py_tstates (at most
        every ``min_interval_s`` unless ``force``); True when it was read."""
        proc = self._python.get(pid)
        if proc is None:
            return False
        now = time.monotonic()
        if not force and now - self._thread_scan.get(pid, 0.0) < min_interval_s:
            return False
        self._thread_scan[pid] = now
        self.counters["thread_rescans"] += 1
        from otelbpf.profiles.python.threads import thread_states

        try:
            states = thread_states(proc)
        except Exception as exc:  # noqa: BLE001 - the process may be exiting
            log.debug("profiles: pid %d: thread list unreadable: %s", pid, exc)
            return False
        table = self._bpf["py_tstates"]
        old = self._tids.get(pid, set())
        for tid in old - states.keys():
            table.pop(ctypes.c_uint32(tid), None)
        for tid, tstate in states.items():
            table[ctypes.c_uint32(tid)] = ctypes.c_uint64(tstate)
        self._tids[pid] = set(states)
        if pid in self._tls_attempts:
            self._find_tls(pid, proc)
        return True

    def rescan(self) -> None:
        """Periodic: thread lists of every CPython process (threads that
        ended), and the entries of processes gone without an exit event."""
        for pid, proc in list(self._python.items()):
            if not os.path.exists(f"/proc/{pid}"):
                self.forget(pid)
            elif proc is not None:
                self.refresh_threads(pid)

    def forget(self, pid: int) -> None:
        """The process exited: its kernel entries go."""
        proc = self._python.pop(pid, None)
        self._thread_scan.pop(pid, None)
        self._unlisted.pop(pid, None)
        self.tls.pop(pid, None)
        self._tls_attempts.pop(pid, None)
        if proc is None:
            return
        self._bpf["py_procs"].pop(ctypes.c_uint32(pid), None)
        table = self._bpf["py_tstates"]
        for tid in self._tids.pop(pid, ()):
            table.pop(ctypes.c_uint32(tid), None)

    def close(self) -> None:
        """Unmap the profile ring (before the BPF object goes)."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None

    def kernel_symbol(self, address: int) -> str:
        return self._bpf.ksym(address).decode("utf-8", "replace")
