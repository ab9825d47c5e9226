# The two commands of the README. Both install first (idempotent, seconds when done).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test bench doctor clean

install:
	@bash scripts/install.sh

demo: install
	$(VENV)/bin/otelbpf demo

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: install
	$(PY) bench/nginx_wrk.py $(BENCH_ARGS)

doctor: install
	$(VENV)/bin/otelbpf doctor

clean:
	rm -rf $(VENV) otelbpf-demo.json .pytest_cache
