"""Resource attributes for each traced process.

Read once, the first time a process is seen, because it may exit before its
spans are exported. ``service.name`` follows what the process itself would
report if it were instrumented: its own OTEL_SERVICE_NAME (or
``service.name`` in its OTEL_RESOURCE_ATTRIBUTES), else the script name for
interpreters (``python3 -m vllm.entrypoints...`` -> ``vllm.entrypoints...``,
``python3 server.py`` -> ``server``), else the executable name.
The agent's own OTEL_RESOURCE_ATTRIBUTES (e.g. ``k8s.node.name``) apply to
every process; the process's attributes win where both set a key.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable, Mapping

from otelbpf import __version__, semconv as sc
from otelbpf.core.model import AttributeValue, ResourceLookup
from otelbpf.host import procfs
from otelbpf.host.resource_ids import container_ids, language_of, node_host_name, process_instance_id

INTERPRETERS = re.compile(r"^(python[\d.]*|pypy[\d.]*|node|nodejs|ruby[\d.]*|perl[\d.]*|php[\d.]*|bun|deno)$")


def parse_resource_attributes(text: str) -> dict[str, str]:
    """OTEL_RESOURCE_ATTRIBUTES syntax: ``k=v,k2=v2`` with percent-encoding."""
    from urllib.parse import unquote

    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip()] = unquote(value.strip())
    return out


def script_name(argv: list[str]) -> str | None:
    """The program an interpreter runs: ``-m module`` or the first script path."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg in ("-c",):
            return None
        if arg.startswith("-"):
            if arg in ("-W", "-X", "--require", "-r"):
                next(args, None)  # options that take a value
            continue
        base = os.path.basename(arg)
        return os.path.splitext(base)[0] or None
    return None


def service_name_for(env: Mapping[str, str], argv: list[str], exe: str | None, comm: str) -> str:
    if env.get("OTEL_SERVICE_NAME"):
        return env["OTEL_SERVICE_NAME"]
    declared = parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")).get("service.name")
    if declared:
        return declared
    program = os.path.basename(exe or (argv[0] if argv else "") or comm)
    if INTERPRETERS.match(program) or INTERPRETERS.match(comm):
        script = script_name(argv)
        if script:
            return script
    return program or comm or "unknown_service"



def process_attributes(pid: int, comm_hint: str = "") -> dict[str, AttributeValue]:
    env = procfs.environ_of(pid)
    argv = procfs.cmdline_of(pid)
    exe = procfs.exe_of(pid)
    comm = procfs.comm_of(pid) or comm_hint
    attrs: dict[str, AttributeValue] = {}
    attrs.update(parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    attrs["service.name"] = service_name_for(env, argv, exe, comm)
    attrs["process.pid"] = pid
    attrs["process.executable.name"] = os.path.basename(exe) if exe else comm
    if exe:
        attrs["process.executable.path"] = exe
    if argv:
        attrs["process.command"] = argv[0]
    container, pod = container_ids(procfs.cgroup_of(pid))
    if container:
        attrs["container.id"] = container
    if pod:
        attrs["k8s.pod.uid"] = pod
    for key, value in telemetry_identity(pid, str(attrs["process.executable.name"])).items():
        attrs.setdefault(key, value)
    return attrs


def telemetry_identity(pid: int, program: str) -> dict[str, AttributeValue]:
    """service.instance.id (unless the process set its own: it is kept) and
    telemetry.sdk.*: the spans are made by otelbpf, in the process's language."""
    out: dict[str, AttributeValue] = {
        sc.SERVICE_INSTANCE_ID: process_instance_id(node_host_name(), pid),
        sc.TELEMETRY_SDK_NAME: "otelbpf",
        sc.TELEMETRY_SDK_VERSION: __version__,
    }
    language = language_of(program)
    if language:
        out[sc.TELEMETRY_SDK_LANGUAGE] = language
    return out


class ProcessResources(ResourceLookup):
    """pid -> resource attributes, remembered after the process is gone."""

    def __init__(
        self,
        agent_attributes: Mapping[str, AttributeValue] | None = None,
        describe: Callable[[int, str], dict[str, AttributeValue]] = process_attributes,
        max_processes: int = 65536,
    ) -> None:
        base: dict[str, AttributeValue] = {"host.name": node_host_name()}
        base.update(parse_resource_attributes(os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))
        base.update(agent_attributes or {})
        base.setdefault("telemetry.distro.name", "otelbpf")
        self._base = base
        self._describe = describe
        self._max = max_processes
        self._known: dict[int, dict[str, AttributeValue]] = {}
        self._exited: set[int] = set()
        self._lock = threading.Lock()

    def observe(self, pid: int, comm_hint: str = "", exe_hint: str = "") -> bool:
        """Read the process's attributes now, while it is alive (again if the
        pid was seen exiting: it now belongs to a new process). True when the
        process is new to us. ``exe_hint``: the file the kernel saw exec()ed,
        for a process already gone from /proc (curl, a short script)."""
        if pid in self._known and pid not in self._exited:
            return False
        self._exited.discard(pid)
        attrs = dict(self._base)
        attrs.update(self._describe(pid, comm_hint))
        if exe_hint.startswith("/") and "process.executable.path" not in attrs:
            attrs["process.executable.path"] = exe_hint
            attrs["process.executable.name"] = os.path.basename(exe_hint)
        with self._lock:
            if len(self._known) >= self._max:
                self._known.pop(next(iter(self._known)))
            self._known[pid] = attrs
        return True

    def mark_exited(self, pid: int) -> None:
        """The process exited. Its attributes stay for spans still queued;
        the next process seen with this pid is read afresh."""
        if pid in self._known:
            self._exited.add(pid)

    def attributes(self, pid: int) -> Mapping[str, AttributeValue]:
        known = self._known.get(pid)
        if known is None:
            self.observe(pid)
            known = self._known.get(pid, self._base)
        return known
