# Two commands set everything up on a fresh machine: `make lab` and `make test`.

VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jaxsys-installed
# The first interpreter >= 3.12 that actually runs (a pyenv shim may exist but fail).
PYTHON ?= $(shell for p in python3.12 python3.13 python3 $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3); do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$p; break; }; done)
PYTEST_ARGS ?=
# Test files run on this many workers (pytest-xdist), each file whole on one worker, so that a
# module's shared cluster or kernel is started once. Most of a live test's time is spent
# waiting on other processes: on 2 cores, one worker took 34 min from a fresh clone, three
# took 17 min. Four took 16.5 min against three's 17.3 on the same day, but the cores were
# then 91 % busy and the tests' own times 27 % longer, and two timing-bound tests failed: the
# cores, not the waits, are the limit. TEST_WORKERS=1 runs them one after another.
TEST_WORKERS ?= 3

.PHONY: install lab test lint bench docs clean

# The editable install also builds the JupyterLab extension (Node), again when its sources change.
LABEXTENSION := labextension/package.json labextension/yarn.lock $(wildcard labextension/src/*.ts) $(wildcard labextension/style/*)

$(STAMP): pyproject.toml $(LABEXTENSION)
	@test -n "$(PYTHON)" || { echo "Python >= 3.12 is required (set PYTHON=/path/to/python3.12)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(VENV)/bin/jaxsys install-kernel --prefix $(VENV)
	@touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jaxsys lab --notebook-dir notebooks

test: $(STAMP)
	$(VENV)/bin/ruff check jaxsys_kernel tests bench
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check jaxsys_kernel tests bench
	$(VENV)/bin/ruff format --check jaxsys_kernel tests bench
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) bench/dispatch.py
	$(PY) bench/bringup.py
	$(PY) bench/faults.py
	for b in collation telemetry_overhead sharding_scale refusals hostile compile_cache data_loading divergence profile launchers scale telemetry_scale chaos; do [ ! -f bench/$$b.py ] || $(PY) bench/$$b.py; done

# The course site: every notebook executed with the jaxsys kernel, rendered to build/site/html.
docs: $(STAMP)
	$(PY) docs/site/build.py --execute --out build/site

clean:
	rm -rf $(VENV) build dist *.egg-info labextension/lib labextension/prebuilt labextension/node_modules
