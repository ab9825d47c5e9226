"""The table of profile kinds (otelbpf/profiles/kinds.py) is what the command line, the
configuration and its BPF flags, the sampler's attach and the profiler's dispatch read.

A kind made up here, added to a copy of the table, must come out everywhere the real ones
do: a switch of ``otelbpf run``, a ProfileConfig field set from it, its -D flag, its program
attached, its samples handled. The real table's kinds are checked against bpf/capture.h in
tests/test_ebpf_record_abi.py, and their samples' handling in tests/test_gpu_profiles.py.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from otelbpf.cli.main import build_parser
from otelbpf.cli.outputs import profile_config
from otelbpf.core.selfmetrics import Counters
from otelbpf.profiles import types
from otelbpf.profiles.kinds import PROFILE_KINDS, ProfileKind, Setting
from otelbpf.profiles.model import FRAME_NATIVE, Frame, ProfileType
from otelbpf.profiles.profiler import Profiler
from otelbpf.profiles.records import PROFILE_ON_CPU, GpuKernelName, OffCpuEnd, StackSampleEvent
from otelbpf.profiles.sampler import SUPPORTED, ProfileConfig, ProfileSampler, profile_config_class

PID, TID = 4242, 4243
T0 = time.time_ns()

#: A kind made up for these tests: what an entry for, say, page faults would look like.
FAULTS = ProfileType("faults", (("faults", "count"),))


def _faults(event):
    return (event.weight,)


def _attach_faults(bpf, config):
    bpf.attached.append(("faults", config.fault_every))


FAULT_KIND = ProfileKind(
    name="faults",
    record_kind=200,
    c_name="PROFILE_FAULT",
    types=(FAULTS,),
    settings=(
        Setting("faults", False, "--fault-profiles", help="also sample page faults"),
        Setting("fault_every", 64, "--fault-every", parse=int, metavar="N", help="1 fault in N (default 64)",
                check=lambda every: None if every > 0 else "--fault-every must be > 0"),
    ),  # fmt: skip
    enabled=lambda config: config.faults,
    cflags=lambda config: [f"-DFAULT_SAMPLES={int(config.faults)}", f"-DFAULT_EVERY={config.fault_every}"],
    attach=_attach_faults,
    handler=lambda profiler: profiler.linked(FAULTS, _faults),
)
KINDS = PROFILE_KINDS + (FAULT_KIND,)


class FakeBpf:
    """What ProfileSampler.attach touches of a loaded BPF object, recording the attaches."""

    def __init__(self):
        self.attached = []

    def attach_perf_event(self, **kwargs):
        self.attached.append(("perf_event", kwargs["fn_name"], kwargs["sample_freq"]))

    def ksym(self, address):
        return b"[unknown]"

    def __getitem__(self, name):
        return SimpleNamespace(map_fd=-1, open_ring_buffer=lambda callback: None)


class StubBuilder:
    def frames(self, event):
        return (Frame(FRAME_NATIVE, f"stack{event.stack_addr}"),)

    def forget(self, pid):
        pass


class Exported:
    def __init__(self):
        self.samples = []

    def export(self, samples, resources):
        self.samples.extend(samples)

    def shutdown(self):
        pass


class Resources:
    def attributes(self, pid):
        return {"process.pid": pid}


class Linker:
    def serving(self, pid, tid, task_id=0):
        return None

    def serves_requests(self, pid):
        return False


class Pipeline:
    """What Profiler.attach registers with (otelbpf/pipeline.py)."""

    def __init__(self):
        self.linker = Linker()
        self.linker.answer_observers = []
        self.handlers = {}
        self.tick_hooks, self.exit_hooks, self.finish_hooks = [], [], []
        self.registry = SimpleNamespace(call_semantics=lambda scope: None)  # no GPU semantics attached

    def add_handler(self, event_type, handler):
        self.handlers[event_type] = handler


def sample(kind, weight=0, stack=1):
    return StackSampleEvent(T0, PID, TID, 0, kind, 0, "worker", -1, (0,) * 21, stack, b"", [], weight=weight)


def run_args(parser, *switches):
    return parser.parse_args(["run", "--pid", "1", *switches])


def test_a_kind_in_the_table_gets_a_switch_a_config_field_flags_an_attach_and_a_handler(capsys):
    parser = build_parser(profile_kinds=KINDS)
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--help"])
    help_text = capsys.readouterr().out
    assert re.search(r"--fault-profiles\s+also sample page faults", help_text)
    assert re.search(r"--fault-every N\s+1 fault in N \(default 64\)", help_text)
    config_class = profile_config_class(KINDS)

    # the switches set the kind's fields; the other kinds' stay as their switches say
    config = profile_config(run_args(parser, "--fault-profiles", "--fault-every", "8", "--off-cpu"), config_class)
    assert (config.faults, config.fault_every, config.off_cpu, config.hz) == (True, 8, True, 19)
    assert profile_config(run_args(parser), config_class).faults is False
    with pytest.raises(ValueError, match="--fault-every must be > 0"):
        config_class(fault_every=0).validate()

    # its -D flags follow the others'; its program is attached after the CPU clock's, only when asked
    if not SUPPORTED:
        pytest.skip("profiles are x86-64 only: no flags, nothing attached")
    assert config.cflags()[-2:] == ["-DFAULT_SAMPLES=1", "-DFAULT_EVERY=8"]
    bpf = FakeBpf()
    ProfileSampler(bpf, config, 0).attach()
    assert bpf.attached == [("perf_event", "profile_on_cpu", 19), ("faults", 8)]
    bpf = FakeBpf()
    ProfileSampler(bpf, config_class(), 0).attach()
    assert bpf.attached == [("perf_event", "profile_on_cpu", 19)]


def test_the_profiler_dispatches_each_kind_to_its_tables_handler():
    out, counters = Exported(), Counters()
    profiler = Profiler(None, [out], Resources(), counters, 19, interval_s=3600, builder=StubBuilder(), kinds=KINDS)
    pipeline = Pipeline()
    profiler.attach(pipeline)
    # off-CPU's end events and the GPU kernels' names, from their entries
    assert set(pipeline.handlers) == {StackSampleEvent, OffCpuEnd, GpuKernelName}

    profiler.on_sample(sample(FAULT_KIND.record_kind, weight=5, stack=1))
    profiler.on_sample(sample(PROFILE_ON_CPU, stack=2))
    profiler.on_sample(sample(201, stack=3))  # no such kind: counted, not profiled as anything
    profiler.flush(T0 + 1)
    assert [(s.profile.id, s.values, s.frames[0].function) for s in out.samples] == [
        ("faults", (5,), "stack1"), ("cpu", (1,), "stack2"),
    ]  # fmt: skip
    assert counters.get("otelbpf.profiles.samples.unknown_kind") == 1

    # the agent's own table does not know the made-up kind
    out.samples.clear()
    agent = Profiler(None, [out], Resources(), Counters(), 19, interval_s=3600, builder=StubBuilder())
    agent.linker = Linker()
    agent.on_sample(sample(FAULT_KIND.record_kind, weight=5))
    agent.flush(T0 + 1)
    assert out.samples == [] and agent.counters.get("otelbpf.profiles.samples.unknown_kind") == 1


def test_switches_map_to_the_configuration_the_kinds_declare():
    parser = build_parser()
    default = profile_config(run_args(parser))
    assert default == ProfileConfig()  # each switch's default is its field's
    assert (default.hz, default.off_cpu, default.off_cpu_min_ns, default.gpu, default.gpu_launch_every) == (
        19, False, 1_000_000, True, 128,
    )  # fmt: skip
    asked = profile_config(run_args(parser, "--profile-hz", "99", "--off-cpu", "--off-cpu-min", "5ms",
                                    "--no-gpu-profiles", "--gpu-launch-sample-every", "0"))  # fmt: skip
    assert (asked.hz, asked.off_cpu, asked.off_cpu_min_ns, asked.gpu, asked.gpu_launch_every) == (99, True, 5_000_000, False, 0)
    assert [kind.name for kind in asked.kinds_on()] == (["cpu", "off_cpu"] if SUPPORTED else [])
    off = profile_config(run_args(parser, "--no-profiles", "--off-cpu"))
    assert (off.hz, off.off_cpu, off.enabled, off.kinds_on(), off.cflags()) == (0, False, False, (), [])
    assert profile_config(run_args(parser, "--no-gpu")).gpu is False  # no GPU probes: no GPU stacks
    with pytest.raises(ValueError, match="--profile-hz must be between 1 and 1000, got 1001"):
        ProfileConfig(hz=1001).validate()


def test_every_profile_type_is_made_by_one_kind_and_kinds_do_not_collide():
    declared = {value.id for value in vars(types).values() if isinstance(value, ProfileType)}
    made = [profile_type.id for kind in PROFILE_KINDS for profile_type in kind.types]
    assert sorted(made) == sorted(declared)
    assert len({kind.record_kind for kind in PROFILE_KINDS}) == len(PROFILE_KINDS)
    switches = [setting.switch for kind in PROFILE_KINDS for setting in kind.settings]
    assert len(set(switches)) == len(switches)
    with pytest.raises(ValueError, match="declared twice"):
        profile_config_class(KINDS + (FAULT_KIND,))
