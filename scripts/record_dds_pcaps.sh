#!/usr/bin/env bash
# Record the RTPS golden captures (tests/golden/rtps/) from real Cyclone DDS
# processes (examples/dds_pipeline.py, the cyclonedds package of the venv) on
# loopback, unicast discovery, no shared memory. Run as root (tcpdump).
#
#   sudo bash scripts/record_dds_pcaps.sh
#
#   chain.pcap     camera -> detector -> planner, 3 frames of 64 bytes at 5 Hz
#   fragments.pcap camera -> planner-less detector, 2 frames of 20000 bytes:
#                  each sample crosses as DATA_FRAG submessages
#   service.pcap   service-client -> service-server: 2 requests on
#                  rq/plan_pathRequest answered on rr/plan_pathReply
#
#   fastdds.pcap            examples/fastdds image_node (Fast DDS 2.9) publisher -> subscriber,
#                           UDPv4 on loopback, 3 frames of 64 bytes
#   fastdds_fragments.pcap  the same, 2 frames of 100000 bytes: DATA_FRAG of 65324-byte fragments
#   fastdds_cyclone.pcap    Fast DDS publisher -> Cyclone DDS subscriber (dds_pipeline.py sink),
#                           3 frames: the two vendors interoperate
#
# Name cases to record only those (`sudo bash scripts/record_dds_pcaps.sh fastdds`);
# with none, all are recorded.
#
# Only the DDS ports (7400-7700: domain 0, Cyclone's port mapping) are captured.
# Everything runs from the start of the capture, so discovery (SPDP/SEDP) is
# in it and the spans name their topics.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
golden="$here/tests/golden/rtps"
py="${PYTHON:-$here/.venv/bin/python}"
example="$here/examples/dds_pipeline.py"
fastdds="$here/examples/fastdds/build/image_node"
work=$(mktemp -d)
tcpdump_pid=""
cleanup() {
    [ -n "$tcpdump_pid" ] && kill -INT "$tcpdump_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || { echo "record_dds_pcaps: must run as root (tcpdump)" >&2; exit 1; }
mkdir -p "$golden"

start_capture() {
    rm -f "$golden/$1"
    tcpdump -i lo -Z root --immediate-mode -U -w "$golden/$1" "udp portrange 7400-7700" 2>"$work/tcpdump.log" &
    tcpdump_pid=$!
    for _ in $(seq 100); do
        grep -q "listening on" "$work/tcpdump.log" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "record_dds_pcaps: tcpdump did not start" >&2
    exit 1
}

stop_capture() {
    sleep 1
    kill -INT "$tcpdump_pid"
    wait "$tcpdump_pid" || true
    tcpdump_pid=""
    echo "record_dds_pcaps: $(stat -c %s "$golden/$1") bytes  $1"
}

record_chain() {
    start_capture chain.pcap
    "$py" "$example" planner --seconds 5 >/dev/null &
    planner=$!
    "$py" "$example" detector --seconds 5 >/dev/null &
    detector=$!
    sleep 1
    "$py" "$example" camera --frames 3 --rate 5 --linger 1 >/dev/null
    wait "$planner" "$detector"
    stop_capture chain.pcap
}

record_fragments() {
    start_capture fragments.pcap
    "$py" "$example" detector --seconds 4 >/dev/null &
    detector=$!
    sleep 1
    "$py" "$example" camera --frames 2 --rate 5 --size 20000 --linger 1 >/dev/null
    wait "$detector"
    stop_capture fragments.pcap
}

record_service() {
    start_capture service.pcap
    "$py" "$example" service-server --seconds 5 >/dev/null &
    server=$!
    sleep 1
    "$py" "$example" service-client --frames 2 --rate 5 --linger 1 >/dev/null
    wait "$server"
    stop_capture service.pcap
}

record_fastdds_case() {  # name, frames, bytes
    start_capture "$1.pcap"
    "$fastdds" subscriber --seconds 4 >/dev/null &
    subscriber=$!
    sleep 1
    "$fastdds" publisher --frames "$2" --rate 5 --size "$3" --linger 1 >/dev/null
    wait "$subscriber"
    stop_capture "$1.pcap"
}

record_fastdds() { record_fastdds_case fastdds 3 64; }
record_fastdds_fragments() { record_fastdds_case fastdds_fragments 2 100000; }

record_fastdds_cyclone() {
    start_capture fastdds_cyclone.pcap
    "$py" "$example" sink --seconds 4 >/dev/null &
    sink=$!
    sleep 1
    "$fastdds" publisher --frames 3 --rate 5 --size 64 --linger 1 >/dev/null
    wait "$sink"
    stop_capture fastdds_cyclone.pcap
}

[ -x "$fastdds" ] || make -s -C "$here/examples/fastdds"
for case in "${@:-chain fragments service fastdds fastdds_fragments fastdds_cyclone}"; do
    for name in $case; do "record_$name"; done
done
