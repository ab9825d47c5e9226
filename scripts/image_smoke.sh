#!/usr/bin/env bash
# Image smoke test (not in the default test run: minutes, and it needs root and
# a container engine). Builds deploy/Dockerfile, prints the image size, then,
# in a container set up as the DaemonSet does (privileged, host pid
# namespace, /sys and tracefs of the host), runs `otelbpf doctor`, `otelbpf
# demo` and a short `otelbpf run` of a server on the host while curl on the
# host makes requests to it.
#
#   sudo scripts/image_smoke.sh            # IMAGE=otelbpf:smoke BASE=... to override
#
# With no registry reachable, the base image is a Debian 12 rootfs made by
# mmdebstrap from the Debian mirror and imported (BASE=localhost/otelbpf-base:bookworm).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# an engine is one that answers (container_engine.sh): a docker client whose daemon does not
# answer is none, so podman is installed then too
"$here/scripts/container_engine.sh" >/dev/null 2>&1 || apt-get install -y -q podman >/dev/null
engine=$("$here/scripts/container_engine.sh")
image=${IMAGE:-localhost/otelbpf:smoke}
base=${BASE:-}
say() { printf 'image-smoke: %s\n' "$*"; }

if [ -z "$base" ]; then
    if timeout 20 "$engine" pull -q docker.io/library/debian:12-slim >/dev/null 2>&1; then
        base=docker.io/library/debian:12-slim
    else
        base=localhost/otelbpf-base:bookworm
        if ! "$engine" image exists "$base" 2>/dev/null && ! "$engine" image inspect "$base" >/dev/null 2>&1; then
            command -v mmdebstrap >/dev/null || apt-get install -y -q mmdebstrap >/dev/null
            tar=$(mktemp --suffix=.tar)
            say "no registry: making $base with mmdebstrap"
            # As debian:12-slim: minbase without manuals, locales and docs (copyrights kept).
            # usrmerge (and with it perl, ~30 MB) is only needed while the rootfs is made.
            mmdebstrap --variant=minbase \
                --customize-hook='chroot "$1" apt-get purge -y -q usrmerge libfile-find-rule-perl perl perl-modules-5.36 libperl5.36' \
                --customize-hook='chroot "$1" apt-get autoremove --purge -y -q' \
                --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
                --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
                bookworm "$tar" http://deb.debian.org/debian
            "$engine" import "$tar" "$base" >/dev/null
            rm -f "$tar"
        fi
    fi
fi
say "engine $engine, base $base"

# pip inside the build trusts the host's CA bundle (egress proxies that re-sign TLS).
build=("$engine" build -f "$here/deploy/Dockerfile" -t "$image" --build-arg "BASE=$base")
if [ "$engine" = podman ]; then
    build+=(--isolation=chroot --network=host)
    if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
        build+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro --build-arg PIP_CERT=/etc/ssl/host-ca.crt)
    fi
fi
started=$(date +%s)
"${build[@]}" "$here"
say "built $image in $(( $(date +%s) - started ))s, size $("$engine" image inspect "$image" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"

# As the DaemonSet runs it: privileged, host pid namespace, the host's /sys (BTF,
# tracefs). Where the engine cannot start containers (crun on a hybrid-cgroup or
# capability-reduced VM), the same commands run in a build step of a throwaway
# image FROM this one, with --isolation=chroot: that is the host's pid and
# network namespaces and root's capabilities, i.e. what privileged + hostPID give.
out=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 >/dev/null 2>&1 &
server=$!
ctx=$(mktemp -d)
# Requests to it twice a second until the trace below is over (or this script ends).
( while [ -d "$out" ] && [ ! -e "$out/done" ]; do curl -s -o /dev/null "http://127.0.0.1:$port/" || true; sleep 0.5; done ) &
requests=$!
trap 'kill $server $requests 2>/dev/null || true; rm -rf "$out" "$ctx"' EXIT

# The short trace follows the host's server by pid (a host busy with other
# work would make an --all trace of it a needle in a haystack).
steps="/opt/otelbpf/entrypoint.sh doctor
  && /opt/otelbpf/entrypoint.sh demo --requests 5 --json-file /out/demo.json
  && /opt/otelbpf/entrypoint.sh run --pid $server --duration 10 --json-file /out/run.json
  && touch /out/done"
if "$engine" run --rm --entrypoint true "$image" >/dev/null 2>&1; then
    say "doctor, demo and run in a privileged container with the host's pid namespace"
    "$engine" run --rm --privileged --pid=host --network=host -v /sys:/sys -v "$out:/out" \
        --entrypoint sh "$image" -c "$(echo $steps)"
else
    say "'$engine run' cannot start containers here ($("$engine" run --rm --entrypoint true "$image" 2>&1 | tail -n 1));"
    say "running doctor, demo and run in a chroot build step (host pid/network namespaces, root)"
    printf 'FROM %s\nRUN %s\n' "$image" "$(echo $steps)" > "$ctx/Containerfile"
    "$engine" build --isolation=chroot --network=host --no-cache --cap-add=ALL -v /sys:/sys -v "$out:/out" -f "$ctx/Containerfile" "$ctx"
fi
demo_spans=$(grep -o '"spanId"' "$out/demo.json" | wc -l)
host_spans=$(grep -o '"spanId"' "$out/run.json" | wc -l)
say "demo wrote $demo_spans spans; run wrote $host_spans spans of the host's server (pid $server, port $port)"
if [ "$demo_spans" -eq 0 ] || [ "$host_spans" -eq 0 ]; then
    say "FAILED: no spans"
    exit 1
fi
say "OK"
