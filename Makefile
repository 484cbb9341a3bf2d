# The two README commands. Both create .venv in the repository root when it is
# missing, so a fresh machine needs nothing but Python 3.11+ and make. Installs use the exact versions
# of requirements/constraints.txt, so results are those the README reports.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stalesgd-installed
CONSTRAINTS := requirements/constraints.txt
DEMO_DIR ?= runs/demo

.PHONY: test test-fast lint format demo clean-venv mutation-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip

$(STAMP): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) -m pip install -c $(CONSTRAINTS) -e '.[train,test]'
	touch $(STAMP)

# Two pytest workers, one test file each at a time (pytest-xdist): the suite's multi-process and compile-bound
# tests leave a core idle when run one by one. Files go out in collection order, the longest first
# (tests/conftest.py, LONG_FILES), not xdist's default order by number of tests.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder
test: lint
	$(PY) -m pytest tests $(XDIST)

# The development subset: every tests/<package>/ without the tests marked slow (whole training runs, subprocesses,
# multi-process runs and compile-bound matrices; pyproject.toml's markers). CI runs `make test`, all of them.
test-fast: lint
	$(PY) -m pytest tests $(XDIST) -m "not slow"

# The formatter and the linter ([tool.ruff] in pyproject.toml), pinned by the test extra; `make test` runs this
# first, so CI fails on an unformatted or unclean tree. `make format` fixes what can be fixed.
LINTED := stalesgd tests experiments
lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINTED)
	$(VENV)/bin/ruff check --fix $(LINTED)

demo: $(STAMP)
	$(VENV)/bin/stalesgd-reproduce --study=demo --seeds=3 --parallel=auto --workdir=$(DEMO_DIR)

clean-venv:
	rm -rf $(VENV)

# The mutation-testing tool (pyproject.toml's `mutation` extra) in its own environment: experiments/mutation.py
# runs it, and it runs the project's $(VENV) for each mutant's tests. Not part of `make test`.
MUTATION_VENV := .venv-mutation
mutation-venv:
	$(PYTHON) -m venv $(MUTATION_VENV)
	$(MUTATION_VENV)/bin/pip install "$$($(PYTHON) -c 'import tomllib; print(next(p for p in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["mutation"]))')"
