# Two entry points: `make demo` and `make test`. Everything else is plumbing they call.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test venv lint pytest bazel-setup bazel-test clean

venv: $(STAMP)

# Re-install only when the dependency pins or the package metadata change.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check serving_opt tests

pytest: $(STAMP)
	$(PY) -m pytest -q tests

test: $(STAMP) lint pytest bazel-test

clean:
	rm -rf build
