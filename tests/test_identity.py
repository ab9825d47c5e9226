"""Identity under a DaemonSet: host.name is the node's even from the agent's
own UTS namespace (`unshare -u`), what a reduced capability set (`capsh`)
still allows, and doctor saying which capability is missing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (unshare, capsh, setpriv)")

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("K8S_NODE_NAME", None)


def in_own_uts(hostname: str, command: str, env: dict | None = None, drop: str = "") -> subprocess.CompletedProcess:
    """``command`` (shell) in a new UTS namespace named ``hostname``, as an agent pod is;
    with capabilities ``drop``ped (capsh) when given."""
    inner = f"hostname {hostname} && exec {command}"
    if drop:
        inner = f"hostname {hostname} && exec capsh --drop={drop} -- -c {json.dumps(command)}"
    return subprocess.run(
        ["unshare", "-u", "sh", "-c", inner], capture_output=True, text=True, env={**ENV, **(env or {})}, timeout=120
    )


@pytest.fixture
def host_process():
    """A process in a UTS namespace of its own, named like a node: plays the host's PID 1."""
    proc = subprocess.Popen(["unshare", "-u", "sh", "-c", "hostname node-under-test && exec sleep 60"])
    time.sleep(0.3)
    yield proc.pid
    proc.kill()
    proc.wait()


def host_name_seen(host_pid: int, **kwargs) -> subprocess.CompletedProcess:
    code = f"from otelbpf.host.resource_ids import node_host_name; print(node_host_name({host_pid}))"
    return in_own_uts("agent-pod-x1", f"{PY} -c {json.dumps(code)}", **kwargs)


def test_host_name_is_read_from_the_host_uts_namespace(host_process):
    result = host_name_seen(host_process)
    assert result.stdout.strip() == "node-under-test", result.stderr


def test_without_cap_sys_admin_host_name_is_k8s_node_name(host_process):
    result = host_name_seen(host_process, env={"K8S_NODE_NAME": "node-from-downward-api"}, drop="cap_sys_admin")
    assert result.stdout.strip() == "node-from-downward-api", result.stderr


def test_without_either_the_pod_name_is_used_and_said(host_process):
    result = host_name_seen(host_process, drop="cap_sys_admin")
    assert result.stdout.strip() == "agent-pod-x1"
    assert "K8S_NODE_NAME is not set" in result.stderr


@pytest.fixture
def nobody_service():
    """A service of another user (nobody) that names itself with OTEL_SERVICE_NAME."""
    proc = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", PY, str(EXAMPLES / "http_backend.py"), "--port", "0"],
        stdout=subprocess.PIPE, text=True, env={**ENV, "OTEL_SERVICE_NAME": "inventory"},
    )  # fmt: skip
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield proc.pid, int(line.split()[-1])
    proc.kill()
    proc.wait()


def attributes_under(pid: int, drop: str) -> dict:
    code = f"import json; from otelbpf.host.resources import process_attributes; print(json.dumps(process_attributes({pid})))"
    command = [PY, "-c", code]
    if drop:
        command = ["capsh", f"--drop={drop}", "--", "-c", " ".join(json.dumps(c) for c in command)]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=60)
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "drop, capability, lost",
    [
        ("cap_sys_ptrace", "SYS_PTRACE", "process.executable.path"),
        ("cap_dac_read_search,cap_dac_override", "DAC_READ_SEARCH", "service.name"),
    ],
)
def test_reduced_capabilities_lose_identity_and_doctor_names_the_missing_one(nobody_service, drop, capability, lost):
    pid, _ = nobody_service
    full = attributes_under(pid, "")
    assert full["service.name"] == "inventory" and full["process.executable.path"]
    reduced = attributes_under(pid, drop)
    assert reduced.get(lost) != full[lost]  # what the doctor warns about

    doctor = subprocess.run(["capsh", f"--drop={drop}", "--", "-c", f"{PY} -m otelbpf doctor"], capture_output=True, text=True, env=ENV)
    lines = doctor.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "process identity" in line)
    assert "[warn]" in lines[at] and "cannot read" in lines[at], doctor.stdout
    assert f"missing capability {capability}:" in lines[at + 1]
    ok = subprocess.run([PY, "-m", "otelbpf", "doctor"], capture_output=True, text=True, env=ENV)
    assert any("process identity" in line and "[  ok]" in line for line in ok.stdout.splitlines()), ok.stdout


@pytest.mark.ebpf
def test_agent_in_its_own_uts_namespace_reports_the_node_not_the_pod(nobody_service, tmp_path):
    pid, port = nobody_service
    out = tmp_path / "spans.json"
    agent = subprocess.Popen(
        ["unshare", "-u", "sh", "-c",
         f"hostname agent-pod-x1 && exec {PY} -m otelbpf run --pid {pid} --duration 6 --json-file {out}"],
        stderr=subprocess.PIPE, text=True, env={**ENV, "K8S_NODE_NAME": "node-e2e"}, cwd=str(ROOT),
    )  # fmt: skip
    for line in agent.stderr:
        if line.startswith("otelbpf: tracing,"):
            break
    for i in range(3):
        subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/items/{i}"], check=True)
    agent.communicate(timeout=60)
    resources = [
        {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
        for line in out.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
    ]
    assert resources
    for resource in resources:
        # The host's name where /proc/1's namespace can be joined, else the Downward API's.
        assert resource["host.name"] in (socket.gethostname(), "node-e2e")
        assert resource["host.name"] != "agent-pod-x1"
        assert resource["service.name"] == "inventory"
        assert resource["telemetry.sdk.name"] == "otelbpf"
        assert resource["telemetry.sdk.language"] == "python"
        assert len(resource["service.instance.id"]) == 36


@pytest.mark.ebpf
def test_short_lived_process_keeps_its_executable_path(agent, services, tmp_path):
    """curl exits within milliseconds, often before the agent reads /proc: the
    path comes from the exec tracepoint's record."""
    backend = services([str(EXAMPLES / "http_backend.py"), "--port", "0"])
    out = tmp_path / "spans.json"
    run = agent(["--comm", "curl", "--json-file", str(out)])
    for i in range(5):
        subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{backend.port}/items/{i}"], check=True)
    time.sleep(0.5)
    assert run.stop() == 0
    resources = [
        {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
        for line in out.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
    ]
    curls = [r for r in resources if r["process.executable.name"] == "curl"]
    assert len(curls) >= 1
    assert all(r["process.executable.path"].endswith("/curl") for r in curls), curls
