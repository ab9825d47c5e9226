"""One "node" of a two-node test: the parent of every process the test runs on it.

Started inside the node's network namespace (``ip netns exec``) and cgroup, before
the node's agent, which traces it by ``--pid`` (and so every process it starts
later, as children inherit the agent's filter): what a DaemonSet's agent does
for its whole node, scoped to this process tree.

It reads commands as JSON lines on stdin and answers each on stdout:

* ``{"run": [argv...], "timeout": s}`` runs a command to its end:
  ``{"rc": int, "stdout": str, "stderr": str}``;
* ``{"start": [argv...]}`` starts a service that prints ``listening on PORT``:
  ``{"pid": int, "port": int}`` (or ``{"error": ...}``);
* ``{"stop": pid}`` terminates one it started: ``{"rc": int}``.

Prints ``node ready`` once it reads commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> None:
    services: dict[int, subprocess.Popen] = {}
    print("node ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        env = {**os.environ, **command.get("env", {})}
        try:
            if "run" in command:
                done = subprocess.run(
                    command["run"], capture_output=True, text=True, errors="replace", timeout=command.get("timeout", 120), env=env
                )
                answer = {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
            elif "start" in command:
                proc = subprocess.Popen(command["start"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                first = proc.stdout.readline()
                if first.startswith("listening on "):
                    services[proc.pid] = proc
                    answer = {"pid": proc.pid, "port": int(first.split()[-1])}
                else:
                    proc.kill()
                    answer = {"error": f"{command['start']}: {first!r} {proc.stderr.read()}"}
            elif "stop" in command:
                proc = services.pop(command["stop"])
                proc.terminate()
                try:
                    rc = proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
                answer = {"rc": rc}
            else:
                answer = {"error": f"unknown command {command}"}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
            answer = {"error": repr(exc)}
        print(json.dumps(answer), flush=True)
    for proc in services.values():
        proc.kill()


if __name__ == "__main__":
    main()
