# Two set-up commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/meshplan estimate --preset llama3-405b-16k

test: $(VENV)/.installed-test
	$(PY) -m pytest

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_estimate.py
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/search_speed.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
