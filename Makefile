# Two commands for a fresh machine (see README):
#   make run    set up .venv and generate the default dataset on the embedded model (no key)
#   make test   set up .venv and run ruff, mypy and the test suite (on every core)
#   make fast   the tests not marked e2e (the quick loop while changing the code)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Offline machines: use shared tiktoken encodings when the folder is there (see README).
TIKTOKEN_DIR := $(wildcard ../shared/data/tiktoken)
ifneq ($(TIKTOKEN_DIR),)
export TIKTOKEN_CACHE_DIR ?= $(abspath $(TIKTOKEN_DIR))
endif

.PHONY: setup run test fast lint

# PyPI has no llama-cpp-python wheel, so pip compiles llama.cpp (once per machine: pip keeps
# the wheel). spasm runs a text model only, so the multimodal library (mtmd) is not built:
# 509 s instead of 660 s on 2 cores (pip wheel --no-cache-dir llama-cpp-python==0.3.36).
# A CMAKE_ARGS of your own (e.g. -DGGML_CUDA=on) is kept.
$(BIN)/spasm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	CMAKE_ARGS="$$CMAKE_ARGS -DLLAVA_BUILD=OFF" $(BIN)/pip install -e '.[dev,eval,view,ray]'
	touch $(BIN)/spasm

setup: $(BIN)/spasm

run: setup
	$(BIN)/spasm generate

lint: setup
	$(BIN)/ruff check spasm tests benchmarks
	$(BIN)/mypy spasm
	$(BIN)/lint-imports

# The whole suite on every core (pytest-xdist); a test module stays on one worker, so the
# fixtures it builds once (an evaluated run, a generated run) are built once.
test: lint
	$(BIN)/pytest -q -n auto --dist loadfile

# The quick loop runs on every core (pytest-xdist), keeps the compiled test modules (pytest's
# assertion rewriting is most of collecting, and PYTHONDONTWRITEBYTECODE would redo it every
# time) and puts the tests' files on tmpfs where the machine has one: a run's durable writes
# (fsync) cost nothing there. make test keeps the environment and the disk.
FAST_TMP := $(if $(wildcard /dev/shm/.),TMPDIR=/dev/shm,)

fast: setup
	PYTHONDONTWRITEBYTECODE= $(FAST_TMP) $(BIN)/pytest -q -m "not e2e" -n auto
