# Every target creates/reuses .venv. torch is pinned to the CPU wheel here (the package itself
# only asks for torch>=2.3) so a fresh machine never pulls a multi-GB CUDA build.
# Two stamps on the one .venv: `make demo` installs only what the demo runs (the package with
# its `train` extra: torch, scikit-learn, matplotlib); `make test`/`lint`/`typecheck`/`install`
# install everything (`all` = train + ray + stream, and `dev`). A controller-only install is
# `pip install coadapt` (no torch): see README.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed
TORCH_PIN ?= torch==2.13.0
# Where the CPU wheel comes from when pip's configured indexes lack it, e.g.
# `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` (empty: pip's own config).
TORCH_INDEX ?=
# Test processes (pytest-xdist). Most tests wait on the real processes they start (imports,
# servers coming up), so on 2 cores three workers finish sooner than two (6:24-6:46 vs
# 7:19-7:58 for the parallel part, measured) and the whole suite stays under 10 minutes; each test
# file stays on one worker (module fixtures are started once). Tests marked `serial`
# (timing-sensitive: steps lost to a kill, ranks agreeing on a stop) run afterwards, alone.
# `make test TEST_WORKERS=0`: one process.
TEST_WORKERS ?= 3

.PHONY: install demo test lint typecheck bench clean

$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_PIN)" $(if $(TORCH_INDEX),--extra-index-url "$(TORCH_INDEX)")
	$(BIN)/python -m pip install --quiet -e ".[train]"
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/coadapt demo

test: $(STAMP)
	$(BIN)/ruff check coadapt tests benchmarks examples
	$(BIN)/ruff format --check coadapt tests benchmarks examples
	$(BIN)/mypy
ifeq ($(TEST_WORKERS),0)
	$(BIN)/python -m pytest -q
else
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -q -m serial
endif

lint: $(STAMP)
	$(BIN)/ruff check coadapt tests benchmarks examples
	$(BIN)/ruff format --check coadapt tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info
