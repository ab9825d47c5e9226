# The two commands of the README. Both install first (idempotent, seconds when done).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test bench doctor clean image image-multiarch image-smoke chart-check

install:
	@bash scripts/install.sh

demo: install
	$(VENV)/bin/otelbpf demo

# Two workers, a test file to each at a time (conftest.py); TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup,) $(PYTEST_ARGS)

bench: install
	$(PY) bench/nginx_wrk.py $(BENCH_ARGS)

doctor: install
	$(VENV)/bin/otelbpf doctor

# The agent image (deploy/Dockerfile) with podman, or docker if its daemon runs.
# IMAGE names it (your registry), BASE the Debian 12 base image.
IMAGE ?= otelbpf:$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
BASE ?= docker.io/library/debian:12-slim
ENGINE = $(shell scripts/container_engine.sh)
BUILD_FLAGS = $(if $(filter podman,$(ENGINE)),--isolation=chroot,)

image:
	$(ENGINE) build $(BUILD_FLAGS) --build-arg BASE=$(BASE) -f deploy/Dockerfile -t $(IMAGE) .

# amd64 + arm64 in one manifest list (podman; docker: `docker buildx build
# --platform linux/amd64,linux/arm64 --push`). The foreign stage runs under
# qemu-user-static (apt-get install -y qemu-user-static binfmt-support).
image-multiarch:
	podman build $(BUILD_FLAGS) --platform linux/amd64,linux/arm64 --build-arg BASE=$(BASE) \
		-f deploy/Dockerfile --manifest $(IMAGE) .

# Builds the image and runs doctor, demo and a short trace in it (minutes; root).
image-smoke:
	bash scripts/image_smoke.sh

# Where helm exists: lint the chart and validate its rendering like the plain manifests.
chart-check:
	helm lint deploy/helm/otelbpf
	helm template otelbpf deploy/helm/otelbpf -n otelbpf > /tmp/otelbpf-chart.yaml
	$(VENV)/bin/kubernetes-validate --strict /tmp/otelbpf-chart.yaml

clean:
	rm -rf $(VENV) otelbpf-demo.json .pytest_cache
