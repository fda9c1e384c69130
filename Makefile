# Two commands matter: `make demo` and `make test`. Both build .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
# `make demo DEMO_ARGS=--keep-serving` leaves the service up afterwards for the console.
DEMO_ARGS ?=

# Test processes: the suite waits on sockets and subprocesses as much as it computes, so
# more workers than cores is fastest here (measured: see docs/testing.md).
WORKERS ?= 6
# Bytecode is a cache the tests need: without it every xdist worker rewrites the asserts of
# every test module again (about 6 s of CPU each) and every service subprocess compiles
# the package from source.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: test lint typecheck unit serve demo soak bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) install -e ".[test,ray]"
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check service tests fixtures bench

typecheck: $(STAMP)
	$(BIN)/mypy

# mypy runs beside the tests (it is one process on one core for a fresh cache); the target
# fails if either does. A collection pass first writes the tests' assert-rewritten bytecode,
# which the workers then read instead of each rewriting every module (its errors, if any,
# show again in the real run).
test: lint
	@$(BIN)/mypy & mypy=$$!; \
	$(BIN)/pytest -p no:cacheprovider --collect-only -q >/dev/null; \
	$(BIN)/pytest -p no:cacheprovider -n $(WORKERS) --durations=15; status=$$?; \
	wait $$mypy || status=1; exit $$status

unit: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider tests/unit

serve: $(STAMP)
	$(BIN)/reconciler serve

demo: $(STAMP)
	$(BIN)/reconciler demo $(DEMO_ARGS)

soak: $(STAMP)
	$(BIN)/python bench/soak.py --operations 10000 --kills 20 --postgres --replicas 2

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
