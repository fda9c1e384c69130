# Two commands matter: `make demo` and `make test`. Both build .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
# `make demo DEMO_ARGS=--keep-serving` leaves the service up afterwards for the console.
DEMO_ARGS ?=

.PHONY: test lint typecheck unit serve demo soak bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e ".[test]"
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check service tests fixtures bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests/unit

serve: $(STAMP)
	$(BIN)/reconciler serve

demo: $(STAMP)
	$(BIN)/reconciler demo $(DEMO_ARGS)

soak: $(STAMP)
	$(BIN)/python bench/soak.py --operations 10000 --kills 20 --postgres --replicas 2

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
