# Every target creates/reuses .venv. torch is pinned to the CPU wheel here (the package itself
# only asks for torch>=2.3) so a fresh machine never pulls a multi-GB CUDA build.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test lint typecheck bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)"
	$(BIN)/python -m pip install --quiet -e ".[dev,ray]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/coadapt demo

test: $(STAMP)
	$(BIN)/ruff check coadapt tests benchmarks examples
	$(BIN)/ruff format --check coadapt tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check coadapt tests benchmarks examples
	$(BIN)/ruff format --check coadapt tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
