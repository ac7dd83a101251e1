# Two set-up commands for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# the training engines' own config parsers, in a venv of their own (their dependencies are not
# meshplan's): `make engines` installs them; `make test` then runs their tests there too
ENGINES := .venv-engines
EPY := $(ENGINES)/bin/python
# Megatron-LM's parse_args/validate_args: megatron-core's wheel for CPython 3.11 carries
# megatron/training but declares Requires-Python >= 3.12 (tests/test_interop_engines.py says what
# 3.11 lacks); its dependencies (torch, numpy, packaging) come with the engines extra
MEGATRON_CORE := megatron-core==0.19.2
# torchtitan's 0.2 line (JobConfig, TOML), still in use: beside 0.3.0, on PYTHONPATH for its own tests
TORCHTITAN_02 := $(ENGINES)/torchtitan-0.2

.PHONY: run test bench clean engines

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

$(ENGINES)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(ENGINES)
	$(EPY) -m pip install -q --upgrade pip setuptools wheel
	$(EPY) -m pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(EPY) -m pip install -q --no-build-isolation -e '.[engines]'
	$(EPY) -m pip install -q --no-deps --ignore-requires-python $(MEGATRON_CORE)
	$(EPY) -m pip install -q --no-deps --target $(TORCHTITAN_02) torchtitan==0.2.2
	touch $@

engines: $(ENGINES)/.installed

# the suite in as many processes as the machine has cores, up to 4 (pytest-xdist; `-n 0` runs it in one)
test: $(VENV)/.installed-test
	$(PY) -m pytest -n auto --maxprocesses 4
	@if [ -f $(ENGINES)/.installed ]; then \
		echo "the engines' own parsers and validators ($(ENGINES)):"; \
		$(EPY) -m pytest -q -p no:cacheprovider tests/test_interop_engines.py && \
		echo "torchtitan 0.2.2 ($(TORCHTITAN_02)):" && \
		PYTHONPATH=$(TORCHTITAN_02) $(EPY) -m pytest -q -p no:cacheprovider tests/test_interop_engines.py -k torchtitan_config_manager_reads; \
	else echo "engines not installed (make engines): tests/test_interop_engines.py ran skipped"; fi

bench: $(VENV)/.installed
	$(PY) benchmarks/bench_estimate.py
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/search_speed.py

clean:
	rm -rf $(VENV) $(ENGINES) build src/*.egg-info .pytest_cache
