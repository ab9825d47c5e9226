"""Two "nodes" on one machine for the cross-node tests: two network namespaces joined
by a veth pair (IPv4 and IPv6), each with a cgroup of its own and a launcher process
(tests/clients/netnode.py) that is the parent of everything the test runs on it.

One agent per node traces its launcher's process tree (``--pid``) and attaches its
sock_ops program to the node's cgroup (``--propagation-cgroup``), as a DaemonSet's
agent covers its own node: each sees one end of every connection between them.

Names are unique per use (namespaces, veth devices, cgroups, addresses), so runs in
parallel on one machine do not meet, and everything is removed on exit, the
launchers and what they started first. Plain Python, not a pytest plugin: a test
module wraps :class:`TwoNodes` in a fixture of the scope it wants.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
NETNODE = ROOT / "tests" / "clients" / "netnode.py"


def cgroup2_root() -> str:
    from otelbpf.sources.crossnode import cgroup2_root as find

    root = find()
    if root is None:
        raise RuntimeError("no cgroup v2 hierarchy mounted")
    return root


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


@dataclass
class Service:
    pid: int
    port: int


@dataclass
class Node:
    """One node: its namespace, cgroup, addresses and launcher."""

    name: str
    netns: str
    cgroup: str
    ipv4: str
    ipv6: str
    device: str
    launcher: subprocess.Popen | None = None
    started: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.launcher.pid

    def _ask(self, command: dict) -> dict:
        self.launcher.stdin.write(json.dumps(command) + "\n")
        self.launcher.stdin.flush()
        line = self.launcher.stdout.readline()
        if not line:
            raise RuntimeError(f"node {self.name}'s launcher is gone: {self.launcher.stderr.read()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"node {self.name}: {answer['error']}")
        return answer

    def run(self, argv: list[str], timeout: float = 120, env: dict | None = None, check: bool = True) -> dict:
        """Run a command on the node to its end; its rc, stdout and stderr."""
        answer = self._ask({"run": [str(a) for a in argv], "timeout": timeout, "env": env or {}})
        if check and answer["rc"] != 0:
            raise RuntimeError(f"{argv} on {self.name} exited {answer['rc']}: {answer['stderr']}")
        return answer

    def python(self, *args, **kwargs) -> dict:
        return self.run([sys.executable, *args], **kwargs)

    def start(self, argv: list[str], env: dict | None = None) -> Service:
        """Start a service that prints ``listening on PORT``."""
        answer = self._ask({"start": [str(a) for a in argv], "env": env or {}})
        self.started.append(answer["pid"])
        return Service(answer["pid"], answer["port"])

    def stop(self, service: Service) -> int:
        self.started.remove(service.pid)
        return self._ask({"stop": service.pid})["rc"]

    def in_netns(self, *argv: str) -> list[str]:
        """A command line that runs ``argv`` in this node's namespace (outside its launcher)."""
        return ["ip", "netns", "exec", self.netns, *argv]


class TwoNodes:
    """Nodes ``a`` and ``b``; ``a.ipv4`` reaches ``b.ipv4`` over the veth (and v6)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000:04d}{random.randrange(16**4):04x}"
        self.tag = tag
        octet2, octet3 = random.randrange(200, 250), random.randrange(0, 256)
        v6 = f"fd00:{random.randrange(16**4):x}:{random.randrange(16**4):x}::"
        root = cgroup2_root()
        self.a = Node("a", f"otx-{tag}-a", f"{root}/otelbpf-test-{tag}-a", f"10.{octet2}.{octet3}.1",
                      f"{v6}1", f"otx{tag}a")  # fmt: skip
        self.b = Node("b", f"otx-{tag}-b", f"{root}/otelbpf-test-{tag}-b", f"10.{octet2}.{octet3}.2",
                      f"{v6}2", f"otx{tag}b")  # fmt: skip

    @property
    def nodes(self) -> tuple[Node, Node]:
        return self.a, self.b

    def __enter__(self) -> "TwoNodes":
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self) -> None:
        a, b = self.nodes
        for node in self.nodes:
            _ip("netns", "add", node.netns)
            os.makedirs(node.cgroup, exist_ok=True)
        _ip("link", "add", a.device, "type", "veth", "peer", "name", b.device)
        for node in self.nodes:
            _ip("link", "set", node.device, "netns", node.netns)
            _ip("-n", node.netns, "addr", "add", f"{node.ipv4}/30", "dev", node.device)
            _ip("-n", node.netns, "-6", "addr", "add", f"{node.ipv6}/64", "dev", node.device, "nodad")
            _ip("-n", node.netns, "link", "set", node.device, "up")
            _ip("-n", node.netns, "link", "set", "lo", "up")
        for node in self.nodes:
            cgroup_procs = f"{node.cgroup}/cgroup.procs"

            def enter_cgroup(path=cgroup_procs) -> None:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))

            node.launcher = subprocess.Popen(
                ["ip", "netns", "exec", node.netns, sys.executable, str(NETNODE)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                preexec_fn=enter_cgroup, cwd=str(ROOT),
            )  # fmt: skip
            line = node.launcher.stdout.readline()
            if line.strip() != "node ready":
                raise RuntimeError(f"node {node.name} did not start: {line!r} {node.launcher.stderr.read()}")

    def close(self) -> None:
        for node in self.nodes:
            if node.launcher is not None and node.launcher.poll() is None:
                for pid in node.started:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                node.launcher.stdin.close()
                try:
                    node.launcher.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.launcher.kill()
                    node.launcher.wait()
            _ip("netns", "del", node.netns, check=False)  # the veth pair goes with it
        for node in self.nodes:
            remove_cgroup(node.cgroup)


def remove_cgroup(path: str) -> None:
    """Remove a test cgroup, once whatever is left in it is gone (killed)."""
    if not os.path.isdir(path):
        return
    for _ in range(50):
        try:
            with open(f"{path}/cgroup.procs") as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(path, ignore_errors=True)
