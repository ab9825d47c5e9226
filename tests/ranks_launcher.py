"""Starts NCCL ranks (examples/nccl_ranks.py) as its children, on command, for
tests/test_ebpf_ranks.py: run it inside a network namespace ("a node") and trace it with
``otelbpf run --pid`` (a process and its children), so one agent per node follows the ranks of
every scenario without restarting.

Commands on stdin, one per line, each answered with one line on stdout:

    start NAME JSON                 -> "started NAME PID" (JSON: {"args": [...], "env": {...}})
    expect NAME WORD                -> "got NAME WORD" once the rank printed WORD (ready, initialised,
                                       done), "failed NAME RC" if it exited instead
    go NAME                         -> "went NAME" (a line to the rank: it goes on)
    stop                            -> kills every rank, "stopped"
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RANKS = os.path.join(os.path.dirname(HERE), "examples", "nccl_ranks.py")


def main() -> None:
    ranks: dict[str, subprocess.Popen] = {}
    print("launcher", flush=True)
    for line in sys.stdin:
        words = line.split(" ", 2)
        command, name = words[0].strip(), words[1].strip() if len(words) > 1 else ""
        if command == "start":
            spec = json.loads(words[2])
            args, env = spec["args"], spec["env"]
            ranks[name] = subprocess.Popen(
                [sys.executable, RANKS, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                env={**os.environ, **env},
            )  # fmt: skip
            print(f"started {name} {ranks[name].pid}", flush=True)
        elif command == "expect":
            word = words[2].strip()
            said = ranks[name].stdout.readline().strip()
            print(f"got {name} {word}" if said == word else f"failed {name} {ranks[name].wait()}", flush=True)
        elif command == "go":
            ranks[name].stdin.write("go\n")
            ranks[name].stdin.flush()
            print(f"went {name}", flush=True)
        elif command == "stop":
            for rank in ranks.values():
                if rank.poll() is None:
                    rank.kill()
                rank.wait()
            ranks.clear()
            print("stopped", flush=True)


if __name__ == "__main__":
    main()
