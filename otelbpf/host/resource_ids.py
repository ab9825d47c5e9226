"""Who the agent reports as the host, and a stable id per traced process.

Under a DaemonSet the agent runs in its own UTS namespace, so
``socket.gethostname()`` is the pod's name, not the node's. ``host.name``
must be the node's (it is the same for every process on it, traced or
not): the hostname of PID 1's UTS namespace, read by joining that namespace
from a short-lived thread (``setns`` changes only the calling thread), which
needs CAP_SYS_ADMIN and a host PID namespace (hostPID). Without either,
``K8S_NODE_NAME`` (the DaemonSet sets it from ``spec.nodeName``), and only
then the agent's own hostname.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import socket
import threading
import uuid

from otelbpf.host import procfs

log = logging.getLogger("otelbpf")

CLONE_NEWUTS = 0x04000000
#: Namespace of the UUIDv5 service.instance.id of traced processes.
INSTANCE_NAMESPACE = uuid.UUID("5f2f1f3c-6c1e-4a1b-9f0e-0e1b9f0c7a11")
#: cgroup path parts that carry a container ID (docker, containerd, cri-o, podman).
CONTAINER_ID = re.compile(r"(?:^|[/-])(?:docker-|cri-containerd-|crio-|libpod-)?([0-9a-f]{64})(?:\.scope)?$")
POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def _same_namespace(kind: str, pid: int) -> bool | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}") == os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return None  # cannot tell (no permission to read PID 1's ns links)


def uts_name_of(pid: int) -> str | None:
    """The hostname in ``pid``'s UTS namespace, or None when it cannot be joined."""
    result: list[str | None] = [None]

    def join_and_read() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/uts", os.O_RDONLY)
        except OSError:
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, CLONE_NEWUTS) == 0:
                result[0] = os.uname().nodename
        finally:
            os.close(fd)

    # The thread ends in the other namespace; the agent's threads stay in theirs.
    worker = threading.Thread(target=join_and_read, name="otelbpf-uts")
    worker.start()
    worker.join()
    return result[0]


@functools.cache
def node_host_name(host_pid: int = 1) -> str:
    """host.name for every resource the agent reports (see the module
    docstring). ``host_pid``: a process in the host's UTS namespace."""
    node = os.environ.get("K8S_NODE_NAME", "").strip()
    same = _same_namespace("uts", host_pid)
    if same is True and not (node and _pid1_in_container()):
        return socket.gethostname()  # PID 1's UTS namespace: the host's (or no hostPID and no K8S_NODE_NAME)
    if same is False:
        host = uts_name_of(host_pid)
        if host:
            return host
    if node:
        return node
    own = socket.gethostname()
    if same is None:
        return own  # cannot tell whether this is the host's name: nothing better to say
    log.warning(
        "otelbpf: host.name is this container's hostname %r: cannot read the node's (needs hostPID and "
        "CAP_SYS_ADMIN) and K8S_NODE_NAME is not set",
        own,
    )
    return own


def _pid1_in_container() -> bool:
    """PID 1 is a container's (no hostPID): its UTS name is the pod's, not the node's."""
    return any(container_ids(procfs.cgroup_of(1)))

def container_ids(cgroup_text: str) -> tuple[str | None, str | None]:
    """(container.id, k8s.pod.uid) from a /proc/PID/cgroup file, if present."""
    container = pod = None
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        for part in path.split("/"):
            match = CONTAINER_ID.search(part)
            if match:
                container = match.group(1)
            pod_match = POD_UID.search(part)
            if pod_match:
                pod = pod_match.group(1).replace("_", "-")
    return container, pod


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_instance_id(host: str, pid: int) -> str:
    """A UUIDv5 that names one process of one host: the same across agent
    restarts, different for a later process with the same pid."""
    return str(uuid.uuid5(INSTANCE_NAMESPACE, f"{host}/{pid}/{process_start_ticks(pid)}"))


#: Interpreter or runtime -> telemetry.sdk.language value.
LANGUAGES = (
    ("python", "python"), ("pypy", "python"), ("node", "nodejs"), ("bun", "nodejs"), ("deno", "nodejs"),
    ("ruby", "ruby"), ("php", "php"), ("java", "java"), ("dotnet", "dotnet"), ("beam.smp", "erlang"),
)  # fmt: skip


def language_of(program: str) -> str | None:
    """telemetry.sdk.language for an executable name, when it names a runtime."""
    for prefix, language in LANGUAGES:
        if program.startswith(prefix):
            return language
    return None
