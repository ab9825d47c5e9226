#!/usr/bin/env bash
# Install everything otelbpf needs on a Debian 12 host, as root. Idempotent:
# a second run only checks and finishes in a couple of seconds.
#
#   1. Debian packages: BCC (python3-bpfcc), kernel headers, and the tools the
#      demo, tests and benchmark drive (curl, nginx, wrk, iproute2, tcpdump,
#      prometheus: Debian's server and promtool evaluate the shipped rules).
#   2. Kernel headers: BCC compiles its C programs against
#      /lib/modules/$(uname -r)/build. When this kernel ships no headers, the
#      nearest Debian headers (linux-headers-<arch>) are linked there instead.
#      otelbpf never dereferences kernel structs by header layout, so the
#      version mismatch is harmless (see DEVELOPERS.md, "Kernel headers").
#   3. tracefs mounted at /sys/kernel/tracing.
#   4. A venv (.venv) on Debian's /usr/bin/python3 with --system-site-packages
#      so it can import Debian's `bcc`, and `pip install -e .[test]` into it,
#      which compiles the hot-path modules with Cython in place (setup.py; the
#      list is pyproject.toml's [tool.otelbpf] compiled). Here the compile must
#      succeed (OTELBPF_REQUIRE_COMPILED=1); the stamp covers those sources, so
#      editing one rebuilds.
#   5. The stand-in CUDA runtime, driver and NCCL libraries the GPU tests and
#      the inference example probe (examples/cuda_standin, gcc; no GPU needed).
#   6. The Fast DDS publisher/subscriber of the DDS tests (examples/fastdds,
#      g++ against Debian's libfastrtps-dev, Fast DDS 2.9).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv="${OTELBPF_VENV:-$here/.venv}"
say() { printf 'install: %s\n' "$*"; }

# The compiled modules (one list, in pyproject.toml) and their sources (.py, .pxd), the
# compiled fast path ([tool.otelbpf] fast: .pyx, and a .pxd beside it) and the native
# unwinder of profiles (plain C, setup.py native_extensions): what the stamp hashes, so
# that editing any of them rebuilds. (Needs python3: called after the packages.)
find_compiled_sources() {
    local lists
    lists=$(/usr/bin/python3 -c 'import sys, tomllib; t = tomllib.load(open(sys.argv[1], "rb"))["tool"]["otelbpf"]; print(" ".join(t["compiled"] + t.get("fast", [])))' "$here/pyproject.toml")
    compiled_sources=()
    for m in $lists; do
        for f in "$here/${m//.//}.py" "$here/${m//.//}.pyx" "$here/${m//.//}.pxd"; do
            [ -e "$f" ] && compiled_sources+=("$f")
        done
    done
    compiled_sources+=("$here/otelbpf/profiles/native/_dwunwind.c")
}

if [ "${1:-}" = "--list-compiled-sources" ]; then  # what the stamp hashes (tests/test_compiled.py)
    find_compiled_sources
    printf '%s\n' "${compiled_sources[@]#"$here/"}"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "install: must run as root (installs Debian packages, links kernel headers)" >&2
    exit 1
fi

arch=$(dpkg --print-architecture)   # amd64, arm64
packages=(python3 python3-venv python3-bpfcc "linux-headers-$arch" curl nginx-light wrk iproute2 tcpdump
          openssl   # the TLS tests make a self-signed certificate with it
          libcap2-bin                  # capsh: tests/test_identity.py runs the agent with fewer capabilities
          iptables                     # tests/test_ebpf_dds.py drops packets in its own network namespace
          golang-go                    # tests/test_deploy.py renders the Helm chart with Go templates (no helm here)
          make                         # builds examples/cuda_standin and examples/fastdds
          g++ libfastrtps-dev          # examples/fastdds: tests/test_ebpf_fastdds.py's Fast DDS nodes
          libdw-dev libelf-dev         # otelbpf/profiles/native: DWARF CFI unwinding of sampled stacks (elfutils' libdw)
          chromium                     # tests/test_profiles_flamegraph.py opens the flame graph headless
          prometheus                   # promtool and the server: tests/test_prometheus_rules.py, tests/test_ebpf_ranks.py
          gcc libc6-dev python3-dev)   # the last three build the Cython extensions
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    # nginx-light's postinst starts a server on :80; the project starts its own.
    systemctl disable --now nginx >/dev/null 2>&1 || service nginx stop >/dev/null 2>&1 || true
    pkill -x nginx 2>/dev/null || true
    # prometheus's postinst starts a server on :9090; the tests start their own.
    systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true
fi

# Kernel headers: exact ones if the running kernel has them, else the fallback.
kdir="/lib/modules/$(uname -r)"
if [ -e "$kdir/build/include/linux/kconfig.h" ] || [ -e "$kdir/build/include/generated/autoconf.h" ]; then
    say "kernel headers: $(readlink -f "$kdir/build")"
else
    arch_dir=$(ls -d /usr/src/linux-headers-*-"$arch" 2>/dev/null | sort -V | tail -n 1)
    common_dir=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$arch_dir" ] || [ -z "$common_dir" ]; then
        echo "install: no kernel headers for $(uname -r) and no Debian fallback in /usr/src" >&2
        exit 1
    fi
    mkdir -p "$kdir"
    ln -sfn "$arch_dir" "$kdir/build"
    ln -sfn "$common_dir" "$kdir/source"
    say "kernel headers: fallback $arch_dir (+ $common_dir) for $(uname -r)"
fi

if ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
    mount -t tracefs tracefs /sys/kernel/tracing && say "mounted tracefs at /sys/kernel/tracing"
fi

# Stand-in GPU libraries (make rebuilds only what changed).
make -s -C "$here/examples/cuda_standin" && say "stand-in CUDA/NCCL libraries: examples/cuda_standin/build"
make -s -C "$here/examples/fastdds" && say "Fast DDS nodes: examples/fastdds/build/image_node"

find_compiled_sources
# Each listed module must import as its extension, built after its sources changed.
check_compiled='
import importlib, importlib.machinery, os, sys
for name, src in zip(sys.argv[1::2], sys.argv[2::2]):
    m = importlib.import_module(name)
    assert isinstance(m.__loader__, importlib.machinery.ExtensionFileLoader), name + " is not compiled"
    assert os.path.getmtime(m.__file__) >= os.path.getmtime(src), name + " is older than " + src
'
check_args=()
for f in "${compiled_sources[@]}"; do
    m=${f#"$here/"}; m=${m%.*}; check_args+=("${m//\//.}" "$f")
done

stamp="$venv/.otelbpf-installed"
want=$(cat "$here/pyproject.toml" "$here/setup.py" "$0" "${compiled_sources[@]}" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c 'import bcc, otelbpf' 2>/dev/null \
    && "$venv/bin/python" -c "$check_compiled" "${check_args[@]}" 2>/dev/null; then
    say "venv up to date: $venv"
    exit 0
fi
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    say "$venv has no working pip (an interrupted install?): making it again"
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    say "creating venv $venv (Debian python3, with system site-packages for bcc)"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
say "pip install -e .[test] (compiles the modules of pyproject.toml's [tool.otelbpf] compiled and fast)"
# (some hosts' pip config names local mirrors that may be absent: drop those warnings)
OTELBPF_REQUIRE_COMPILED=1 "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$here[test]" 2>&1 | { grep -v '^WARNING: Location' || true; }
"$venv/bin/python" -c 'import bcc, otelbpf, protocols' 
"$venv/bin/python" -c "$check_compiled" "${check_args[@]}" || { echo "install: the compiled modules were not built" >&2; exit 1; }
echo "$want" > "$stamp"
say "done: $venv/bin/otelbpf"
