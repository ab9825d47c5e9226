#!/usr/bin/env bash
# Prints the container engine command to build and run images with: podman if
# present, else docker if its daemon answers. Podman gets --isolation=chroot
# for builds where it cannot create namespaces of its own (nested in a VM or a
# container): CONTAINER_BUILD_FLAGS. Sourced by `make image` and image_smoke.sh.
set -euo pipefail
if command -v podman >/dev/null 2>&1; then
    echo podman
elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
else
    echo "no container engine: install podman (apt-get install -y podman; scripts/image_smoke.sh does) or start docker" >&2
    exit 1
fi
