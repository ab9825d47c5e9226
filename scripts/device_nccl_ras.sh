#!/usr/bin/env bash
# Real NCCL's RAS against otelbpf's RAS client and parser, on a machine with one NVIDIA GPU.
#
# Starts one NCCL rank (PyTorch, backend "nccl", world size 1) that runs all-reduces and then
# keeps its communicator open; asks NCCL's RAS on localhost:28028 (NCCL_RAS_ADDR) for its
# report in text and in JSON (JSON only where NCCL offers it: 2.28.7+), the way the agent
# does (otelbpf/sources/nccl_ras.py `converse`, protocols/nccl/ras.py); and prints what the
# parser makes of each reply: communicators (commHash), ranks, per-function counts, missing
# ranks. The raw replies are written to $OUT (default ./nccl-ras-out) so that they can be
# added to the tests as real samples.
#
# Needs: python3 with torch (a CUDA build, with its NCCL: the pip wheel's nvidia-nccl-cu12)
# and this repository (protocols/ is pure Python; otelbpf's client is used when importable,
# else the same conversation inline). NCCL >= 2.24 for RAS at all.
#
#   bash scripts/device_nccl_ras.sh                  # one rank, both formats
#   NCCL_RAS_QUERY_ONLY=1 bash scripts/device_nccl_ras.sh   # ask a RAS already answering
#                                                    # (e.g. examples/nccl_ras_standin.py)
#
# Exit status 0 when every format the server offered was read by the parser and the
# all-reduce count RAS reports is the one the rank ran (or, query-only, any count).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
python="${PYTHON:-python3}"
out="${OUT:-$PWD/nccl-ras-out}"
collectives="${COLLECTIVES:-100}"
address="${NCCL_RAS_ADDR:-localhost:28028}"
mkdir -p "$out"

rank_pid=""
cleanup() { if [ -n "$rank_pid" ]; then kill "$rank_pid" 2>/dev/null || true; wait "$rank_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT

if [ -z "${NCCL_RAS_QUERY_ONLY:-}" ]; then
    "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device for torch")'
    fifo="$out/rank.fifo"
    rm -f "$fifo"; mkfifo "$fifo"
    # The rank: one all-reduce creates the communicator (PyTorch creates it lazily), then
    # $collectives more; it prints its NCCL version and count, then waits to be killed.
    MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29533}" "$python" - "$collectives" >"$fifo" 2>"$out/rank.log" <<'EOF' &
import sys, time
import torch
import torch.distributed as dist

n = int(sys.argv[1])
torch.cuda.set_device(0)
try:  # eager communicator creation (PyTorch 2.3+); else the first all-reduce creates it
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
except TypeError:
    dist.init_process_group("nccl", rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
for _ in range(n):
    dist.all_reduce(x)
torch.cuda.synchronize()
print("nccl", ".".join(map(str, torch.cuda.nccl.version())), "allreduces", n, flush=True)
while True:
    time.sleep(60)
EOF
    rank_pid=$!
    read -r _ nccl_version _ ran <"$fifo" || { echo "device_nccl_ras: the rank failed:" >&2; cat "$out/rank.log" >&2; exit 1; }
    echo "device_nccl_ras: rank pid $rank_pid, NCCL $nccl_version, $ran all-reduces"
    sleep 2   # RAS's threads start with the communicator
else
    ran=""
fi

PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$address" "$out" "$ran" <<'EOF'
import json, socket, sys, time

from protocols.nccl import ras

address, out, ran = sys.argv[1], sys.argv[2], sys.argv[3]
host, _, port = address.rpartition(":")
host = host.strip("[]") or "localhost"


def connect():
    for family, kind, proto, _n, where in socket.getaddrinfo(host, int(port), 0, socket.SOCK_STREAM):
        try:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(5)
            sock.connect(where)
            print(f"connected to {where[0]}:{where[1]}")
            return sock
        except OSError as exc:
            print(f"no answer on {where[0]}:{where[1]}: {exc}")
    sys.exit("device_nccl_ras: RAS does not answer (NCCL < 2.24, NCCL_RAS_ENABLE=0, or no communicator)")


def read_all(sock) -> bytes:
    sock.settimeout(30)
    parts = []
    while chunk := sock.recv(65536):
        parts.append(chunk)
    return b"".join(parts)


def line(sock) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
    return data.rstrip(b"\r\n")


def ask_text() -> bytes:
    with connect() as sock:
        sock.sendall(ras.hello())
        print("  server:", line(sock).decode(errors="replace"))
        sock.sendall(ras.timeout_command(5))
        line(sock)
        sock.sendall(ras.status_command(verbose=True))
        return read_all(sock)


def ask_json() -> bytes | None:
    try:  # the agent's own conversation (JSON when offered, else text)
        from otelbpf.sources.nccl_ras import converse
    except Exception as exc:  # otelbpf not importable here: the same steps inline
        print(f"  (otelbpf's client not importable: {exc}; asking inline)")
        converse = None
    with connect() as sock:
        if converse is not None:
            data, _window = converse(sock)
            return data if data.lstrip().startswith(b"{") else None
        sock.sendall(ras.hello())
        line(sock)
        sock.sendall(ras.timeout_command(5))
        line(sock)
        sock.sendall(ras.format_command("json"))
        answer = line(sock)
        print("  SET FORMAT json:", answer.decode(errors="replace"))
        if not ras.accepted(answer):
            return None
        sock.sendall(ras.status_command(verbose=True))
        return read_all(sock)


def show(name: str, data: bytes) -> bool:
    path = f"{out}/ras-{name}.out"
    with open(path, "wb") as f:
        f.write(data)
    print(f"{name}: {len(data)} bytes -> {path}")
    print("  " + data[:600].decode(errors="replace").replace("\n", "\n  "))
    try:
        report = ras.parse_report(data)
    except ras.RasParseError as exc:
        print(f"  PARSE ERROR: {exc}")
        return False
    fine = True
    print(f"  parsed ({report.format}): NCCL {report.nccl_version or '?'}, timeouts {report.timeouts}, dead {report.dead_processes}")
    for comm in report.communicators:
        counts = comm.counts_by_function()
        print(f"  communicator {comm.comm_hash:016x}: size {comm.size}, ranks {len(comm.ranks)}, "
              f"missing {len(comm.missing)}, counts {json.dumps(counts)}, spread {comm.spread()}")
        if ran and name == "json":
            allreduce = {c for c in counts.get("AllReduce", {}).values()}
            expected = int(ran)
            print(f"  AllReduce counted by RAS: {sorted(allreduce)}; the rank ran {expected}")
            fine &= allreduce == {expected}
    if not report.communicators:
        print("  no communicator in the report")
    return fine


ok = show("text", ask_text())
time.sleep(1)  # RAS has crashed under tight polling: space the two questions
data = ask_json()
if data is None:
    print("json: not offered by this NCCL (2.28.7+ only)")
else:
    ok &= show("json", data)
sys.exit(0 if ok else 1)
EOF
