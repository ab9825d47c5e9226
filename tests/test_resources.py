"""Resource attributes of traced processes: service name rules, OTEL_RESOURCE_ATTRIBUTES,
and container.id / k8s.pod.uid from cgroups (parsed, and read from a real process placed
in Kubernetes-shaped cgroups)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from otelbpf.host.resource_ids import container_ids
from otelbpf.host.resources import (
    ProcessResources,
    parse_resource_attributes,
    process_attributes,
    script_name,
    service_name_for,
)

CONTAINER = "3f1c2d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e"
POD = "5a1e9b64-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


@pytest.mark.parametrize(
    "cgroup, expected",
    [
        # cgroup v2, systemd driver, containerd
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n", (CONTAINER, POD)),
        # cgroup v1, cgroupfs driver
        (f"12:pids:/kubepods/besteffort/pod{POD}/{CONTAINER}\n11:memory:/kubepods/besteffort/pod{POD}/{CONTAINER}\n", (CONTAINER, POD)),
        # cri-o
        (f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CONTAINER}.scope\n", (CONTAINER, POD)),
        # plain docker
        (f"0::/system.slice/docker-{CONTAINER}.scope\n", (CONTAINER, None)),
        (f"13:cpuset:/docker/{CONTAINER}\n", (CONTAINER, None)),
        # podman
        (f"0::/user.slice/user-1000.slice/user@1000.service/libpod-{CONTAINER}.scope\n", (CONTAINER, None)),
        # a host process
        ("0::/user.slice/user-0.slice/session-3.scope\n", (None, None)),
        ("", (None, None)),
    ],
)
def test_container_and_pod_from_cgroup(cgroup, expected):
    assert container_ids(cgroup) == expected


def test_resource_attributes_syntax_with_percent_encoding():
    assert parse_resource_attributes("a=b, k8s.node.name=node%201,broken,=x,empty=") == {
        "a": "b",
        "k8s.node.name": "node 1",
        "empty": "",
    }


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["python3", "server.py"], "server"),
        (["python3", "-u", "/srv/app/main.py", "--port", "80"], "main"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], "vllm.entrypoints.openai.api_server"),
        (["python3", "-X", "dev", "app.py"], "app"),
        (["python3", "-c", "print(1)"], None),
        (["node", "dist/index.js"], "index"),
    ],
)
def test_script_name_of_interpreters(argv, expected):
    assert script_name(argv) == expected


def test_service_name_precedence():
    argv = ["/usr/bin/python3", "server.py"]
    assert service_name_for({"OTEL_SERVICE_NAME": "inventory"}, argv, "/usr/bin/python3.11", "python3") == "inventory"
    declared = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=catalog,team=ml"}
    assert service_name_for(declared, argv, "/usr/bin/python3.11", "python3") == "catalog"
    assert service_name_for({}, argv, "/usr/bin/python3.11", "python3") == "server"
    assert service_name_for({}, ["nginx: worker process"], "/usr/sbin/nginx", "nginx") == "nginx"


def test_real_process_attributes_from_its_environment():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "OTEL_SERVICE_NAME": "ranker", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod"},
    )
    # Popen returns while exec may still be setting up the new image (its
    # environment is not readable yet): wait until the program runs, as the
    # agent does (it reads a process when it first sees it on a socket).
    assert proc.stdout.readline() == b"ready\n"
    try:
        attrs = process_attributes(proc.pid)
    finally:
        proc.communicate(b"")
    assert attrs["service.name"] == "ranker"
    assert attrs["deployment.environment.name"] == "prod"
    assert attrs["process.pid"] == proc.pid
    assert attrs["process.executable.name"].startswith("python")


def test_attributes_outlive_the_process_until_its_pid_is_reused():
    resources = ProcessResources(agent_attributes={"k8s.node.name": "n1"})
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert resources.observe(proc.pid) is True
    assert resources.observe(proc.pid) is False
    proc.communicate(b"")
    resources.mark_exited(proc.pid)
    remembered = resources.attributes(proc.pid)  # spans still queued keep their resource
    assert remembered["process.pid"] == proc.pid and remembered["k8s.node.name"] == "n1"
    assert resources.observe(proc.pid) is True  # a new process with that pid is read afresh


def _make_cgroup(path: Path) -> Path | None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if (path / "cgroup.procs").exists() else None


@pytest.mark.skipif(os.geteuid() != 0, reason="creating cgroups needs root")
def test_real_process_in_kubernetes_shaped_cgroups_gets_container_and_pod():
    """A process moved into cgroups named as kubelet + containerd name them."""
    pod = str(uuid.uuid4())
    container = uuid.uuid4().hex + uuid.uuid4().hex
    unified = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else Path("/sys/fs/cgroup")
    slice_dir = unified / "otelbpf-test.slice" / f"kubepods-pod{pod.replace('-', '_')}.slice" / f"cri-containerd-{container}.scope"
    created = _make_cgroup(slice_dir)
    if created is None:
        pytest.skip(f"cannot create a cgroup under {unified}")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (created / "cgroup.procs").write_text(str(proc.pid))
        attrs = process_attributes(proc.pid)
    finally:
        proc.communicate(b"")
        proc.wait()
        for directory in (created, created.parent, created.parent.parent):
            try:
                directory.rmdir()
            except OSError:
                pass
    assert attrs["container.id"] == container
    assert attrs["k8s.pod.uid"] == pod
