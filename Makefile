# hands-on: run `make` (or `make help`) for the list of targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash
SYSTEMS := flashinfer mini-sglang sglang
MINISGL_COMMIT := 20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66
# GPU stack: a venv of its own (make setup); PYTHON=python3 SKIP_SETUP=1 uses an existing environment
VENV ?= .venv
PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
TEST_VENV ?= .venv-test
PYTEST_ARGS ?=

.PHONY: help setup test test-gpu check quick all reports clean

# make quick / make all run on a GPU: where nvidia-smi is missing or lists no GPU they stop here, in one line and
# exit 2, before anything is installed (make test, check and reports need no GPU and skip this)
GPU_GOALS := $(filter quick all,$(MAKECMDGOALS))
ifneq ($(GPU_GOALS),)
SMI_SAYS := $(shell timeout 60 nvidia-smi -L 2>&1 | head -n 1)
ifeq ($(findstring GPU ,$(SMI_SAYS)),)
$(error [setup] make $(GPU_GOALS) needs an NVIDIA GPU: $(if $(shell command -v nvidia-smi),nvidia-smi -L found none here ($(or $(SMI_SAYS),no output)),there is no nvidia-smi on PATH here); nothing was installed or run (without a GPU: make test, make check, make reports))
endif
endif

help: ## list the targets
	@echo "hands-on — learn SGLang, mini-SGLang and FlashInfer by running them on your GPU"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: $(VENV)/.done ## install the GPU stack into .venv (torch 2.11/CUDA 13, SGLang, FlashInfer, mini-SGLang)
$(VENV)/.done: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -r requirements.txt
	# mini-SGLang from its tested commit, without its own pins (torch<2.10, transformers<=4.57.3): see README
	$(VENV)/bin/pip install --no-deps "minisgl @ git+https://github.com/sgl-project/mini-sglang@$(MINISGL_COMMIT)"
	$(VENV)/bin/python -c "import torch, flashinfer, sglang, minisgl; print('GPU stack ok:', torch.__version__, flashinfer.__version__, sglang.__version__)"
	touch $@

$(TEST_VENV)/.done: tests/requirements.txt
	python3 -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/pip install -q --upgrade pip
	$(TEST_VENV)/bin/pip install -q -r tests/requirements.txt
	touch $@

test: $(TEST_VENV)/.done ## CPU tests on real fixtures (installs what they need into .venv-test)
	@$(TEST_VENV)/bin/python -m pytest tests -m "not gpu" -q $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

test-gpu: ## GPU tests (timing primitive vs ncu, measured peaks) and tests of the real stack: run on the GPU machine
	@$(PYTHON) -m pytest tests -m "gpu or stack" -q -s $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no GPU tests collected"; exit 1; fi; exit $$rc

check: ## --help of every numbered script and shell wrapper works on this (CPU-only) machine
	@fail=0; for s in $(foreach s,$(SYSTEMS),$(wildcard $(s)/scripts/[0-9][0-9]_*.py)); do \
	  if python3 $$s --help >/dev/null 2>/tmp/hands-on-check.err; then echo "ok   $$s --help"; \
	  else echo "FAIL $$s --help"; sed 's/^/     /' /tmp/hands-on-check.err | tail -3; fail=1; fi; done; \
	for s in $(foreach s,$(SYSTEMS),$(wildcard $(s)/scripts/*.sh)); do \
	  if bash -n $$s && bash $$s --help >/dev/null 2>&1; then echo "ok   $$s --help"; \
	  else echo "FAIL $$s --help"; fail=1; fi; done; exit $$fail

# every system's pipeline in mode $(1), in order (common/run/pipelines.py: one with held servers is launched at the
# start and waits for its turn); `make reports` only when all three ended ok; Ctrl-C stops the run
define pipelines
	@PYTHON=$(PYTHON) $(PYTHON) -m common pipelines $(1) $(SYSTEMS); rc=$$?; if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	$(MAKE) --no-print-directory reports PYTHON=$(PYTHON)
endef

quick: $(if $(SKIP_SETUP),,setup) ## GPU box: every system's 06_full_pipeline.sh --quick, then reports (if all ok)
	$(call pipelines,--quick)

all: $(if $(SKIP_SETUP),,setup) ## GPU box: every system's full pipeline (--all), then reports (if all ok; hours)
	$(call pipelines,--all)

# common/run/reports.sh: a Ctrl-C is one [interrupted] line and exit 130, nothing from make or Python's start-up.
# With /bin/sh and no shell syntax in the line, make starts it directly (no shell in between that a Ctrl-C could
# kill before it is ready: make would then say "*** [reports] Interrupt")
reports: SHELL := /bin/sh
reports: export ACCEPT_MIXED := $(ACCEPT_MIXED)
reports: ## refresh the auto blocks of */reports/*.md from */results/ (ACCEPT_MIXED=1: also runs of another machine)
	@bash common/run/reports.sh $(PYTHON)

clean: ## remove raw results (not the committed reports) and the test venv
	for s in $(SYSTEMS); do find $$s/results -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +; done
	rm -rf $(TEST_VENV) .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
